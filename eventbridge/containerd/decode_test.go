package containerd

import (
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/typeurl/v2"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pleg-nri/pleg-nri/pleg"
)

func mustAny(t testing.TB, v any) typeurl.Any {
	t.Helper()
	a, err := typeurl.MarshalAny(v)
	if err != nil {
		t.Fatalf("MarshalAny(%T): %v", v, err)
	}
	return a
}

func TestDecodeEnvelope(t *testing.T) {
	ts := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	exitedAt := ts.Add(-time.Millisecond)

	for _, tc := range []struct {
		name    string
		env     *events.Envelope
		want    pleg.Observation
		ok      bool
		wantErr bool
		verdict verdict
	}{
		{
			name: "exit of init process",
			env: &events.Envelope{Timestamp: ts, Namespace: "k8s.io", Topic: TopicTaskExit, Event: mustAny(t, &apievents.TaskExit{
				ContainerID: "c1", ID: "c1", Pid: 42, ExitStatus: 137, ExitedAt: timestamppb.New(exitedAt),
			})},
			want: pleg.Observation{
				Source: pleg.SourceTaskEvent, Kind: pleg.KindUnknown, ID: "c1", Phase: pleg.PhaseExited,
				ExitCode: 137, HasExitCode: true, FinishedAt: exitedAt, SourceTime: ts,
			},
			ok: true, verdict: verdictObserved,
		},
		{
			name: "exit of init process with exit code 0 and no id",
			env: &events.Envelope{Timestamp: ts, Topic: TopicTaskExit, Event: mustAny(t, &apievents.TaskExit{
				ContainerID: "c1", ExitedAt: timestamppb.New(exitedAt),
			})},
			want: pleg.Observation{
				Source: pleg.SourceTaskEvent, ID: "c1", Phase: pleg.PhaseExited,
				ExitCode: 0, HasExitCode: true, FinishedAt: exitedAt, SourceTime: ts,
			},
			ok: true, verdict: verdictObserved,
		},
		{
			name: "exit without time",
			env: &events.Envelope{Timestamp: ts, Topic: TopicTaskExit, Event: mustAny(t, &apievents.TaskExit{
				ContainerID: "c1", ID: "c1", ExitStatus: 1,
			})},
			want: pleg.Observation{
				Source: pleg.SourceTaskEvent, ID: "c1", Phase: pleg.PhaseExited,
				ExitCode: 1, HasExitCode: true, SourceTime: ts,
			},
			ok: true, verdict: verdictObserved,
		},
		{
			name: "exit of exec process is ignored",
			env: &events.Envelope{Timestamp: ts, Topic: TopicTaskExit, Event: mustAny(t, &apievents.TaskExit{
				ContainerID: "c1", ID: "exec-123", Pid: 77, ExitStatus: 0, ExitedAt: timestamppb.New(exitedAt),
			})},
			verdict: verdictExecExit,
		},
		{
			name: "oom",
			env:  &events.Envelope{Timestamp: ts, Topic: TopicTaskOOM, Event: mustAny(t, &apievents.TaskOOM{ContainerID: "c2"})},
			want: pleg.Observation{
				Source: pleg.SourceTaskEvent, ID: "c2", Phase: pleg.PhaseNone, OOMKilled: true, SourceTime: ts,
			},
			ok: true, verdict: verdictObserved,
		},
		{
			name: "start",
			env:  &events.Envelope{Timestamp: ts, Topic: TopicTaskStart, Event: mustAny(t, &apievents.TaskStart{ContainerID: "c3", Pid: 9})},
			want: pleg.Observation{
				Source: pleg.SourceTaskEvent, ID: "c3", Phase: pleg.PhaseRunning, StartedAt: ts, SourceTime: ts,
			},
			ok: true, verdict: verdictObserved,
		},
		{
			name:    "unknown topic",
			env:     &events.Envelope{Timestamp: ts, Topic: "/tasks/delete", Event: mustAny(t, &apievents.TaskDelete{ContainerID: "c1"})},
			verdict: verdictIgnoredTopic,
		},
		{
			name:    "unknown topic without payload",
			env:     &events.Envelope{Timestamp: ts, Topic: "/containers/create"},
			verdict: verdictIgnoredTopic,
		},
		{
			name:    "garbage payload",
			env:     &events.Envelope{Timestamp: ts, Topic: TopicTaskExit, Event: &anypb.Any{TypeUrl: "containerd.events.TaskExit", Value: []byte{0xff, 0xff, 0xff}}},
			wantErr: true, verdict: verdictError,
		},
		{
			name:    "payload of the wrong type",
			env:     &events.Envelope{Timestamp: ts, Topic: TopicTaskExit, Event: mustAny(t, &apievents.TaskOOM{ContainerID: "c1"})},
			wantErr: true, verdict: verdictError,
		},
		{
			name:    "unregistered type url",
			env:     &events.Envelope{Timestamp: ts, Topic: TopicTaskOOM, Event: &anypb.Any{TypeUrl: "example.com/Nope", Value: nil}},
			wantErr: true, verdict: verdictError,
		},
		{
			name:    "no payload",
			env:     &events.Envelope{Timestamp: ts, Topic: TopicTaskStart},
			wantErr: true, verdict: verdictError,
		},
		{
			name:    "no container id",
			env:     &events.Envelope{Timestamp: ts, Topic: TopicTaskOOM, Event: mustAny(t, &apievents.TaskOOM{})},
			wantErr: true, verdict: verdictError,
		},
		{
			name:    "nil envelope",
			env:     nil,
			wantErr: true, verdict: verdictError,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := DecodeEnvelope(tc.env)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error = %v, want error: %v", err, tc.wantErr)
			}
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("observation (-want +got):\n%s", diff)
			}
			if _, v, _ := decodeEnvelope(tc.env); v != tc.verdict {
				t.Errorf("verdict = %d, want %d", v, tc.verdict)
			}
		})
	}
}

func FuzzDecodeEnvelope(f *testing.F) {
	seed := func(topic string, v any) {
		a := mustAny(f, v)
		f.Add(topic, a.GetTypeUrl(), a.GetValue(), true)
	}
	seed(TopicTaskExit, &apievents.TaskExit{ContainerID: "c", ID: "c", ExitStatus: 1, ExitedAt: timestamppb.Now()})
	seed(TopicTaskExit, &apievents.TaskExit{ContainerID: "c", ID: "e"})
	seed(TopicTaskOOM, &apievents.TaskOOM{ContainerID: "c"})
	seed(TopicTaskStart, &apievents.TaskStart{ContainerID: "c", Pid: 1})
	seed("/tasks/delete", &apievents.TaskDelete{ContainerID: "c"})
	f.Add(TopicTaskExit, "containerd.events.TaskExit", []byte{0x0a, 0xff}, true)
	f.Add(TopicTaskOOM, "", []byte(nil), false)

	f.Fuzz(func(t *testing.T, topic, typeURL string, value []byte, hasEvent bool) {
		env := &events.Envelope{Timestamp: time.Unix(1, 2), Namespace: "k8s.io", Topic: topic}
		if hasEvent {
			env.Event = &anypb.Any{TypeUrl: typeURL, Value: value}
		}
		obs, ok, err := DecodeEnvelope(env)
		if ok && err != nil {
			t.Fatalf("ok with error %v", err)
		}
		if ok {
			if obs.ID == "" {
				t.Fatalf("observation without id: %+v", obs)
			}
			if obs.Source != pleg.SourceTaskEvent || obs.Kind != pleg.KindUnknown {
				t.Fatalf("bad source or kind: %+v", obs)
			}
		} else if obs != (pleg.Observation{}) {
			t.Fatalf("not ok but observation %+v", obs)
		}
	})
}

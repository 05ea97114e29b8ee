package pleg

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// podEvent is an event of pod uid about container id.
func podEvent(uid, id string) Event {
	return Event{Response: &runtimeapi.ContainerEventResponse{
		ContainerId:      id,
		PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: "sb-" + uid, Metadata: &runtimeapi.PodSandboxMetadata{Uid: uid}},
	}}
}

func ids(evs []Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Response.ContainerId)
	}
	return out
}

func TestFanoutEverySubscriberGetsEverything(t *testing.T) {
	f := newFanout(8, NopMetrics{})
	a, b := f.subscribe(), f.subscribe()
	for i := range 5 {
		f.publish(context.Background(), podEvent("p", fmt.Sprint(i)))
	}
	want := []string{"0", "1", "2", "3", "4"}
	if d := cmp.Diff(want, ids(pending(a))); d != "" {
		t.Errorf("a (-want +got):\n%s", d)
	}
	if d := cmp.Diff(want, ids(pending(b))); d != "" {
		t.Errorf("b (-want +got):\n%s", d)
	}
	c := f.subscribe() // from now on only
	f.publish(context.Background(), podEvent("p", "5"))
	if d := cmp.Diff([]string{"5"}, ids(pending(c))); d != "" {
		t.Errorf("c (-want +got):\n%s", d)
	}
}

// TestFanoutCoalesce: a full queue drops the events that a newer event of their pod supersedes, keeps
// the rest in order, and goes on queueing; also when its oldest event is not at the start of its ring.
func TestFanoutCoalesce(t *testing.T) {
	for _, tc := range []struct {
		name      string
		read      int // events of another pod published and read first: where the ring's oldest event is
		publish   [][2]string
		want      []string
		coalesced int
	}{
		// Full at a3: a1, a2 (older than a3) and b1 (older than b2) go.
		{"ring from its start", 0, [][2]string{{"a", "a1"}, {"a", "a2"}, {"b", "b1"}, {"b", "b2"}, {"a", "a3"}, {"c", "c1"}},
			[]string{"b2", "a3", "c1"}, 3},
		// a1 in the ring's fourth place, b1, a2, c1 wrapped to its start. Full at b2: a1 (older than a2)
		// and b1 (older than b2) go; d1 fits.
		{"ring wrapped", 3, [][2]string{{"a", "a1"}, {"b", "b1"}, {"a", "a2"}, {"c", "c1"}, {"b", "b2"}, {"d", "d1"}},
			[]string{"a2", "c1", "b2", "d1"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newCountingMetrics()
			f := newFanout(4, m)
			s := f.subscribe()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for i := range tc.read {
				f.publish(ctx, podEvent("x", fmt.Sprint("x", i)))
				if _, err := s.Next(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for _, e := range tc.publish {
				f.publish(ctx, podEvent(e[0], e[1]))
			}
			if d := cmp.Diff(tc.want, ids(pending(s))); d != "" {
				t.Errorf("queue (-want +got):\n%s", d)
			}
			if m.coalesced != tc.coalesced || m.evicted != 0 {
				t.Errorf("coalesced %d evicted %d", m.coalesced, m.evicted)
			}
		})
	}
}

func TestFanoutEvict(t *testing.T) {
	m := newCountingMetrics()
	f := newFanout(2, m)
	stuck, ok := f.subscribe(), f.subscribe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 100 {
			f.publish(context.Background(), podEvent(fmt.Sprint("pod", i), fmt.Sprint(i)))
			if i%2 == 1 {
				pending(ok) // the other subscriber keeps up
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("publish blocked")
	}
	_, err := stuck.Next(context.Background())
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("stuck subscriber: err %v", err)
	}
	if m.evicted != 1 || f.count() != 1 {
		t.Errorf("evicted %d, subscribers %d", m.evicted, f.count())
	}
	stuck.Close() // after eviction: harmless
	if _, err := stuck.Next(context.Background()); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("after close: %v", err)
	}
}

func TestSubscriptionClose(t *testing.T) {
	f := newFanout(2, NopMetrics{})
	s := f.subscribe()
	// Close wakes a Next that waits: Close only once Next is about to wait.
	waiting := make(chan struct{})
	var once sync.Once
	s.waitHook = func() { once.Do(func() { close(waiting) }) }
	errc := make(chan error)
	go func() {
		_, err := s.Next(context.Background())
		errc <- err
	}()
	<-waiting
	s.Close()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Errorf("Next after Close: %v", err)
	}
	if f.count() != 0 {
		t.Errorf("subscribers: %d", f.count())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	s2 := f.subscribe()
	if _, err := s2.Next(ctx); err != context.DeadlineExceeded {
		t.Errorf("Next on an empty queue: %v", err)
	}
	s2.Close()
}

// TestRun drives a PLEG through Run with the real clock: events flow, a relist is triggered, and Run
// returns nil and leaves no goroutine (goleak in TestMain).
func TestRun(t *testing.T) {
	cri := newFakeCRI()
	p, err := New(Config{Status: cri, Lister: cri, RelistPeriod: time.Hour, VerifyDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sub := p.Subscribe()
	defer sub.Close()
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- p.Run(ctx) }()

	next := func() Event {
		t.Helper()
		nctx, ncancel := context.WithTimeout(ctx, 10*time.Second)
		defer ncancel()
		ev, err := sub.Next(nctx)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		return ev
	}
	expect := func(want ...string) {
		t.Helper()
		var got []Event
		for range want {
			got = append(got, next())
		}
		if d := cmp.Diff(want, summary(got)); d != "" {
			t.Fatalf("events (-want +got):\n%s", d)
		}
	}

	now := time.Now()
	p.Observe(nriSandbox("s1", PhaseRunning, now)) // before the sandbox is in the CRI: retried
	testutil.Eventually(t, 10*time.Second, "a status call of s1 before it is in the CRI", func() bool { return cri.callsOf("s1") > 0 })
	cri.runSandbox("s1", now)
	expect("CREATED s1", "STARTED s1")
	if n := cri.callsOf("s1"); n < 2 {
		t.Errorf("%d status calls of s1, want the NotFound and its retry", n)
	}
	cri.createContainer("c1", "s1", time.Now())
	p.Observe(nriContainer("c1", "s1", PhaseCreated, time.Now()))
	expect("CREATED c1")
	started := time.Now()
	cri.startContainer("c1", started)
	running := nriContainer("c1", "s1", PhaseRunning, time.Now())
	running.StartedAt = started // NRI PostStartContainer carries containerd's StartedAt (2.3+)
	p.Observe(running)
	expect("STARTED c1")

	fin := time.Now()
	cri.exitContainer("c1", 0, fin)
	p.Observe(taskExit("c1", 0, fin))
	ev := next()
	if ev.Response.ContainerEventType != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT || ev.Source != SourceTaskEvent || !ev.SourceTime.Equal(fin) {
		t.Fatalf("event %v from %s at %v", summary([]Event{ev}), ev.Source, ev.SourceTime)
	}
	if d := diffProto(cri.container("c1"), statusOf(ev, "c1")); d != "" {
		t.Errorf("STOPPED status (-cri +event):\n%s", d)
	}

	// Missed by every input: the triggered relist repairs it.
	cri.removeContainer("c1")
	p.TriggerRelist()
	expect("DELETED c1")

	cancel()
	select {
	case err := <-runErr:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}

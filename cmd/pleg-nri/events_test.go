package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"
)

// testEvent is a STOPPED event of container c1 (app, OOM-killed) in pod default/web (sandbox s1).
func testEvent() *runtimeapi.ContainerEventResponse {
	return &runtimeapi.ContainerEventResponse{
		ContainerId:        "c1",
		ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		CreatedAt:          time.Unix(100, 0).UnixNano(),
		PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: "s1abcdef", State: runtimeapi.PodSandboxState_SANDBOX_READY,
			Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: "u1"}},
		ContainersStatuses: []*runtimeapi.ContainerStatus{{Id: "c1", Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
			State: runtimeapi.ContainerState_CONTAINER_EXITED, ExitCode: 137, Reason: "OOMKilled",
			Labels: map[string]string{"io.kubernetes.container.name": "app"}}},
	}
}

func noEnv(string) string { return "" }

func TestEventsEndpoint(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "CONTAINER_RUNTIME_ENDPOINT" {
				return v
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name string
		args []string
		env  func(string) string
		want string
	}{
		{"default", nil, noEnv, "unix:///run/pleg-nri/cri.sock"},
		{"environment", nil, env("unix:///run/containerd/containerd.sock"), "unix:///run/containerd/containerd.sock"},
		{"flag over environment", []string{"--runtime-endpoint", "/a.sock"}, env("/b.sock"), "/a.sock"},
		{"-r", []string{"-r", "tcp://127.0.0.1:1"}, noEnv, "tcp://127.0.0.1:1"},
		{"--endpoint", []string{"--endpoint=/c.sock"}, env("/b.sock"), "/c.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseEventsFlags(tc.args, tc.env, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if o.endpoint != tc.want {
				t.Errorf("endpoint = %q, want %q", o.endpoint, tc.want)
			}
		})
	}
}

func TestEventsFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "xml"}, "want table, json, yaml or go-template"},
		{[]string{"-o", "go-template"}, "needs --template"},
		{[]string{"-o", "go-template", "--template", "{{.x"}, "--template:"},
		{[]string{"-o", "json", "--template", "{{.x}}"}, "can't be used with --output json"},
		{[]string{"--type", "exited"}, "--type: want created, started, stopped or deleted"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		_, err := parseEventsFlags(tc.args, noEnv, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

func TestEventFilter(t *testing.T) {
	ev := testEvent()
	noPod := testEvent()
	noPod.PodSandboxStatus = nil
	for _, tc := range []struct {
		args []string
		ev   *runtimeapi.ContainerEventResponse
		want bool
	}{
		{nil, ev, true},
		{nil, noPod, true},
		{[]string{"--pod", "web"}, ev, true},
		{[]string{"--pod", "u1"}, ev, true},
		{[]string{"--pod", "s1ab"}, ev, true},
		{[]string{"--pod", "other,web"}, ev, true},
		{[]string{"--pod", "other", "--pod", "web"}, ev, true},
		{[]string{"--pod", "we"}, ev, false},
		{[]string{"--pod", "web"}, noPod, false},
		{[]string{"--namespace", "default"}, ev, true},
		{[]string{"--namespace", "kube-system"}, ev, false},
		{[]string{"--namespace", "default", "--pod", "db"}, ev, false},
		{[]string{"--type", "stopped"}, ev, true},
		{[]string{"--type", "STARTED,deleted"}, ev, false},
		{[]string{"--type", "CONTAINER_STOPPED_EVENT"}, ev, true},
		{[]string{"--type", "stopped"}, noPod, true},
		{[]string{"--type", "stopped", "--namespace", "default", "--pod", "web"}, ev, true},
	} {
		o, err := parseEventsFlags(tc.args, noEnv, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := o.filter.match(tc.ev); got != tc.want {
			t.Errorf("%v on an event with pod status %v: match = %v, want %v", tc.args, tc.ev.PodSandboxStatus != nil, got, tc.want)
		}
	}
}

// printed returns what the printer of args writes for evs.
func printed(t *testing.T, args []string, evs ...*runtimeapi.ContainerEventResponse) string {
	t.Helper()
	o, err := parseEventsFlags(args, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	p, err := newEventPrinter(&out, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if err := p.print(ev, time.Unix(100, 3e6)); err != nil {
			t.Fatal(err)
		}
	}
	return out.String()
}

func TestEventsJSON(t *testing.T) {
	ev := testEvent()
	out := printed(t, []string{"-o", "json"}, ev, ev)
	// Two objects, each the event in protojson with every field (crictl's format).
	jd := json.NewDecoder(strings.NewReader(out))
	for i := 0; i < 2; i++ {
		var raw map[string]any
		if err := jd.Decode(&raw); err != nil {
			t.Fatalf("object %d: %v\n%s", i, err, out)
		}
		for _, key := range []string{"containerId", "containerEventType", "createdAt", "podSandboxStatus", "containersStatuses"} {
			if _, ok := raw[key]; !ok {
				t.Errorf("object %d has no %q: %v", i, key, raw)
			}
		}
		if raw["containerEventType"] != "CONTAINER_STOPPED_EVENT" {
			t.Errorf("containerEventType = %v", raw["containerEventType"])
		}
		// Every field, the defaults too (as crictl: EmitDefaultValues).
		cs := raw["containersStatuses"].([]any)[0].(map[string]any)
		if _, ok := cs["startedAt"]; !ok {
			t.Errorf("a zero field is left out: %v", cs)
		}
		js, _ := json.Marshal(raw)
		var got runtimeapi.ContainerEventResponse
		if err := protojson.Unmarshal(js, &got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&got, ev) {
			t.Errorf("object %d decodes to %v, want %v", i, &got, ev)
		}
	}
}

func TestEventsYAML(t *testing.T) {
	ev := testEvent()
	out := printed(t, []string{"-o", "yaml"}, ev, ev)
	docs := strings.Split(out, "---\n")
	if len(docs) != 3 || docs[0] != "" {
		t.Fatalf("want two YAML documents each after ---, got:\n%s", out)
	}
	for _, doc := range docs[1:] {
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		var got runtimeapi.ContainerEventResponse
		if err := protojson.Unmarshal(js, &got); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if !proto.Equal(&got, ev) {
			t.Errorf("document decodes to %v, want %v", &got, ev)
		}
	}
	if !strings.Contains(out, "containerEventType: CONTAINER_STOPPED_EVENT") {
		t.Errorf("yaml:\n%s", out)
	}
}

func TestEventsGoTemplate(t *testing.T) {
	ev := testEvent()
	tmpl := `{{.containerId}} {{.containerEventType | lower}} {{.podSandboxStatus.metadata.namespace}}/{{.podSandboxStatus.metadata.name}}` +
		`{{range .containersStatuses}} {{.metadata.name}}={{.exitCode}} {{.reason | upper}} {{json .labels}}{{end}}`
	got := printed(t, []string{"-o", "go-template", "--template", tmpl}, ev)
	want := "c1 container_stopped_event default/web app=137 OOMKILLED {\"io.kubernetes.container.name\":\"app\"}\n\n"
	if got != want {
		t.Errorf("go-template printed %q, want %q", got, want)
	}
	// A missing key is an error, as in crictl.
	o, err := parseEventsFlags([]string{"-o", "go-template", "--template", "{{.nosuchkey}}"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := newEventPrinter(io.Discard, o)
	if err := p.print(ev, time.Now()); err == nil || !strings.Contains(err.Error(), "nosuchkey") {
		t.Errorf("missing key: error %v", err)
	}
}

func TestEventsTable(t *testing.T) {
	ev := testEvent()
	sandbox := testEvent()
	sandbox.ContainerId = "s1abcdef"
	sandbox.ContainerEventType = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
	lines := strings.Split(strings.TrimSpace(printed(t, nil, ev, sandbox)), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and two rows, got %q", lines)
	}
	for i, want := range [][]string{
		{"TIME", "TYPE", "POD", "CONTAINER", "ID", "STATE", "EXIT", "REASON", "LATENCY"},
		{"STOPPED", "default/web", "app", "c1", "EXITED", "137", "OOMKilled", "3.00ms"},
		{"STARTED", "default/web", "(sandbox)", "s1abcdef", "READY", "3.00ms"},
	} {
		fields := strings.Fields(lines[i])
		if i > 0 {
			fields = fields[1:] // the local time of day
		}
		if diff := cmp.Diff(want, fields); diff != "" {
			t.Errorf("line %d (-want +got):\n%s", i, diff)
		}
	}
	// The filter applies to every format.
	if out := printed(t, []string{"--type", "started", "-o", "json"}, ev); out != "" {
		t.Errorf("a filtered-out event was printed: %s", out)
	}
}

// eventsServer is a CRI server whose GetContainerEvents sends evs, then ends the stream.
type eventsServer struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	evs []*runtimeapi.ContainerEventResponse
}

func (s *eventsServer) GetContainerEvents(_ *runtimeapi.GetEventsRequest, stream runtimeapi.RuntimeService_GetContainerEventsServer) error {
	for _, ev := range s.evs {
		if err := stream.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

// TestRunEvents runs the command against a CRI server found through CONTAINER_RUNTIME_ENDPOINT.
func TestRunEvents(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	started := testEvent()
	started.ContainerEventType = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
	other := testEvent()
	other.PodSandboxStatus.Metadata.Namespace = "kube-system"
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, &eventsServer{evs: []*runtimeapi.ContainerEventResponse{started, other, testEvent()}})
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	getenv := func(k string) string {
		if k == "CONTAINER_RUNTIME_ENDPOINT" {
			return "unix://" + sock
		}
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	err = runEvents(ctx, []string{"-o", "go-template", "--template", "{{.containerEventType}} {{.podSandboxStatus.metadata.namespace}}", "--namespace", "default"},
		getenv, &out, io.Discard)
	// The server ends the stream after its events: the command ends, successfully (as crictl events).
	if err != nil {
		t.Errorf("error %v at the stream's end, want none", err)
	}
	if got, want := out.String(), "CONTAINER_STARTED_EVENT default\nCONTAINER_STOPPED_EVENT default\n"; got != want {
		t.Errorf("printed %q, want %q", got, want)
	}
}

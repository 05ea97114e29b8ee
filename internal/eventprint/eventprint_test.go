package eventprint

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"text/template"
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

func TestEventFilter(t *testing.T) {
	ev := testEvent()
	noPod := testEvent()
	noPod.PodSandboxStatus = nil
	stopped, started, deleted := runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT,
		runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT
	for _, tc := range []struct {
		f    Filter
		ev   *runtimeapi.ContainerEventResponse
		want bool
	}{
		{Filter{}, ev, true},
		{Filter{}, noPod, true},
		{Filter{Pods: []string{"web"}}, ev, true},
		{Filter{Pods: []string{"u1"}}, ev, true},
		{Filter{Pods: []string{"s1ab"}}, ev, true},
		{Filter{Pods: []string{"other", "web"}}, ev, true},
		{Filter{Pods: []string{"other", "web"}}, ev, true},
		{Filter{Pods: []string{"we"}}, ev, false},
		{Filter{Pods: []string{"web"}}, noPod, false},
		{Filter{Namespaces: []string{"default"}}, ev, true},
		{Filter{Namespaces: []string{"kube-system"}}, ev, false},
		{Filter{Namespaces: []string{"default"}, Pods: []string{"db"}}, ev, false},
		{Filter{Types: []runtimeapi.ContainerEventType{stopped}}, ev, true},
		{Filter{Types: []runtimeapi.ContainerEventType{started, deleted}}, ev, false},
		{Filter{Types: []runtimeapi.ContainerEventType{stopped}}, ev, true},
		{Filter{Types: []runtimeapi.ContainerEventType{stopped}}, noPod, true},
		{Filter{Types: []runtimeapi.ContainerEventType{stopped}, Namespaces: []string{"default"}, Pods: []string{"web"}}, ev, true},
	} {
		if got := tc.f.Match(tc.ev); got != tc.want {
			t.Errorf("%+v on an event with pod status %v: Match = %v, want %v", tc.f, tc.ev.PodSandboxStatus != nil, got, tc.want)
		}
	}
}

// printed returns what a printer with o writes for evs.
func printed(t *testing.T, o Options, evs ...*runtimeapi.ContainerEventResponse) string {
	t.Helper()
	var out bytes.Buffer
	p, err := NewPrinter(&out, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if err := p.Print(ev, time.Unix(100, 3e6)); err != nil {
			t.Fatal(err)
		}
	}
	return out.String()
}

func TestEventsJSON(t *testing.T) {
	ev := testEvent()
	out := printed(t, Options{Output: "json"}, ev, ev)
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
	out := printed(t, Options{Output: "yaml"}, ev, ev)
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
	got := printed(t, Options{Output: "go-template", Template: mustParse(t, tmpl)}, ev)
	want := "c1 container_stopped_event default/web app=137 OOMKILLED {\"io.kubernetes.container.name\":\"app\"}\n\n"
	if got != want {
		t.Errorf("go-template printed %q, want %q", got, want)
	}
	// A missing key is an error, as in crictl.
	p, _ := NewPrinter(io.Discard, Options{Output: "go-template", Template: mustParse(t, "{{.nosuchkey}}")})
	if err := p.Print(ev, time.Now()); err == nil || !strings.Contains(err.Error(), "nosuchkey") {
		t.Errorf("missing key: error %v", err)
	}
}

func TestEventsTable(t *testing.T) {
	ev := testEvent()
	sandbox := testEvent()
	sandbox.ContainerId = "s1abcdef"
	sandbox.ContainerEventType = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
	lines := strings.Split(strings.TrimSpace(printed(t, Options{Output: "table"}, ev, sandbox)), "\n")
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
	if out := printed(t, Options{Output: "json", Filter: Filter{Types: []runtimeapi.ContainerEventType{runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT}}}, ev); out != "" {
		t.Errorf("a filtered-out event was printed: %s", out)
	}
}

func mustParse(t *testing.T, text string) *template.Template {
	t.Helper()
	tmpl, err := ParseTemplate(text)
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

func TestParseEventType(t *testing.T) {
	for in, want := range map[string]runtimeapi.ContainerEventType{"created": runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT,
		" Stopped ": runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, "CONTAINER_DELETED_EVENT": runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT} {
		if got, err := ParseEventType(in); err != nil || got != want {
			t.Errorf("ParseEventType(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseEventType("exited"); err == nil {
		t.Error("ParseEventType(exited): no error")
	}
}

func TestToLine(t *testing.T) {
	created := time.Unix(100, 0)
	ev := &runtimeapi.ContainerEventResponse{
		ContainerId:        "c1",
		ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		CreatedAt:          created.UnixNano(),
		PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: "s1", State: runtimeapi.PodSandboxState_SANDBOX_READY,
			Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: "u1"}},
		ContainersStatuses: []*runtimeapi.ContainerStatus{{Id: "c1", Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
			State: runtimeapi.ContainerState_CONTAINER_EXITED, ExitCode: 137, Reason: "OOMKilled"}},
	}
	l := ToLine(ev, created.Add(3*time.Millisecond))
	code := int32(137)
	want := Line{Time: created, Type: "STOPPED", Pod: "default/web", PodUID: "u1", Container: "app", ID: "c1",
		State: "EXITED", ExitCode: &code, Reason: "OOMKilled", Containers: 1, LatencyMS: 3}
	if diff := cmp.Diff(want, l); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	ev.ContainerId = "s1"
	ev.ContainerEventType = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
	if l := ToLine(ev, created); l.Container != "(sandbox)" || l.State != "READY" || l.ExitCode != nil {
		t.Errorf("sandbox event line = %+v", l)
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

// TestStream prints a CRI server's stream, filtered, until the server ends it: the end is no error (as
// crictl events).
func TestStream(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	err = Stream(ctx, Options{Endpoint: "unix://" + sock, Output: "go-template",
		Template: mustParse(t, "{{.containerEventType}} {{.podSandboxStatus.metadata.namespace}}"), Filter: Filter{Namespaces: []string{"default"}}}, &out)
	if err != nil {
		t.Errorf("error %v at the stream's end, want none", err)
	}
	if got, want := out.String(), "CONTAINER_STARTED_EVENT default\nCONTAINER_STOPPED_EVENT default\n"; got != want {
		t.Errorf("printed %q, want %q", got, want)
	}
}

// TestStreamErrors: an endpoint that is not one, and one where nothing serves, are errors naming it.
func TestStreamErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, endpoint := range []string{"relative.sock", "unix://" + filepath.Join(t.TempDir(), "none.sock")} {
		if err := Stream(ctx, Options{Endpoint: endpoint, Output: "json"}, io.Discard); err == nil {
			t.Errorf("Stream on %s: no error", endpoint)
		}
	}
}

// TestSetOutput: each format and its template as `pleg-nri events` takes them, the errors naming the
// flag at fault.
func TestSetOutput(t *testing.T) {
	for _, tc := range []struct {
		output, templ string
		want          string // the format set, or the error's text
		template      bool
	}{
		{"table", "", "table", false},
		{"text", "", "table", false},
		{"json", "", "json", false},
		{"yaml", "", "yaml", false},
		{"go-template", "{{.containerId}}", "go-template", true},
		{"xml", "", `--output: want table, json, yaml or go-template, got "xml"`, false},
		{"go-template", "", "--output go-template needs --template", false},
		{"go-template", "{{.x", "--template: ", false},
		{"json", "{{.x}}", "--template can't be used with --output json", false},
		{"text", "{{.x}}", "--template can't be used with --output table", false},
	} {
		var o Options
		err := o.SetOutput(tc.output, tc.templ)
		switch {
		case err != nil && !strings.HasPrefix(err.Error(), tc.want):
			t.Errorf("SetOutput(%q, %q): %v, want %q", tc.output, tc.templ, err, tc.want)
		case err == nil && (o.Output != tc.want || (o.Template != nil) != tc.template):
			t.Errorf("SetOutput(%q, %q): output %q template %v, want %q template %v", tc.output, tc.templ, o.Output, o.Template != nil, tc.want, tc.template)
		}
	}
}

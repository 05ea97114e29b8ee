package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"text/template"
	"time"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/internal/dial"
)

// runtimeEndpointEnv is the environment variable crictl reads its --runtime-endpoint from.
const runtimeEndpointEnv = "CONTAINER_RUNTIME_ENDPOINT"

// eventsOptions are the flags of `pleg-nri events`.
type eventsOptions struct {
	// endpoint is the CRI endpoint whose stream is printed.
	endpoint string
	// output is table, json, yaml or go-template; tmpl is the parsed --template of go-template.
	output string
	tmpl   *template.Template
	// filter selects the events printed.
	filter eventFilter
}

// eventFilter selects events. Within one field any value matches; across fields all must match; an
// empty field matches every event.
type eventFilter struct {
	// pods are pod names, pod UIDs or sandbox id prefixes.
	pods []string
	// namespaces are pod namespaces.
	namespaces []string
	// types are event types.
	types []runtimeapi.ContainerEventType
}

// match says whether ev passes the filter.
func (f eventFilter) match(ev *runtimeapi.ContainerEventResponse) bool {
	if len(f.types) > 0 && !contains(f.types, ev.ContainerEventType) {
		return false
	}
	if len(f.pods) == 0 && len(f.namespaces) == 0 {
		return true
	}
	ps := ev.GetPodSandboxStatus()
	if ps == nil {
		return false
	}
	if len(f.namespaces) > 0 && !contains(f.namespaces, ps.GetMetadata().GetNamespace()) {
		return false
	}
	if len(f.pods) == 0 {
		return true
	}
	for _, p := range f.pods {
		if p == ps.GetMetadata().GetName() || p == ps.GetMetadata().GetUid() || strings.HasPrefix(ps.GetId(), p) {
			return true
		}
	}
	return false
}

func contains[T comparable](list []T, v T) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// parseEventType reads an event type: created, started, stopped or deleted, in any case, or the CRI's
// full name (CONTAINER_STOPPED_EVENT).
func parseEventType(s string) (runtimeapi.ContainerEventType, error) {
	name := strings.ToUpper(strings.TrimSpace(s))
	if !strings.HasPrefix(name, "CONTAINER_") {
		name = "CONTAINER_" + name + "_EVENT"
	}
	if v, ok := runtimeapi.ContainerEventType_value[name]; ok {
		return runtimeapi.ContainerEventType(v), nil
	}
	return 0, fmt.Errorf("want created, started, stopped or deleted, got %q", s)
}

// listFlag returns a flag.Func that appends each comma-separated value of every use of the flag.
func listFlag(dst *[]string) func(string) error {
	return func(s string) error {
		for _, v := range strings.Split(s, ",") {
			if v = strings.TrimSpace(v); v != "" {
				*dst = append(*dst, v)
			}
		}
		return nil
	}
}

// parseEventsFlags reads the flags of `pleg-nri events`. getenv is os.Getenv in the command.
func parseEventsFlags(args []string, getenv func(string) string, stderr io.Writer) (eventsOptions, error) {
	fs := flag.NewFlagSet("pleg-nri events", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: pleg-nri events [flags]\n\nPrint a CRI endpoint's container event stream (pleg-nri's or containerd's) until interrupted.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	var o eventsOptions
	var endpoint, templ string
	var types []string
	endpointUsage := fmt.Sprintf("CRI endpoint: unix:///path, /path or tcp://host:port (default $%s, else %s)", runtimeEndpointEnv, DefaultConfig().Listen)
	fs.StringVar(&endpoint, "runtime-endpoint", "", endpointUsage)
	fs.StringVar(&endpoint, "r", "", "short for --runtime-endpoint")
	fs.StringVar(&endpoint, "endpoint", "", "the same as --runtime-endpoint")
	fs.StringVar(&o.output, "output", "table", "output format: table, json, yaml or go-template (json, yaml and go-template as crictl events)")
	fs.StringVar(&o.output, "o", "table", "short for --output")
	fs.StringVar(&templ, "template", "", "the Go template of --output go-template, over the event's JSON (as crictl's: {{.containerId}}, {{.containerEventType}}, {{.podSandboxStatus.metadata.name}}, ...)")
	fs.Func("pod", "only the events of these pods: pod name, pod UID or sandbox id prefix (comma-separated, repeatable)", listFlag(&o.filter.pods))
	fs.Func("namespace", "only the events of pods in these namespaces (comma-separated, repeatable)", listFlag(&o.filter.namespaces))
	fs.Func("type", "only these event types: created, started, stopped, deleted (comma-separated, repeatable)", listFlag(&types))
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case endpoint != "":
		o.endpoint = endpoint
	case getenv(runtimeEndpointEnv) != "":
		o.endpoint = getenv(runtimeEndpointEnv)
	default:
		o.endpoint = DefaultConfig().Listen
	}
	for _, s := range types {
		t, err := parseEventType(s)
		if err != nil {
			return o, fmt.Errorf("--type: %w", err)
		}
		o.filter.types = append(o.filter.types, t)
	}
	switch o.output {
	case "text":
		o.output = "table"
	case "table", "json", "yaml":
	case "go-template":
		if templ == "" {
			return o, errors.New("--output go-template needs --template")
		}
		t, err := template.New("event").Funcs(templateFuncs()).Option("missingkey=error").Parse(templ)
		if err != nil {
			return o, fmt.Errorf("--template: %w", err)
		}
		o.tmpl = t
	default:
		return o, fmt.Errorf("--output: want table, json, yaml or go-template, got %q", o.output)
	}
	if templ != "" && o.output != "go-template" {
		return o, fmt.Errorf("--template can't be used with --output %s", o.output)
	}
	return o, nil
}

// templateFuncs are the functions crictl gives its templates.
func templateFuncs() template.FuncMap {
	title, lower, upper := cases.Title(language.Und, cases.NoLower), cases.Lower(language.Und), cases.Upper(language.Und)
	return template.FuncMap{
		"json": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b) + "\n", err
		},
		"title": title.String,
		"lower": lower.String,
		"upper": upper.String,
	}
}

// eventPrinter writes events in one output format.
type eventPrinter struct {
	out  io.Writer
	opts eventsOptions
	// tw lays out the table; nil for the other formats.
	tw *tabwriter.Writer
}

// newEventPrinter returns a printer for o's format, and writes the table's header.
func newEventPrinter(out io.Writer, o eventsOptions) (*eventPrinter, error) {
	p := &eventPrinter{out: out, opts: o}
	if o.output == "table" {
		p.tw = tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
		fmt.Fprintln(p.tw, "TIME\tTYPE\tPOD\tCONTAINER\tID\tSTATE\tEXIT\tREASON\tLATENCY")
		if err := p.tw.Flush(); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// eventJSON encodes ev as crictl does: protojson with the proto field names in lowerCamelCase, every
// field, indented.
func eventJSON(ev *runtimeapi.ContainerEventResponse) ([]byte, error) {
	b, err := protojson.MarshalOptions{EmitDefaultValues: true, Indent: "  "}.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("failed to encode event: %w", err)
	}
	return b, nil
}

// print writes ev, received at recv, unless the filter rejects it.
func (p *eventPrinter) print(ev *runtimeapi.ContainerEventResponse, recv time.Time) error {
	if !p.opts.filter.match(ev) {
		return nil
	}
	switch p.opts.output {
	case "table":
		l := toEventLine(ev, recv)
		exit := ""
		if l.ExitCode != nil {
			exit = fmt.Sprint(*l.ExitCode)
		}
		id := l.ID
		if len(id) > 13 {
			id = id[:13]
		}
		fmt.Fprintf(p.tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2fms\n", l.Time.Format("15:04:05.000000"), l.Type, l.Pod,
			l.Container, id, l.State, exit, l.Reason, l.LatencyMS)
		return p.tw.Flush()
	}
	js, err := eventJSON(ev)
	if err != nil {
		return err
	}
	var out []byte
	switch p.opts.output {
	case "json":
		out = append(js, '\n')
	case "yaml":
		y, err := yaml.JSONToYAML(js)
		if err != nil {
			return fmt.Errorf("failed to encode event as YAML: %w", err)
		}
		// A YAML stream: one document per event.
		out = append([]byte("---\n"), y...)
	case "go-template":
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.UseNumber()
		var data any
		if err := dec.Decode(&data); err != nil {
			return fmt.Errorf("failed to decode event: %w", err)
		}
		var buf bytes.Buffer
		if err := p.opts.tmpl.Execute(&buf, data); err != nil {
			return fmt.Errorf("--template: %w", err)
		}
		out = append(buf.Bytes(), '\n')
	}
	_, err = p.out.Write(out)
	return err
}

// eventLine is one event as the table prints it.
type eventLine struct {
	// Time is the event's created_at.
	Time time.Time
	Type string
	// Pod is namespace/name; PodUID its uid.
	Pod    string
	PodUID string
	// Container is the container's name, or "(sandbox)" for a sandbox event; ID the container or
	// sandbox id.
	Container string
	ID        string
	// State is the container's (or the sandbox's) state in the event's statuses.
	State    string
	ExitCode *int32
	Reason   string
	// Containers is how many container statuses the event carries.
	Containers int
	// LatencyMS is the time from the event's created_at to its receipt here.
	LatencyMS float64
}

// toEventLine summarizes an event received at recv.
func toEventLine(ev *runtimeapi.ContainerEventResponse, recv time.Time) eventLine {
	l := eventLine{
		Time:       time.Unix(0, ev.CreatedAt),
		Type:       strings.TrimSuffix(strings.TrimPrefix(ev.ContainerEventType.String(), "CONTAINER_"), "_EVENT"),
		ID:         ev.ContainerId,
		Containers: len(ev.ContainersStatuses),
		LatencyMS:  float64(recv.UnixNano()-ev.CreatedAt) / 1e6,
	}
	if ps := ev.PodSandboxStatus; ps != nil {
		l.Pod = ps.GetMetadata().GetNamespace() + "/" + ps.GetMetadata().GetName()
		l.PodUID = ps.GetMetadata().GetUid()
		if ps.Id == ev.ContainerId {
			l.Container = "(sandbox)"
			l.State = strings.TrimPrefix(ps.State.String(), "SANDBOX_")
		}
	} else {
		l.Pod = "(no pod status)"
	}
	for _, cs := range ev.ContainersStatuses {
		if cs.Id != ev.ContainerId {
			continue
		}
		l.Container = cs.GetMetadata().GetName()
		l.State = strings.TrimPrefix(cs.State.String(), "CONTAINER_")
		if cs.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			code := cs.ExitCode
			l.ExitCode = &code
			l.Reason = cs.Reason
		}
	}
	if l.Container == "" {
		l.Container = "(gone)"
	}
	return l
}

// runEvents is `pleg-nri events`: print a CRI endpoint's event stream until interrupted.
func runEvents(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	o, err := parseEventsFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	conn, err := dial.CRI(o.endpoint)
	if err != nil {
		return fmt.Errorf("--runtime-endpoint: %w", err)
	}
	defer conn.Close()
	stream, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		return fmt.Errorf("GetContainerEvents on %s: %w", o.endpoint, err)
	}
	p, err := newEventPrinter(stdout, o)
	if err != nil {
		return err
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil || status.Code(err) == codes.Canceled {
				return nil
			}
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("%s closed the event stream", o.endpoint)
			}
			return fmt.Errorf("event stream from %s: %w", o.endpoint, err)
		}
		if err := p.print(ev, time.Now()); err != nil {
			return err
		}
	}
}

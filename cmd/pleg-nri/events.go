package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"text/template"
	"time"

	"github.com/urfave/cli/v3"
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

// eventsCommand is `pleg-nri events`: print a CRI endpoint's event stream until interrupted. run gets the
// options; getenv is os.Getenv in the command.
func eventsCommand(getenv func(string) string, run func(context.Context, eventsOptions) error) *cli.Command {
	return &cli.Command{
		Name:      "events",
		Usage:     "print a CRI endpoint's container event stream (pleg-nri's or containerd's) until interrupted",
		UsageText: "pleg-nri events [flags]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "runtime-endpoint", Aliases: []string{"r", "endpoint"},
				Usage: fmt.Sprintf("CRI endpoint: unix:///path, /path or tcp://host:port (default $%s, else %s)", runtimeEndpointEnv, DefaultConfig().Listen)},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table",
				Usage: "output format: table, json, yaml or go-template (json, yaml and go-template as crictl events)"},
			&cli.StringFlag{Name: "template",
				Usage: "the Go template of --output go-template, over the event's JSON (as crictl's: {{.containerId}}, {{.containerEventType}}, {{.podSandboxStatus.metadata.name}}, ...)"},
			&cli.StringSliceFlag{Name: "pod", Aliases: []string{"p"}, Usage: "only the events of these pods: pod name, pod UID or sandbox id prefix (comma-separated, repeatable)"},
			&cli.StringSliceFlag{Name: "namespace", Usage: "only the events of pods in these namespaces (comma-separated, repeatable)"},
			&cli.StringSliceFlag{Name: "type", Usage: "only these event types: created, started, stopped, deleted (comma-separated, repeatable)"},
		},
		OnUsageError: onUsageError,
		Action: func(ctx context.Context, cmd *cli.Command) error {
			o, err := eventsOptionsFrom(cmd, getenv)
			if err != nil {
				return usageError{err}
			}
			return run(ctx, o)
		},
	}
}

// eventsOptionsFrom reads the options of `pleg-nri events` from its command line.
func eventsOptionsFrom(cmd *cli.Command, getenv func(string) string) (eventsOptions, error) {
	if cmd.Args().Len() > 0 {
		return eventsOptions{}, fmt.Errorf("unexpected argument %q", cmd.Args().First())
	}
	o := eventsOptions{output: cmd.String("output")}
	o.filter.pods, o.filter.namespaces = trimmed(cmd.StringSlice("pod")), trimmed(cmd.StringSlice("namespace"))
	endpoint, templ, types := cmd.String("runtime-endpoint"), cmd.String("template"), trimmed(cmd.StringSlice("type"))
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

// trimmed returns the non-empty values of list, trimmed.
func trimmed(list []string) []string {
	var out []string
	for _, v := range list {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// parseEventsFlags reads the options of `pleg-nri events` from args (after "events").
func parseEventsFlags(args []string, getenv func(string) string, stderr io.Writer) (o eventsOptions, err error) {
	cmd := eventsCommand(getenv, func(_ context.Context, opts eventsOptions) error { o = opts; return nil })
	cmd.Writer, cmd.ErrWriter = io.Discard, stderr
	return o, cmd.Run(context.Background(), append([]string{"events"}, args...))
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

// runEvents runs `pleg-nri events` with args (after "events").
func runEvents(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := eventsCommand(getenv, func(ctx context.Context, o eventsOptions) error { return printEvents(ctx, o, stdout) })
	cmd.Writer, cmd.ErrWriter = stdout, stderr
	return cmd.Run(ctx, append([]string{"events"}, args...))
}

// printEvents prints the event stream o names on stdout until ctx is done or the stream ends.
func printEvents(ctx context.Context, o eventsOptions, stdout io.Writer) error {
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
				// The server ended the stream: the end of the events, as crictl events takes it.
				return nil
			}
			return fmt.Errorf("event stream from %s: %w", o.endpoint, err)
		}
		if err := p.print(ev, time.Now()); err != nil {
			return err
		}
	}
}

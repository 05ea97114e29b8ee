// Package eventprint prints CRI container event streams as `pleg-nri events` does: a table, or crictl's
// json, yaml and go-template formats, filtered by pod, namespace and type.
package eventprint

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

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/internal/dial"
)

// Options say what `pleg-nri events` prints, and how.
type Options struct {
	// Endpoint is the CRI endpoint whose stream is printed.
	Endpoint string
	// Output is table, json, yaml or go-template; Template is the parsed template of go-template
	// (ParseTemplate).
	Output   string
	Template *template.Template
	// Filter selects the events printed.
	Filter Filter
}

// SetOutput sets the output format (table, json, yaml or go-template; text is table) and the template of
// go-template, which needs one; no other format takes a template. Its errors name the flag at fault
// (--output, --template), as `pleg-nri events` shows them.
func (o *Options) SetOutput(output, templ string) error {
	o.Output, o.Template = output, nil
	switch output {
	case "text":
		o.Output = "table"
	case "table", "json", "yaml":
	case "go-template":
		if templ == "" {
			return errors.New("--output go-template needs --template")
		}
		t, err := ParseTemplate(templ)
		if err != nil {
			return fmt.Errorf("--template: %w", err)
		}
		o.Template = t
	default:
		return fmt.Errorf("--output: want table, json, yaml or go-template, got %q", output)
	}
	if templ != "" && o.Output != "go-template" {
		return fmt.Errorf("--template can't be used with --output %s", o.Output)
	}
	return nil
}

// Filter selects events. Within one field any value matches; across fields all must match; an
// empty field matches every event.
type Filter struct {
	// Pods are pod names, pod UIDs or sandbox id prefixes.
	Pods []string
	// Namespaces are pod namespaces.
	Namespaces []string
	// Types are event types.
	Types []runtimeapi.ContainerEventType
}

// Match says whether ev passes the filter.
func (f Filter) Match(ev *runtimeapi.ContainerEventResponse) bool {
	if len(f.Types) > 0 && !contains(f.Types, ev.ContainerEventType) {
		return false
	}
	if len(f.Pods) == 0 && len(f.Namespaces) == 0 {
		return true
	}
	ps := ev.GetPodSandboxStatus()
	if ps == nil {
		return false
	}
	if len(f.Namespaces) > 0 && !contains(f.Namespaces, ps.GetMetadata().GetNamespace()) {
		return false
	}
	if len(f.Pods) == 0 {
		return true
	}
	for _, p := range f.Pods {
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

// ParseEventType reads an event type: created, started, stopped or deleted, in any case, or the CRI's
// full name (CONTAINER_STOPPED_EVENT).
func ParseEventType(s string) (runtimeapi.ContainerEventType, error) {
	name := strings.ToUpper(strings.TrimSpace(s))
	if !strings.HasPrefix(name, "CONTAINER_") {
		name = "CONTAINER_" + name + "_EVENT"
	}
	if v, ok := runtimeapi.ContainerEventType_value[name]; ok {
		return runtimeapi.ContainerEventType(v), nil
	}
	return 0, fmt.Errorf("want created, started, stopped or deleted, got %q", s)
}

// ParseTemplate parses a go-template output's template, with crictl's functions; a missing key is an
// error when it runs.
func ParseTemplate(text string) (*template.Template, error) {
	return template.New("event").Funcs(TemplateFuncs()).Option("missingkey=error").Parse(text)
}

// TemplateFuncs are the functions crictl gives its templates.
func TemplateFuncs() template.FuncMap {
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

// Printer writes events in one output format.
type Printer struct {
	out  io.Writer
	opts Options
	// tw lays out the table; nil for the other formats.
	tw *tabwriter.Writer
}

// NewPrinter returns a printer for o's format, and writes the table's header.
func NewPrinter(out io.Writer, o Options) (*Printer, error) {
	p := &Printer{out: out, opts: o}
	if o.Output == "table" {
		p.tw = tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
		fmt.Fprintln(p.tw, "TIME\tTYPE\tPOD\tCONTAINER\tID\tSTATE\tEXIT\tREASON\tLATENCY")
		if err := p.tw.Flush(); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// JSON encodes ev as crictl does: protojson with the proto field names in lowerCamelCase, every
// field, indented.
func JSON(ev *runtimeapi.ContainerEventResponse) ([]byte, error) {
	b, err := protojson.MarshalOptions{EmitDefaultValues: true, Indent: "  "}.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("failed to encode event: %w", err)
	}
	return b, nil
}

// Print writes ev, received at recv, unless the filter rejects it.
func (p *Printer) Print(ev *runtimeapi.ContainerEventResponse, recv time.Time) error {
	if !p.opts.Filter.Match(ev) {
		return nil
	}
	switch p.opts.Output {
	case "table":
		l := ToLine(ev, recv)
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
	js, err := JSON(ev)
	if err != nil {
		return err
	}
	var out []byte
	switch p.opts.Output {
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
		if err := p.opts.Template.Execute(&buf, data); err != nil {
			return fmt.Errorf("--template: %w", err)
		}
		out = append(buf.Bytes(), '\n')
	}
	_, err = p.out.Write(out)
	return err
}

// Line is one event as the table prints it.
type Line struct {
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

// ToLine summarizes an event received at recv.
func ToLine(ev *runtimeapi.ContainerEventResponse, recv time.Time) Line {
	l := Line{
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

// Stream prints the event stream o names on stdout until ctx is done or the stream ends.
func Stream(ctx context.Context, o Options, stdout io.Writer) error {
	conn, err := dial.CRI(o.Endpoint)
	if err != nil {
		return fmt.Errorf("--runtime-endpoint: %w", err)
	}
	defer conn.Close()
	stream, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		return fmt.Errorf("GetContainerEvents on %s: %w", o.Endpoint, err)
	}
	p, err := NewPrinter(stdout, o)
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
			return fmt.Errorf("event stream from %s: %w", o.Endpoint, err)
		}
		if err := p.Print(ev, time.Now()); err != nil {
			return err
		}
	}
}

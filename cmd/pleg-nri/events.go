package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/internal/eventprint"
)

// runtimeEndpointEnv is the environment variable crictl reads its --runtime-endpoint from.
const runtimeEndpointEnv = "CONTAINER_RUNTIME_ENDPOINT"

// eventsCommand is `pleg-nri events`: print a CRI endpoint's event stream until interrupted. run gets the
// options; getenv is os.Getenv in the command.
func eventsCommand(getenv func(string) string, run func(context.Context, eventprint.Options) error) *cli.Command {
	return &cli.Command{
		Name:      "events",
		Usage:     "print a CRI endpoint's container event stream (pleg-nri's or containerd's) until interrupted",
		UsageText: "pleg-nri events [flags]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "runtime-endpoint", Aliases: []string{"r", "endpoint"},
				Usage: fmt.Sprintf("CRI endpoint: unix:///path, /path or tcp://host:port (default $%s, else %s)", runtimeEndpointEnv, config.Default().Listen)},
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
func eventsOptionsFrom(cmd *cli.Command, getenv func(string) string) (eventprint.Options, error) {
	if cmd.Args().Len() > 0 {
		return eventprint.Options{}, fmt.Errorf("unexpected argument %q", cmd.Args().First())
	}
	o := eventprint.Options{Output: cmd.String("output")}
	o.Filter.Pods, o.Filter.Namespaces = trimmed(cmd.StringSlice("pod")), trimmed(cmd.StringSlice("namespace"))
	endpoint, templ, types := cmd.String("runtime-endpoint"), cmd.String("template"), trimmed(cmd.StringSlice("type"))
	switch {
	case endpoint != "":
		o.Endpoint = endpoint
	case getenv(runtimeEndpointEnv) != "":
		o.Endpoint = getenv(runtimeEndpointEnv)
	default:
		o.Endpoint = config.Default().Listen
	}
	for _, s := range types {
		t, err := eventprint.ParseEventType(s)
		if err != nil {
			return o, fmt.Errorf("--type: %w", err)
		}
		o.Filter.Types = append(o.Filter.Types, t)
	}
	switch o.Output {
	case "text":
		o.Output = "table"
	case "table", "json", "yaml":
	case "go-template":
		if templ == "" {
			return o, errors.New("--output go-template needs --template")
		}
		t, err := eventprint.ParseTemplate(templ)
		if err != nil {
			return o, fmt.Errorf("--template: %w", err)
		}
		o.Template = t
	default:
		return o, fmt.Errorf("--output: want table, json, yaml or go-template, got %q", o.Output)
	}
	if templ != "" && o.Output != "go-template" {
		return o, fmt.Errorf("--template can't be used with --output %s", o.Output)
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
func parseEventsFlags(args []string, getenv func(string) string, stderr io.Writer) (o eventprint.Options, err error) {
	cmd := eventsCommand(getenv, func(_ context.Context, opts eventprint.Options) error { o = opts; return nil })
	cmd.Writer, cmd.ErrWriter = io.Discard, stderr
	return o, cmd.Run(context.Background(), append([]string{"events"}, args...))
}

// runEvents runs `pleg-nri events` with args (after "events").
func runEvents(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := eventsCommand(getenv, func(ctx context.Context, o eventprint.Options) error { return eventprint.Stream(ctx, o, stdout) })
	cmd.Writer, cmd.ErrWriter = stdout, stderr
	return cmd.Run(ctx, append([]string{"events"}, args...))
}

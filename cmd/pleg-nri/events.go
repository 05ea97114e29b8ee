package main

import (
	"context"
	"fmt"
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
	var o eventprint.Options
	o.Filter.Pods, o.Filter.Namespaces = trimmed(cmd.StringSlice("pod")), trimmed(cmd.StringSlice("namespace"))
	switch endpoint := cmd.String("runtime-endpoint"); {
	case endpoint != "":
		o.Endpoint = endpoint
	case getenv(runtimeEndpointEnv) != "":
		o.Endpoint = getenv(runtimeEndpointEnv)
	default:
		o.Endpoint = config.Default().Listen
	}
	for _, s := range trimmed(cmd.StringSlice("type")) {
		t, err := eventprint.ParseEventType(s)
		if err != nil {
			return o, fmt.Errorf("--type: %w", err)
		}
		o.Filter.Types = append(o.Filter.Types, t)
	}
	return o, o.SetOutput(cmd.String("output"), cmd.String("template"))
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

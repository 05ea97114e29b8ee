package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/pleg-nri/pleg-nri/internal/conformance"
)

// conformanceCommand is `pleg-nri conformance`: run the conformance suite of CRI container event
// streams against an endpoint and print one row per check. run gets the suite's options, the
// timeout and whether to print JSON; getenv is os.Getenv in the command: without --runtime-endpoint
// the endpoint is $CONTAINER_RUNTIME_ENDPOINT, as crictl's, else containerd's socket.
func conformanceCommand(getenv func(string) string, run func(ctx context.Context, o conformance.Options, timeout time.Duration, asJSON bool) error) *cli.Command {
	return &cli.Command{
		Name:  "conformance",
		Usage: "check a CRI endpoint's container event stream (containerd's, pleg-nri's, any runtime's) against what a kubelet relies on",
		UsageText: "pleg-nri conformance [flags]\n\n" +
			"It runs pods and containers through the endpoint's runtime (labeled " + conformance.RunLabel + "=<run id>, all\n" +
			"removed at the end, also when interrupted), prints pass / fail / skip for each check, and exits 1 if any failed.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "runtime-endpoint", Aliases: []string{"r", "endpoint"},
				Usage: fmt.Sprintf("CRI endpoint: unix:///path, /path or tcp://host:port (default $%s, else %s)", runtimeEndpointEnv, conformance.DefaultEndpoint)},
			&cli.StringFlag{Name: "image", Value: conformance.DefaultImage,
				Usage: "image of every container, already on the node, with sh, sleep and tail (busybox)"},
			&cli.StringFlag{Name: "namespace", Value: conformance.DefaultNamespace, Usage: "Kubernetes namespace of the run's pods"},
			&cli.StringFlag{Name: "run-id", Usage: "value of the run's label on every pod (random by default)"},
			&cli.StringSliceFlag{Name: "checks", Usage: "run only these checks: ids or prefixes (once, order/pod, ...; comma-separated, repeatable)"},
			&cli.IntFlag{Name: "load", Value: conformance.DefaultLoad, Usage: "containers in the load check's pod"},
			&cli.IntFlag{Name: "slow-pods", Value: conformance.DefaultSlowPods,
				Usage: "pods the slow-consumer check starts beside a subscriber that does not read (8 events each: past 12, more than containerd's queue of 100 per subscriber)"},
			&cli.StringFlag{Name: "expect-replay",
				Usage: "what the endpoint documents a late subscriber gets of the events sent while nobody listened: none or all (default: reported, not judged)"},
			&cli.DurationFlag{Name: "late-wait",
				Usage: "how long nobody listens before the late subscriber subscribes (past a runtime's hold of events for nobody: containerd's is 5m)"},
			&cli.StringFlag{Name: "runtime-log",
				Usage: "the runtime's log file: the late-subscriber check counts its lines while nobody listens"},
			&cli.StringFlag{Name: "runtime-stop-command",
				Usage: "a shell command that stops the runtime (systemctl stop containerd): with --runtime-start-command, the runtime-restart check runs"},
			&cli.StringFlag{Name: "runtime-start-command",
				Usage: "a shell command that starts the runtime again (systemctl start containerd); it runs even if the stop failed"},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Minute, Usage: "end the run (and clean up) after this long"},
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
			&cli.BoolFlag{Name: "list", Usage: "print the checks' ids and sentences, run nothing"},
		},
		OnUsageError: onUsageError,
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if cmd.Args().Len() > 0 {
				return usageError{fmt.Errorf("unexpected argument %q", cmd.Args().First())}
			}
			if cmd.Bool("list") {
				for _, c := range conformance.Checks() {
					fmt.Fprintf(cmd.Root().Writer, "%-26s %s\n", c.ID, c.Name)
				}
				return nil
			}
			if cmd.Duration("timeout") <= 0 {
				return usageError{errors.New("--timeout must be positive")}
			}
			endpoint := cmd.String("runtime-endpoint")
			if endpoint == "" {
				endpoint = getenv(runtimeEndpointEnv)
			}
			if endpoint == "" {
				endpoint = conformance.DefaultEndpoint
			}
			replay, err := conformance.ParseReplay(cmd.String("expect-replay"))
			if err != nil {
				return usageError{fmt.Errorf("--expect-replay: %w", err)}
			}
			if cmd.Duration("late-wait") < 0 {
				return usageError{errors.New("--late-wait must not be negative")}
			}
			o := conformance.Options{
				Endpoint:  endpoint,
				Image:     cmd.String("image"),
				Namespace: cmd.String("namespace"),
				RunID:     cmd.String("run-id"),
				Checks:    trimmed(cmd.StringSlice("checks")),
				Load:      int(cmd.Int("load")),
				SlowPods:  int(cmd.Int("slow-pods")),

				ExpectReplay: replay,
				LateWait:     cmd.Duration("late-wait"),
			}
			stop, start := cmd.String("runtime-stop-command"), cmd.String("runtime-start-command")
			if (stop == "") != (start == "") {
				return usageError{errors.New("--runtime-stop-command and --runtime-start-command go together")}
			}
			if stop != "" {
				o.RestartRuntime = conformance.RestartCommands(stop, start)
			}
			if path := cmd.String("runtime-log"); path != "" {
				o.LogLines = func() (int, error) { return conformance.FileLines(path) }
			}
			return run(ctx, o, cmd.Duration("timeout"), cmd.Bool("json"))
		},
	}
}

// runConformance runs the suite and prints its report to stdout; it fails if a check failed.
func runConformance(stdout io.Writer) func(context.Context, conformance.Options, time.Duration, bool) error {
	return func(ctx context.Context, o conformance.Options, timeout time.Duration, asJSON bool) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		rep, err := conformance.Run(ctx, o)
		if err != nil {
			return err
		}
		if asJSON {
			err = rep.WriteJSON(stdout)
		} else {
			err = rep.WriteTable(stdout)
		}
		if err != nil {
			return err
		}
		return rep.Err()
	}
}

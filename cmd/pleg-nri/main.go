// Command pleg-nri is the container event source for the kubelet's EventedPLEG on containerd nodes.
//
//	pleg-nri [flags]                     the daemon (see nri.conf.example for every key)
//	pleg-nri events [flags]              print a CRI endpoint's event stream (pleg-nri events -h)
//	pleg-nri front [flags]               the front (started by the daemon, package front; hidden)
//	pleg-nri stop-front [--run-dir DIR]  stop the front (ends the kubelet's event stream)
//	pleg-nri kubelet-config              point a kubelet's configuration at pleg-nri (pleg-nri kubelet-config -h)
//	pleg-nri version [--run-dir DIR]     print the version, and the running core's and front's
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/containerd/log"
	"github.com/urfave/cli/v3"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/internal/eventprint"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	setProcs(ctx)
	err := newApp(os.Stdout, os.Stderr, os.Getenv).Run(ctx, os.Args)
	stop()
	os.Exit(exitStatus(err, os.Stderr))
}

// newApp is pleg-nri's command line: the daemon, and its commands. getenv is os.Getenv in the command.
func newApp(stdout, stderr io.Writer, getenv func(string) string) *cli.Command {
	return &cli.Command{
		Name:      "pleg-nri",
		Usage:     "the container event source for the kubelet's EventedPLEG on containerd nodes",
		UsageText: "pleg-nri [flags]  (the daemon: see nri.conf.example for every key)\npleg-nri command [flags]",
		Version:   version,
		// `pleg-nri version` says it, as `crictl version` does; no --version flag beside it.
		HideVersion: true,
		Writer:      stdout,
		ErrWriter:   stderr,
		Flags:       daemonFlags(config.Default()),
		// Errors are main's to print and turn into an exit status (exitStatus).
		ExitErrHandler: func(context.Context, *cli.Command, error) {},
		OnUsageError:   onUsageError,
		Action: func(ctx context.Context, cmd *cli.Command) error {
			cfg, path, err := daemonConfig(cmd)
			if err != nil {
				return usageError{err}
			}
			return runDaemon(ctx, cfg, path)
		},
		Commands: []*cli.Command{
			eventsCommand(getenv, func(ctx context.Context, o eventprint.Options) error { return eventprint.Stream(ctx, o, stdout) }),
			conformanceCommand(getenv, runConformance(stdout)),
			frontCommand(),
			stopFrontCommand(),
			kubeletConfigCommand(),
			healthCommand(),
			versionCommand(),
		},
	}
}

// usageError is a command line that cannot run: a flag or argument not known, or a value not valid.
// The process exits with status 2; any other failure exits with 1.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// onUsageError marks an error of the flags' parsing as a usage error.
func onUsageError(_ context.Context, _ *cli.Command, err error, _ bool) error { return usageError{err} }

// exitStatus prints err, if any, and returns the process's exit status: 0 on success, 2 for a usage
// error, 1 for any other failure.
func exitStatus(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "pleg-nri: %v\n", err)
	if errors.As(err, new(usageError)) {
		return 2
	}
	return 1
}

// setProcs runs the process on one P unless the GOMAXPROCS environment variable says otherwise. It is a
// setting of the process (main calls it before any command runs; the unit sets GOMAXPROCS=1 too, so
// that operators see it), never of code that tests run in their own process.
//
// pleg-nri's work is a chain of short hand-offs between goroutines (an NRI callback wakes the core, the
// core wakes each subscriber's stream, the proxy's calls cross three goroutines each way), with little
// CPU in each. With more than one P, every hand-off to a parked goroutine also wakes an idle OS thread
// to run it, and that cross-CPU wake-up is most of the cost: 15-18 µs per wake-up measured on the
// project's 2-CPU VMs, against under 1 µs when the woken goroutine simply runs next on the same P. Run
// side by side (`make bench`, 4 alternating runs), one P cut the NRI callback time at p99 from about
// 230 µs to about 87 µs and the proxy's added latency at p50 by about a quarter. A node's pleg-nri
// needs far less than a CPU (a relist of 1,000 containers is about 0.6 ms).
func setProcs(ctx context.Context) {
	if v := os.Getenv("GOMAXPROCS"); v != "" {
		log.G(ctx).WithField("GOMAXPROCS", runtime.GOMAXPROCS(0)).Info("GOMAXPROCS set by the environment")
		return
	}
	runtime.GOMAXPROCS(1)
}

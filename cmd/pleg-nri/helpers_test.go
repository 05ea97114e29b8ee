package main

import (
	"context"
	"io"
	"time"

	"github.com/urfave/cli/v3"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/eventprint"
)

// The commands run as the tests call them: with their arguments, and the writers and environment
// given.

// loadConfig is daemonConfig for a daemon command line (args without the program's name).
func loadConfig(args []string) (cfg config.Config, path string, err error) {
	app := newApp(io.Discard, io.Discard, func(string) string { return "" })
	app.Action = func(_ context.Context, cmd *cli.Command) error {
		cfg, path, err = daemonConfig(cmd)
		return err
	}
	if runErr := app.Run(context.Background(), append([]string{"pleg-nri"}, args...)); err == nil {
		err = runErr
	}
	return cfg, path, err
}

// runKubeletConfig runs `pleg-nri kubelet-config` with args (after "kubelet-config").
func runKubeletConfig(args []string, stdout, stderr io.Writer) error {
	cmd := kubeletConfigCommand()
	cmd.Writer, cmd.ErrWriter = stdout, stderr
	return cmd.Run(context.Background(), append([]string{"kubelet-config"}, args...))
}

// runStopFront runs `pleg-nri stop-front` with args (after "stop-front").
func runStopFront(args []string, out io.Writer) error {
	cmd := stopFrontCommand()
	cmd.Writer = out
	return cmd.Run(context.Background(), append([]string{"stop-front"}, args...))
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

// noEnv is an empty environment.
func noEnv(string) string { return "" }

// endpointEnv is an environment of CONTAINER_RUNTIME_ENDPOINT=v only.
func endpointEnv(v string) func(string) string {
	return func(k string) string {
		if k == runtimeEndpointEnv {
			return v
		}
		return ""
	}
}

// versionThrough calls CRI Version on the kubelet's endpoint at the unix socket sock, on a new
// connection, within timeout (a call across a front's fault, say).
func versionThrough(sock string, timeout time.Duration, opts ...grpc.CallOption) error {
	conn, err := dial.CRI("unix://" + sock)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err = runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{}, opts...)
	return err
}

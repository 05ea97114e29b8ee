package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/containerd/log"

	"github.com/pleg-nri/pleg-nri/front"
)

// frontConfig is the front's configuration for the daemon's cfg.
func frontConfig(cfg Config) front.Config {
	return front.Config{Listen: cfg.Listen, RuntimeEndpoint: cfg.RuntimeEndpoint, RunDir: cfg.runDir(), LogLevel: cfg.LogLevel,
		ReadFreshness: cfg.ReadFreshness, RefreshAfterStop: cfg.RefreshAfterStop, Version: version}
}

// runFront is `pleg-nri front`, the front process the daemon starts (package front).
func runFront(ctx context.Context, args []string) error {
	cfg, err := front.ParseArgs(args, frontConfig(DefaultConfig()))
	if err != nil {
		return err
	}
	if err := log.SetLevel(cfg.LogLevel); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	return front.Run(ctx, cfg)
}

// runStopFront is `pleg-nri stop-front`: it stops the front of a run directory (ending the kubelet's
// event stream), e.g. to remove pleg-nri from a node.
func runStopFront(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("pleg-nri stop-front", flag.ContinueOnError)
	runDir := fs.String("run-dir", DefaultConfig().runDir(), "run directory of the front to stop")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := front.Stop(*runDir); err != nil {
		return err
	}
	fmt.Fprintln(out, "front stopped")
	return nil
}

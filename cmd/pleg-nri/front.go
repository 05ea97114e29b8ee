package main

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/log"
	"github.com/urfave/cli/v3"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/eventbridge/front"
)

// frontConfig is the front's configuration for the daemon's cfg.
func frontConfig(cfg config.Config) front.Config {
	return front.Config{Listen: cfg.Listen, RuntimeEndpoint: cfg.RuntimeEndpoint, RunDir: cfg.RunDirectory(), LogLevel: cfg.LogLevel,
		ReadFreshness: cfg.ReadFreshness, RefreshAfterStop: cfg.RefreshAfterStop,
		CoreGrace: time.Duration(cfg.CoreGrace), AllowTCPListen: cfg.AllowTCPListen, Version: version}
}

// frontCommand is `pleg-nri front`, the front process the daemon starts (package front). Its flags are
// the front's own protocol (front.Config.Args), parsed by the front package.
func frontCommand() *cli.Command {
	return &cli.Command{
		Name:            "front",
		Usage:           "the front: the kubelet's CRI endpoint, kept across restarts of the core (started by the daemon)",
		Hidden:          true,
		SkipFlagParsing: true,
		Action: func(ctx context.Context, cmd *cli.Command) error {
			return runFront(ctx, cmd.Args().Slice())
		},
	}
}

// runFront runs the front with its flags.
func runFront(ctx context.Context, args []string) error {
	cfg, err := front.ParseArgs(args, frontConfig(config.Default()))
	if err != nil {
		return usageError{err}
	}
	if err := log.SetLevel(cfg.LogLevel); err != nil {
		return usageError{fmt.Errorf("--log-level: %w", err)}
	}
	return front.Run(ctx, cfg)
}

// stopFrontCommand is `pleg-nri stop-front`: it stops the front of a run directory (ending the kubelet's
// event stream), e.g. to remove pleg-nri from a node.
func stopFrontCommand() *cli.Command {
	return &cli.Command{
		Name:      "stop-front",
		Usage:     "stop the front (ends the kubelet's event stream; stop the core first, or it starts a new front)",
		UsageText: "pleg-nri stop-front [--run-dir DIR]",
		Flags: []cli.Flag{&cli.StringFlag{Name: "run-dir", Value: config.Default().RunDirectory(),
			Usage: "run directory of the front to stop"}},
		OnUsageError: onUsageError,
		Action: func(_ context.Context, cmd *cli.Command) error {
			if cmd.Args().Len() > 0 {
				return usageError{fmt.Errorf("unexpected argument %q", cmd.Args().First())}
			}
			if err := front.Stop(cmd.String("run-dir")); err != nil {
				return err
			}
			fmt.Fprintln(cmd.Root().Writer, "front stopped")
			return nil
		},
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/health"
)

// healthCommand is `pleg-nri health`: whether pleg-nri serves its node, as the kubelet needs it (package
// health: the core's /readyz and a CRI Version call through the kubelet's endpoint, each within
// --timeout). It prints one line per check and fails (status 1) unless both pass. The Helm chart's readiness probe
// runs it (deploy/node.sh health).
func healthCommand() *cli.Command {
	def := config.Default()
	return &cli.Command{
		Name:      "health",
		Usage:     "check that pleg-nri serves this node: the core's /readyz and a CRI Version call through the kubelet's endpoint",
		UsageText: "pleg-nri health [flags]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "readyz", Value: "http://" + def.MetricsAddress + "/readyz",
				Usage: "the core's /readyz URL (http://<metrics-address>/readyz)"},
			&cli.StringFlag{Name: "runtime-endpoint", Aliases: []string{"r", "endpoint"}, Value: def.Listen,
				Usage: "the kubelet's endpoint, served by the front: unix:///path, /path or tcp://host:port"},
			&cli.DurationFlag{Name: "timeout", Value: 2 * time.Second, Usage: "how long each check may take"},
		},
		OnUsageError: onUsageError,
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if cmd.Args().Len() > 0 {
				return usageError{fmt.Errorf("unexpected argument %q", cmd.Args().First())}
			}
			if cmd.Duration("timeout") <= 0 {
				return usageError{errors.New("--timeout must be positive")}
			}
			readyz, err := health.ReadyzURL(cmd.String("readyz"))
			if err != nil {
				return usageError{fmt.Errorf("--readyz: %w", err)}
			}
			if _, err := dial.Target(cmd.String("runtime-endpoint")); err != nil {
				return usageError{fmt.Errorf("--runtime-endpoint: %w", err)}
			}
			return health.Check(ctx, cmd.Root().Writer, readyz, cmd.String("runtime-endpoint"), cmd.Duration("timeout"))
		},
	}
}

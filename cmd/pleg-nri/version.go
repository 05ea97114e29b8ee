package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v3"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/runningcore"
)

// versionCommand is `pleg-nri version`: this binary's version, then the version and pid of the core
// and of the front that serve the run directory, if any. After an upgrade the binary on disk, the core
// and the front may each be of another version (a front is kept across upgrades of the core).
func versionCommand() *cli.Command {
	return &cli.Command{
		Name:      "version",
		Usage:     "print the version, and the running core's and front's",
		UsageText: "pleg-nri version [--run-dir DIR]",
		Flags: []cli.Flag{&cli.StringFlag{Name: "run-dir", Value: config.Default().RunDirectory(),
			Usage: "run directory of the core and the front to ask"}},
		OnUsageError: onUsageError,
		Action: func(_ context.Context, cmd *cli.Command) error {
			if cmd.Args().Len() > 0 {
				return usageError{fmt.Errorf("unexpected argument %q", cmd.Args().First())}
			}
			runningcore.WriteVersions(cmd.Root().Writer, cmd.String("run-dir"), version)
			return nil
		},
	}
}

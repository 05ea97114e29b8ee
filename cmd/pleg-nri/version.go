package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/urfave/cli/v3"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/runningcore"
	"github.com/pleg-nri/pleg-nri/eventbridge/front"
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
			printVersions(cmd.Root().Writer, cmd.String("run-dir"))
			return nil
		},
	}
}

// printVersions writes this binary's version, then the running core's (the core socket's server, with
// the version its core.json gives) and front's (its control socket's answer), each when one serves
// runDir.
func printVersions(w io.Writer, runDir string) {
	fmt.Fprintf(w, "pleg-nri %s\n", version)
	if pid, err := runningcore.PeerPID(filepath.Join(runDir, front.CoreSocketName)); err == nil {
		v := "unknown (no " + runningcore.InfoName + ": an older release)"
		if info, err := runningcore.ReadInfo(runDir); err == nil && info.PID == pid {
			v = info.Version
		}
		fmt.Fprintf(w, "core: pid %d, version %s\n", pid, v)
	}
	if info, err := front.Query(runDir, "info"); err == nil {
		fmt.Fprintf(w, "front: pid %d, version %s\n", info.PID, info.Version)
	}
}

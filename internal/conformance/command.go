package conformance

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// RestartCommands returns an Options.RestartRuntime for a runtime that two shell commands stop and
// start (run by sh -c; `systemctl stop containerd` and `systemctl start containerd` on a node of
// systemd). The start command runs even if the stop command or whileDown failed, so that the run
// never leaves the runtime stopped; the suite then waits for the endpoint to answer again.
func RestartCommands(stop, start string) func(ctx context.Context, whileDown func(context.Context) error) error {
	return func(ctx context.Context, whileDown func(context.Context) error) error {
		if err := shell(ctx, stop); err != nil {
			return errors.Join(fmt.Errorf("stop the runtime: %w", err), startAnyway(start))
		}
		werr := whileDown(ctx)
		return errors.Join(werr, startAnyway(start))
	}
}

// startAnyway runs the start command even when the run's context is done.
func startAnyway(start string) error {
	if err := shell(context.Background(), start); err != nil {
		return fmt.Errorf("start the runtime: %w", err)
	}
	return nil
}

// shell runs command with sh -c; its error carries the command's output.
func shell(ctx context.Context, command string) error {
	out, err := exec.CommandContext(ctx, "sh", "-c", command).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", command, err, strings.TrimSpace(string(out)))
	}
	return nil
}

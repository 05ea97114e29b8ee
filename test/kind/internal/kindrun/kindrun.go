// Package kindrun holds what the kind drivers (make e2e-kind, make e2e-cluster) share: running a
// command, and removing the docker network kind makes when the run made it.
package kindrun

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Cmd runs a command and returns its combined output, trimmed; on failure the error names the
// command and holds its output.
func Cmd(ctx context.Context, name string, args ...string) (string, error) {
	c := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := c.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// Exists says whether docker knows the object name of kind ("network", "container", ...).
func Exists(ctx context.Context, kind, name string) bool {
	_, err := Cmd(ctx, "docker", kind, "inspect", name)
	return err == nil
}

// KindNetwork notes whether the docker network "kind" exists; the returned func removes it if it did
// not then and does now (kind makes it and never removes it).
func KindNetwork(ctx context.Context) (removeIfMade func() error) {
	before := Exists(ctx, "network", "kind")
	return func() error {
		if before || !Exists(ctx, "network", "kind") {
			return nil
		}
		if _, err := Cmd(ctx, "docker", "network", "rm", "kind"); err != nil {
			return fmt.Errorf("removing the docker network kind made: %w", err)
		}
		return nil
	}
}

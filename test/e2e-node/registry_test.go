package e2enode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/pleg-nri/pleg-nri/test/e2eimages"
)

// registryEnv is the registry binary's path (make e2e-node sets it); empty: no registry, and the
// pulling specs fail alike in every setup (listed in the run's log). The registry listens on loopback
// (e2eimages.StartRegistry).
const registryEnv = "E2E_NODE_REGISTRY"

// mirror pushes every built image to the registry (from the harness's containerd, with its ctr) and
// makes containerd pull each of their registries from it. It returns the registries mirrored.
func mirror(ctx context.Context, r *e2eimages.Registry, images []e2eimages.Result) ([]string, error) {
	ctr := filepath.Join(env.BinDir, "ctr")
	run := func(args ...string) error {
		cmd := exec.CommandContext(ctx, ctr, append([]string{"--address", env.Address, "--namespace", "k8s.io"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	hosts, _, err := r.Push(images, run)
	if err != nil {
		return nil, err
	}
	for _, host := range hosts {
		dir := filepath.Join(env.RegistryHostsDir(), host)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(e2eimages.HostsTOML(host, r.Addr)), 0o644); err != nil {
			return nil, err
		}
	}
	return hosts, nil
}

// unmirror removes the registry host configuration mirror wrote.
func unmirror(hosts []string) error {
	var errs []error
	for _, h := range hosts {
		errs = append(errs, os.RemoveAll(filepath.Join(env.RegistryHostsDir(), h)))
	}
	return errors.Join(errs...)
}

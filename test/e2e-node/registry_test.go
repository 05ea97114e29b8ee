package e2enode

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/e2eimages"
)

// The specs that pull (PullAlways: "Container Runtime blackbox test when running a container with a new
// image should be able to pull image", the image pull and credential specs) get a real registry: the
// distribution project's registry, built from the Go module proxy (make e2e-node builds it), on
// loopback, holding every image built offline under its own repository path. containerd's registry
// host configuration (harness.Env.RegistryHostsDir) sends each of those images' registries to it, so
// containerd pulls them over the network as it would from registry.k8s.io. What the registry does not
// hold (the private and invalid registries' images) still fails to pull, as those specs expect.

// registryEnv is the registry binary's path (make e2e-node sets it); empty: no registry, and the
// pulling specs fail alike in every setup (listed in the run's log).
const registryEnv = "E2E_NODE_REGISTRY"

// registry is a running local registry.
type registry struct {
	addr string
	cmd  *exec.Cmd
	done chan error
	log  *os.File
}

// startRegistry starts the registry binary with its storage and log in dir, on a free loopback port.
func startRegistry(ctx context.Context, bin, dir string) (*registry, error) {
	addr, err := testutil.FreeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "storage"), 0o755); err != nil {
		return nil, err
	}
	config := fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
http:
  addr: %s
`, filepath.Join(dir, "storage"), addr)
	configPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", configPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting the registry %s: %w", bin, err)
	}
	r := &registry{addr: addr, cmd: cmd, done: make(chan error, 1), log: logFile}
	go func() { r.done <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get("http://" + addr + "/v2/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return r, nil
			}
		}
		select {
		case err := <-r.done:
			logFile.Close()
			out, _ := os.ReadFile(logFile.Name())
			return nil, fmt.Errorf("the registry exited (%v): %s", err, out)
		case <-ctx.Done():
			r.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.stop()
			return nil, fmt.Errorf("the registry did not answer on %s within 30s", addr)
		}
	}
}

// stop stops the registry and waits for it.
func (r *registry) stop() {
	testutil.StopProcess(r.cmd.Process, r.done, os.Interrupt, 10*time.Second)
	r.log.Close()
}

// splitRegistry splits "host/path:tag" into the registry host and "path:tag".
func splitRegistry(name string) (host, rest string, ok bool) {
	host, rest, ok = strings.Cut(name, "/")
	if !ok || !strings.ContainsAny(host, ".:") {
		return "", "", false
	}
	return host, rest, true
}

// mirror pushes every built image to the registry (from the harness's containerd, with its ctr) and
// makes containerd pull each of their registries from it. It returns the registries mirrored.
func (r *registry) mirror(ctx context.Context, images []e2eimages.Result) ([]string, error) {
	ctr := filepath.Join(env.BinDir, "ctr")
	run := func(args ...string) error {
		cmd := exec.CommandContext(ctx, ctr, append([]string{"--address", env.Address, "--namespace", "k8s.io"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	hosts := map[string]bool{}
	for _, im := range images {
		if !im.Built {
			continue
		}
		host, rest, ok := splitRegistry(im.Name)
		if !ok {
			continue
		}
		local := r.addr + "/" + rest
		if err := run("images", "tag", "--force", im.Name, local); err != nil {
			return nil, err
		}
		err := run("images", "push", "--plain-http", local)
		if rmErr := run("images", "rm", local); err == nil {
			err = rmErr
		}
		if err != nil {
			return nil, err
		}
		hosts[host] = true
	}
	var out []string
	for host := range hosts {
		dir := filepath.Join(env.RegistryHostsDir(), host)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		toml := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "https://"+host, "http://"+r.addr)
		if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(toml), 0o644); err != nil {
			return nil, err
		}
		out = append(out, host)
	}
	sort.Strings(out)
	return out, nil
}

// unmirror removes the registry host configuration mirror wrote.
func unmirror(hosts []string) error {
	var errs []error
	for _, h := range hosts {
		errs = append(errs, os.RemoveAll(filepath.Join(env.RegistryHostsDir(), h)))
	}
	return errors.Join(errs...)
}

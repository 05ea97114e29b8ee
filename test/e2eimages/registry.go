package e2eimages

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// The specs that pull (PullAlways, the image pull and credential specs) get a real registry: the
// distribution project's registry, built from the Go module proxy (the Makefile builds it), holding
// every image built offline under its own repository path. containerd's registry host configuration
// (HostsTOML, one directory per registry host) sends each of those images' registries to it, so
// containerd pulls them over the network as it would from registry.k8s.io. What the registry does not
// hold (the private and invalid registries' images) still fails to pull, as those specs expect.

// Registry is a running registry.
type Registry struct {
	// Addr is where it listens (host:port).
	Addr string
	cmd  *exec.Cmd
	done chan error
	log  *os.File
}

// StartRegistry starts the registry binary on addr (host:port), its storage and log in dir, and waits
// until it answers.
func StartRegistry(ctx context.Context, bin, dir, addr string) (*Registry, error) {
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
	r := &Registry{Addr: addr, cmd: cmd, done: make(chan error, 1), log: logFile}
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
			r.Stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.Stop()
			return nil, fmt.Errorf("the registry did not answer on %s within 30s", addr)
		}
	}
}

// Stop stops the registry and waits for it.
func (r *Registry) Stop() {
	testutil.StopProcess(r.cmd.Process, r.done, os.Interrupt, 10*time.Second)
	r.log.Close()
}

// SplitRegistry splits "host/path:tag" into the registry host and "path:tag"; ok is false for a name
// without a registry host.
func SplitRegistry(name string) (host, rest string, ok bool) {
	host, rest, ok = strings.Cut(name, "/")
	if !ok || !strings.ContainsAny(host, ".:") {
		return "", "", false
	}
	return host, rest, true
}

// HostsTOML is containerd's registry host configuration (<config_path>/<host>/hosts.toml) that makes it
// pull and resolve host's images from the registry at addr, over plain HTTP.
func HostsTOML(host, addr string) string {
	return fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "https://"+host, "http://"+addr)
}

// Push pushes every built image that names a registry host to r under its own path, through ctr (the
// ctr of the containerd that holds the images, in their namespace: ctr("images", "push", ...)), and
// returns the registry hosts of the images pushed, sorted, for containerd's host configuration, and
// how many it pushed.
func (r *Registry) Push(images []Result, ctr func(args ...string) error) (hosts []string, pushed int, err error) {
	seen := map[string]bool{}
	for _, im := range images {
		host, rest, ok := SplitRegistry(im.Name)
		if !im.Built || !ok {
			continue
		}
		local := r.Addr + "/" + rest
		if err := ctr("images", "tag", "--force", im.Name, local); err != nil {
			return nil, pushed, err
		}
		err := ctr("images", "push", "--plain-http", local)
		if rmErr := ctr("images", "rm", local); err == nil {
			err = rmErr
		}
		if err != nil {
			return nil, pushed, err
		}
		pushed++
		if !seen[host] {
			seen[host] = true
			hosts = append(hosts, host)
		}
	}
	sort.Strings(hosts)
	return hosts, pushed, nil
}

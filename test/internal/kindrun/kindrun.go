// Package kindrun holds what the kind drivers (make e2e-kind, make e2e-cluster) and make
// test-deploy-kind share: running a command, removing the docker network kind makes when the run made
// it, and deleting a cluster (thawing a node a killed runc left frozen) with nothing of it left.
package kindrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// freezerRoot is where cgroup v1 mounts its freezer hierarchy; absent on cgroup v2.
var freezerRoot = "/sys/fs/cgroup/freezer"

// Thaw thaws every frozen cgroup v1 freezer under each of the containers ids (running node
// containers), and returns how many it thawed. On cgroup v1, runc freezes a container's cgroup while
// it sets its cgroup config; when the node container is killed in that window, runc dies first and
// leaves the cgroup FROZEN, and its frozen tasks never take the SIGKILL: docker then fails with "did
// not receive an exit event" and the node stays up. Thawing lets them die. Nothing to do on cgroup v2,
// whose frozen tasks take a fatal signal.
func Thaw(ctx context.Context, ids []string) (int, error) {
	if _, err := os.Stat(freezerRoot); err != nil {
		return 0, nil
	}
	thawed := 0
	for _, id := range ids {
		pid, err := Cmd(ctx, "docker", "inspect", "-f", "{{.State.Pid}}", id)
		if err != nil || pid == "0" {
			continue // gone, or not running: nothing frozen in it
		}
		cg, err := os.ReadFile("/proc/" + pid + "/cgroup")
		if err != nil {
			continue
		}
		dir := freezerDir(string(cg))
		if dir == "" {
			continue
		}
		n, err := thawTree(filepath.Join(freezerRoot, dir))
		thawed += n
		if err != nil {
			return thawed, fmt.Errorf("thawing container %s: %w", id, err)
		}
	}
	return thawed, nil
}

// freezerDir returns the freezer hierarchy's path in a /proc/<pid>/cgroup ("4:freezer:/docker/<id>").
func freezerDir(procCgroup string) string {
	for _, line := range strings.Split(procCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "freezer") {
			return f[2]
		}
	}
	return ""
}

// thawTree writes THAWED to every freezer.state under dir that reads FROZEN or FREEZING.
func thawTree(dir string) (int, error) {
	n := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // a cgroup removed under the walk
			}
			return err
		}
		if d.IsDir() || d.Name() != "freezer.state" {
			return nil
		}
		state, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		if s := strings.TrimSpace(string(state)); s != "FROZEN" && s != "FREEZING" {
			return nil
		}
		if err := os.WriteFile(path, []byte("THAWED"), 0o644); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		n++
		return nil
	})
	return n, err
}

// DeleteCluster deletes kind's cluster name and checks that none of its node containers or their
// volumes is left.
func DeleteCluster(ctx context.Context, kind, name, kubeconfig string) error {
	var vols, ids []string
	if out, err := Cmd(ctx, "docker", "ps", "-aq", "--filter", "label=io.x-k8s.kind.cluster="+name); err == nil {
		ids = strings.Fields(out)
		for _, id := range ids {
			v, _ := Cmd(ctx, "docker", "inspect", "-f", "{{range .Mounts}}{{if eq .Type \"volume\"}}{{.Name}} {{end}}{{end}}", id)
			vols = append(vols, strings.Fields(v)...)
		}
	}
	if err := kindDelete(ctx, kind, name, kubeconfig, ids); err != nil {
		return err
	}
	var left []string
	if out, _ := Cmd(ctx, "docker", "ps", "-aq", "--filter", "label=io.x-k8s.kind.cluster="+name); out != "" {
		left = append(left, "containers "+out)
	}
	for _, v := range vols {
		if Exists(ctx, "volume", v) {
			left = append(left, "volume "+v)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("kind delete cluster %s left behind: %s", name, strings.Join(left, ", "))
	}
	return nil
}

// kindDelete runs kind delete cluster; when that fails, it thaws what is frozen in the cluster's node
// containers ids (see Thaw) and tries once more, saying what it thawed.
func kindDelete(ctx context.Context, kind, name, kubeconfig string, ids []string) error {
	out, err := Cmd(ctx, kind, "delete", "cluster", "--name", name, "--kubeconfig", kubeconfig)
	if err == nil {
		return nil
	}
	n, terr := Thaw(ctx, ids)
	if terr != nil || n == 0 {
		return fmt.Errorf("kind delete cluster: %w\n%s", errors.Join(err, terr), out)
	}
	fmt.Printf("kind delete cluster %s failed (%v); thawed %d frozen cgroups in its nodes (runc killed while it froze one), deleting again\n", name, err, n)
	if out, err := Cmd(ctx, kind, "delete", "cluster", "--name", name, "--kubeconfig", kubeconfig); err != nil {
		return fmt.Errorf("kind delete cluster, after thawing %d cgroups: %w\n%s", n, err, out)
	}
	return nil
}

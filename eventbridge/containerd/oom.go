package containerd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	cg1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	cg2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	apitasks "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/grpc"

	"github.com/pleg-nri/pleg-nri/pleg"
)

var (
	_ pleg.OOMChecker      = (*OOMChecker)(nil)
	_ pleg.OOMCgroupReader = (*OOMChecker)(nil)
)

// OOMChecker reads a container's OOM kill count, the count containerd's CRI reads through the task's
// metrics before it reports an exit with status 137 (internal/cri/server/events.go
// oomMetricsEventOccurred): memory.oom_control's oom_kill on cgroup v1, memory.events' oom_kill on
// cgroup v2. It reads the file itself when it knows the container's cgroup and can see it (tens of
// microseconds), else asks containerd for the task's metrics (the shim reads every cgroup statistic:
// milliseconds).
type OOMChecker struct {
	client    *client.Client
	namespace string
	// cgroupRoot is where the cgroup hierarchy is mounted (/sys/fs/cgroup).
	cgroupRoot string
}

// NewOOMChecker returns an OOMChecker over conn, a connection to containerd (see dial.CRI) that its
// owner closes, for the tasks of namespace ns.
func NewOOMChecker(conn *grpc.ClientConn, ns string) (*OOMChecker, error) {
	c, err := client.NewWithConn(conn, client.WithDefaultNamespace(ns))
	if err != nil {
		return nil, fmt.Errorf("oom checker: failed to create containerd client: %w", err)
	}
	return &OOMChecker{client: c, namespace: ns, cgroupRoot: "/sys/fs/cgroup"}, nil
}

// OOMKilled reports whether the cgroup of container id (cgroupsPath, as its spec names it; empty when
// unknown) recorded an OOM kill. The error satisfies errdefs.IsNotFound when the cgroup cannot be read
// and the task is gone (containerd's exit handler deleted it).
func (o *OOMChecker) OOMKilled(ctx context.Context, id, cgroupsPath string) (bool, error) {
	if cgroupsPath != "" {
		if killed, err := cgroupOOMKilled(o.cgroupRoot, cgroupsPath); err == nil {
			return killed, nil
		}
	}
	ctx = namespaces.WithNamespace(ctx, o.namespace)
	resp, err := o.client.TaskService().Metrics(ctx, &apitasks.MetricsRequest{Filters: []string{"id==" + id}})
	if err != nil {
		return false, fmt.Errorf("task metrics of %s: %w", id, errgrpc.ToNative(err))
	}
	if len(resp.Metrics) == 0 || resp.Metrics[0].Data == nil {
		return false, fmt.Errorf("task metrics of %s: %w", id, errdefs.ErrNotFound)
	}
	m, err := typeurl.UnmarshalAny(resp.Metrics[0].Data)
	if err != nil {
		return false, fmt.Errorf("task metrics of %s: %w", id, err)
	}
	switch v := m.(type) {
	case *cg1.Metrics:
		return v.GetMemoryOomControl().GetOomKill() > 0, nil
	case *cg2.Metrics:
		return v.GetMemoryEvents().GetOomKill() > 0, nil
	}
	return false, fmt.Errorf("task metrics of %s: unexpected type %T", id, m)
}

// CgroupOOMKilled reads whether the cgroup (cgroupsPath, as a runtime spec names it) recorded an OOM
// kill from its file alone; ok is false when it cannot be read.
func (o *OOMChecker) CgroupOOMKilled(cgroupsPath string) (killed, ok bool) {
	killed, err := cgroupOOMKilled(o.cgroupRoot, cgroupsPath)
	return killed, err == nil
}

// cgroupOOMKilled reads the oom_kill count of a cgroup (cgroupsPath as a runtime spec names it) under
// the hierarchy mounted at root: memory.events on cgroup v2, memory.oom_control in the memory
// controller's hierarchy on cgroup v1.
func cgroupOOMKilled(root, cgroupsPath string) (bool, error) {
	rel, err := cgroupDir(cgroupsPath)
	if err != nil {
		return false, err
	}
	file := filepath.Join(root, rel, "memory.events")
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		file = filepath.Join(root, "memory", rel, "memory.oom_control")
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return false, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return false, fmt.Errorf("%s: %w", file, err)
			}
			return n > 0, nil
		}
	}
	return false, fmt.Errorf("%s: no oom_kill count", file)
}

// cgroupDir turns a runtime spec's cgroupsPath into a directory relative to a hierarchy's root: a
// cgroupfs path as it is, systemd's "slice:prefix:name" as runc expands it
// (kubepods-burstable-pod1.slice:cri-containerd:abc ->
// kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope).
func cgroupDir(cgroupsPath string) (string, error) {
	parts := strings.Split(cgroupsPath, ":")
	if len(parts) == 1 {
		if !filepath.IsAbs(cgroupsPath) {
			return "", fmt.Errorf("cgroupsPath %q: not absolute", cgroupsPath)
		}
		return filepath.Clean(cgroupsPath), nil
	}
	if len(parts) != 3 {
		return "", fmt.Errorf("cgroupsPath %q: want slice:prefix:name", cgroupsPath)
	}
	slice, prefix, name := parts[0], parts[1], parts[2]
	if slice == "" {
		slice = "system.slice"
	}
	dir, err := expandSlice(slice)
	if err != nil {
		return "", err
	}
	unit := name
	if !strings.HasSuffix(name, ".slice") {
		if prefix != "" {
			unit = prefix + "-" + name
		}
		unit += ".scope"
	}
	return filepath.Join(dir, unit), nil
}

// expandSlice turns a systemd slice name into its path: a-b-c.slice -> /a.slice/a-b.slice/a-b-c.slice.
func expandSlice(slice string) (string, error) {
	name, ok := strings.CutSuffix(slice, ".slice")
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("invalid systemd slice %q", slice)
	}
	if name == "-" {
		return "/", nil
	}
	var path, prefix string
	for _, c := range strings.Split(name, "-") {
		if c == "" {
			return "", errors.New("invalid systemd slice " + strconv.Quote(slice))
		}
		path += "/" + prefix + c + ".slice"
		prefix += c + "-"
	}
	return path, nil
}

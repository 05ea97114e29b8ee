package eventbridge

import (
	"context"
	"fmt"

	cg1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	cg2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	apitasks "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"

	"github.com/pleg-nri/pleg-nri/pleg"
)

var _ pleg.OOMChecker = (*OOMChecker)(nil)

// OOMChecker reads a container's OOM kill count from containerd's task metrics, the way containerd's CRI
// does before it reports an exit with status 137 (internal/cri/server/events.go oomMetricsEventOccurred):
// memory.oom_control's oom_kill on cgroup v1, memory.events' oom_kill on cgroup v2, read by the shim.
type OOMChecker struct {
	client    *client.Client
	namespace string
}

// NewOOMChecker returns an OOMChecker on the containerd at address (a path or a unix:// URL), for the
// tasks of namespace ns. The connection is made on the first call.
func NewOOMChecker(address, ns string) (*OOMChecker, error) {
	path, err := containerdSocketPath(address)
	if err != nil {
		return nil, fmt.Errorf("oom checker: %w", err)
	}
	c, err := client.New(path, client.WithDefaultNamespace(ns))
	if err != nil {
		return nil, fmt.Errorf("oom checker: failed to create containerd client for %s: %w", path, err)
	}
	return &OOMChecker{client: c, namespace: ns}, nil
}

// OOMKilled reports whether the cgroup of container id's task recorded an OOM kill. The error satisfies
// errdefs.IsNotFound when the task is gone (containerd's exit handler deleted it).
func (o *OOMChecker) OOMKilled(ctx context.Context, id string) (bool, error) {
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

// Close releases the containerd connection.
func (o *OOMChecker) Close() error { return o.client.Close() }

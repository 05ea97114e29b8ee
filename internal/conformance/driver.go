package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RunLabel is the label every pod of a run carries, with the run's id as its value: what the recorders
// select the run's events by, and what the final sweep removes.
const RunLabel = "pleg-nri.io/conformance-run"

// SyncLabel marks the pods the suite runs only to see that its subscriptions are live: their events
// are not the checks' business.
const SyncLabel = "pleg-nri.io/conformance-sync"

// driver makes the run's pods and containers through the endpoint under test and remembers how to
// remove each, newest first, as t.Cleanup does.
type driver struct {
	rt    runtimeapi.RuntimeServiceClient
	opts  *Options
	runID string

	// mu guards cleanups and ids.
	mu       sync.Mutex
	cleanups []func(context.Context) error
	// ids are the sandboxes and containers the run made: the recorders keep their events.
	ids map[string]bool
	// syncs counts the sync pods, to name them.
	syncs int
	// gone are the objects a scenario has begun to remove.
	gone map[string]bool
	// cgroupParent is the default pod config's cgroup parent (see systemdSlice); empty: the runtime's.
	cgroupParent string
}

// systemdSlice is the cgroup parent of the run's pods, by default, on a runtime that manages cgroups
// through systemd (its RuntimeConfig says so; kind's nodes, most kubeadm nodes): there the runtime
// needs a parent slice, as the kubelet gives its pods (kubepods-*.slice), and refuses to start a
// sandbox without one (runc: 'expected cgroupsPath to be of format "slice:prefix:name"'). systemd
// makes the slice when the first pod's scope asks for it. No dash: a dash would nest it.
const systemdSlice = "plegnriconformance.slice"

// defaultCgroupParent is the cgroup parent the default pod config needs on the endpoint's runtime:
// systemdSlice where its RuntimeConfig names the systemd cgroup driver, else none (a runtime that does
// not answer RuntimeConfig gets none, as before it was asked).
func defaultCgroupParent(ctx context.Context, rt runtimeapi.RuntimeServiceClient) string {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	resp, err := rt.RuntimeConfig(ctx, &runtimeapi.RuntimeConfigRequest{})
	if err == nil && resp.GetLinux().GetCgroupDriver() == runtimeapi.CgroupDriver_SYSTEMD {
		return systemdSlice
	}
	return ""
}

// removing notes that a scenario is about to remove ids: reads may find them gone from then on.
func (d *driver) removing(ids ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, id := range ids {
		d.gone[id] = true
	}
}

// isRemoving reports whether a scenario has begun to remove id.
func (d *driver) isRemoving(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gone[id]
}

func newDriver(rt runtimeapi.RuntimeServiceClient, opts *Options, runID string) *driver {
	return &driver{rt: rt, opts: opts, runID: runID, ids: map[string]bool{}, gone: map[string]bool{}}
}

// ours reports whether id is a sandbox or container the run made.
func (d *driver) ours(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ids[id]
}

func (d *driver) remember(id string, cleanup func(context.Context) error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ids[id] = true
	if cleanup != nil {
		d.cleanups = append(d.cleanups, cleanup)
	}
}

// podConfig is the config of a pod of the run named name.
func (d *driver) podConfig(name string) *runtimeapi.PodSandboxConfig {
	var cfg *runtimeapi.PodSandboxConfig
	if d.opts.PodConfig != nil {
		cfg = d.opts.PodConfig(name)
	} else {
		// On the node's network: no CNI, no address to run out of.
		cfg = &runtimeapi.PodSandboxConfig{
			Linux: &runtimeapi.LinuxPodSandboxConfig{CgroupParent: d.cgroupParent, SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
		}
	}
	uid := d.runID + "-" + name
	if cfg.Metadata == nil {
		cfg.Metadata = &runtimeapi.PodSandboxMetadata{}
	}
	cfg.Metadata.Name = "conformance-" + name
	cfg.Metadata.Uid = uid
	cfg.Metadata.Namespace = d.opts.Namespace
	if cfg.Labels == nil {
		cfg.Labels = map[string]string{}
	}
	cfg.Labels[RunLabel] = d.runID
	return cfg
}

// runPod runs a pod of the run; it is stopped and removed at the end of the run if the scenario has
// not removed it.
func (d *driver) runPod(ctx context.Context, name string) (string, *runtimeapi.PodSandboxConfig, error) {
	cfg := d.podConfig(name)
	ctx, cancel := callCtx(ctx)
	defer cancel()
	resp, err := d.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return "", nil, fmt.Errorf("failed to run pod %s: %w", name, err)
	}
	id := resp.PodSandboxId
	d.remember(id, func(ctx context.Context) error { return removePod(ctx, d.rt, id) })
	return id, cfg, nil
}

// runSyncPod runs a pod labeled SyncLabel, not counted as one of the run's objects, and returns its
// id; it is removed at the end of the run if the caller does not remove it first.
func (d *driver) runSyncPod(ctx context.Context) (string, error) {
	d.mu.Lock()
	d.syncs++
	name := fmt.Sprintf("sync-%d", d.syncs)
	d.mu.Unlock()
	cfg := d.podConfig(name)
	cfg.Labels[SyncLabel] = "true"
	ctx, cancel := callCtx(ctx)
	defer cancel()
	resp, err := d.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return "", fmt.Errorf("failed to run pod %s: %w", name, err)
	}
	id := resp.PodSandboxId
	d.mu.Lock()
	d.cleanups = append(d.cleanups, func(ctx context.Context) error { return removePod(ctx, d.rt, id) })
	d.mu.Unlock()
	return id, nil
}

// containerConfig is a container of the run running command in the image under test.
func (d *driver) containerConfig(name string, command ...string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: d.opts.Image},
		Command:  command,
		LogPath:  name + ".log",
		Linux:    &runtimeapi.LinuxContainerConfig{},
	}
}

// create creates a container in a pod of the run (RemovePodSandbox removes it).
func (d *driver) create(ctx context.Context, podID string, podCfg *runtimeapi.PodSandboxConfig, cfg *runtimeapi.ContainerConfig) (string, error) {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	resp, err := d.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: podCfg})
	if err != nil {
		return "", fmt.Errorf("failed to create container %s: %w", cfg.GetMetadata().GetName(), err)
	}
	d.remember(resp.ContainerId, nil)
	return resp.ContainerId, nil
}

// waitExited polls the container's status until it says EXITED.
func (d *driver) waitExited(ctx context.Context, id string, timeout time.Duration) (*runtimeapi.ContainerStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := d.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err == nil && resp.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_EXITED {
			return resp.Status, nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("state %s", resp.GetStatus().GetState())
			}
			return nil, fmt.Errorf("container %s did not exit within %s: %w", short(id), timeout, err)
		case <-tick.C:
		}
	}
}

// cleanup runs every cleanup, newest first, then removes any pod still labeled with the run (one a
// scenario made but whose id it never got back, say). ctx must not be the run's (it may be cancelled).
func (d *driver) cleanup(ctx context.Context) error {
	d.mu.Lock()
	cleanups := d.cleanups
	d.cleanups = nil
	d.mu.Unlock()
	var errs []error
	for i := len(cleanups) - 1; i >= 0; i-- {
		errs = append(errs, cleanups[i](ctx))
	}
	lctx, cancel := callCtx(ctx)
	defer cancel()
	resp, err := d.rt.ListPodSandbox(lctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{RunLabel: d.runID}}})
	if err != nil {
		errs = append(errs, fmt.Errorf("failed to list the pods of run %s: %w", d.runID, err))
	}
	for _, p := range resp.GetItems() {
		errs = append(errs, removePod(ctx, d.rt, p.Id))
	}
	return errors.Join(errs...)
}

// removePod stops and removes a pod; a pod already gone is no error. Each call is bounded (callCtx).
// A removal that fails is tried again, after another stop, a few times: containerd can answer
// StopPodSandbox before its containers are seen stopped, and then refuses RemovePodSandbox ("container
// is still running, to stop first"; seen once after the pause process was killed).
func removePod(ctx context.Context, rt runtimeapi.RuntimeServiceClient, id string) error {
	var err error
	for attempt := 0; attempt < removeAttempts; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(removeRetryWait):
			case <-ctx.Done():
				return fmt.Errorf("failed to remove pod %s: %w", short(id), err)
			}
		}
		if err = stopAndRemove(ctx, rt, id); err == nil || status.Code(err) == codes.DeadlineExceeded {
			// A call that timed out is a runtime that hangs: no use waiting for it again.
			return err
		}
	}
	return err
}

const (
	removeAttempts  = 5
	removeRetryWait = 500 * time.Millisecond
)

func stopAndRemove(ctx context.Context, rt runtimeapi.RuntimeServiceClient, id string) error {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil && !isNotFound(err) {
		return fmt.Errorf("failed to stop pod %s: %w", short(id), err)
	}
	if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil && !isNotFound(err) {
		return fmt.Errorf("failed to remove pod %s: %w", short(id), err)
	}
	return nil
}

// short is an id's first 12 characters, as crictl prints them.
func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

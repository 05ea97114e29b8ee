package containerdit

import (
	"context"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// cri is a CRI client for one test, on containerd's socket or on pleg-nri's.
type cri struct {
	t  *testing.T
	rt runtimeapi.RuntimeServiceClient
	im runtimeapi.ImageServiceClient
}

// newCRI dials the CRI endpoint at socket for the test.
func newCRI(t *testing.T, socket string) *cri {
	t.Helper()
	conn, err := harness.DialUnix(socket)
	if err != nil {
		t.Fatalf("dial %s: %v", socket, err)
	}
	t.Cleanup(func() { conn.Close() })
	return &cri{t: t, rt: runtimeapi.NewRuntimeServiceClient(conn), im: runtimeapi.NewImageServiceClient(conn)}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// runPod runs a pod and makes sure it is stopped and removed when the test ends.
func (c *cri) runPod(name string) (string, *runtimeapi.PodSandboxConfig) {
	c.t.Helper()
	cfg := env.PodConfig(name)
	resp, err := c.rt.RunPodSandbox(ctx(c.t), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		c.t.Fatalf("RunPodSandbox %s: %v", name, err)
	}
	id := resp.PodSandboxId
	c.t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = c.rt.StopPodSandbox(cctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
		_, _ = c.rt.RemovePodSandbox(cctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
	})
	return id, cfg
}

// create creates a container in a pod.
func (c *cri) create(podID string, podCfg *runtimeapi.PodSandboxConfig, cfg *runtimeapi.ContainerConfig) string {
	c.t.Helper()
	resp, err := c.rt.CreateContainer(ctx(c.t), &runtimeapi.CreateContainerRequest{
		PodSandboxId: podID, Config: cfg, SandboxConfig: podCfg,
	})
	if err != nil {
		c.t.Fatalf("CreateContainer %s: %v", cfg.Metadata.Name, err)
	}
	return resp.ContainerId
}

func (c *cri) start(id string) {
	c.t.Helper()
	if _, err := c.rt.StartContainer(ctx(c.t), &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		c.t.Fatalf("StartContainer %s: %v", short(id), err)
	}
}

func (c *cri) stop(id string, timeout int64) {
	c.t.Helper()
	if _, err := c.rt.StopContainer(ctx(c.t), &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: timeout}); err != nil {
		c.t.Fatalf("StopContainer %s: %v", short(id), err)
	}
}

func (c *cri) remove(id string) {
	c.t.Helper()
	if _, err := c.rt.RemoveContainer(ctx(c.t), &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		c.t.Fatalf("RemoveContainer %s: %v", short(id), err)
	}
}

func (c *cri) stopPod(id string) {
	c.t.Helper()
	if _, err := c.rt.StopPodSandbox(ctx(c.t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		c.t.Fatalf("StopPodSandbox %s: %v", short(id), err)
	}
}

func (c *cri) removePod(id string) {
	c.t.Helper()
	if _, err := c.rt.RemovePodSandbox(ctx(c.t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		c.t.Fatalf("RemovePodSandbox %s: %v", short(id), err)
	}
}

func (c *cri) status(id string) *runtimeapi.ContainerStatus {
	c.t.Helper()
	resp, err := c.rt.ContainerStatus(ctx(c.t), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		c.t.Fatalf("ContainerStatus %s: %v", short(id), err)
	}
	return resp.Status
}

func (c *cri) podStatus(id string) *runtimeapi.PodSandboxStatus {
	c.t.Helper()
	resp, err := c.rt.PodSandboxStatus(ctx(c.t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil {
		c.t.Fatalf("PodSandboxStatus %s: %v", short(id), err)
	}
	return resp.Status
}

// waitState waits until the container's CRI state is want.
func (c *cri) waitState(id string, want runtimeapi.ContainerState) *runtimeapi.ContainerStatus {
	c.t.Helper()
	var st *runtimeapi.ContainerStatus
	err := harness.WaitFor(context.Background(), 20*time.Second, short(id)+" "+want.String(), func() (bool, error) {
		resp, err := c.rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return false, err
		}
		st = resp.Status
		return st.State == want, nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return st
}

// containerConfig is harness.ContainerConfig.
func containerConfig(name, script string) *runtimeapi.ContainerConfig {
	return harness.ContainerConfig(name, script)
}

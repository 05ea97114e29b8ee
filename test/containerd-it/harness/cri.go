package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// PodNamespace is the Kubernetes namespace of every test pod.
const PodNamespace = "plegit"

// PodConfig returns a sandbox config for a test pod named name: a fresh uid, a log directory in the
// environment, and the environment's cgroup parent (so teardown finds every cgroup).
func (e *Env) PodConfig(name string) *runtimeapi.PodSandboxConfig {
	uid := randomHex(8)
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Uid: uid, Namespace: PodNamespace},
		Hostname:     name,
		LogDirectory: filepath.Join(e.Dir, "pods", PodNamespace+"_"+name+"_"+uid),
		Labels:       map[string]string{"io.kubernetes.pod.name": name, "plegit": "true"},
		Annotations:  map[string]string{"plegit/test": name},
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: e.CgroupParent + "/pod" + uid,
		},
	}
}

// ContainerConfig returns a busybox container config that runs `sh -c script`.
func ContainerConfig(name, script string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata:    &runtimeapi.ContainerMetadata{Name: name},
		Image:       &runtimeapi.ImageSpec{Image: BusyboxImage},
		Command:     []string{"sh", "-c", script},
		LogPath:     name + ".log",
		Labels:      map[string]string{"io.kubernetes.container.name": name},
		Annotations: map[string]string{"plegit/container": name},
		Linux:       &runtimeapi.LinuxContainerConfig{},
	}
}

// writeCrictlConfigs writes pod.json and container.json for using the environment by hand with crictl.
func (e *Env) writeCrictlConfigs() error {
	dir := filepath.Join(e.Dir, "crictl")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	crictlYAML := fmt.Sprintf("runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 10\n", e.Address, e.Address)
	if err := os.WriteFile(filepath.Join(dir, "crictl.yaml"), []byte(crictlYAML), 0o644); err != nil {
		return err
	}
	pod := e.PodConfig("by-hand")
	ctr := ContainerConfig("sleeper", "echo hello; sleep 3600")
	for name, v := range map[string]any{"pod.json": pod, "container.json": ctr} {
		data, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// WaitInterval is how long WaitFor waits between two calls of its condition: they ask containerd, a
// kubelet or pleg-nri.
const WaitInterval = 20 * time.Millisecond

// WaitFor is testutil.PollEvery at WaitInterval: it calls cond until it returns true, or until timeout
// or ctx ends (the error then names what and holds cond's last error), or until cond returns
// testutil.Stop(err).
func WaitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	return testutil.PollEvery(ctx, timeout, WaitInterval, what, cond)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

package kubelete2e

// Issue 11 on a real kubelet: what the kubelet shows in /pods after an in-place resize and after an OOM
// kill, with pleg-nri's events as its only source between its 300 s relists.
//
// KUBELET 1.35/1.36 MEANING: these kubelets write each event's pod status into their pod cache
// (evented.go: cache.Set(uid, status, nil, created_at)) and do not read the runtime again until the next
// relist or event: a stale field in one event stays in /pods for minutes. That is the path these tests
// are about. A 1.37 kubelet turns a STOPPED into a relist through the CRI (through pleg-nri's proxy):
// the claims must hold there too, but the run does not exercise the cache-write path, and the tests say
// so in their log (kubeletMeaning).

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
)

// kubeletMeaning logs, loudly, which meaning of EventedPLEG the run exercises.
func kubeletMeaning(t *testing.T) {
	t.Helper()
	switch minor := kubeletMinor; {
	case minor == 35 || minor == 36:
		t.Logf("kubelet v1.%d: events write the pod cache (the 1.35/1.36 meaning this test is about)", minor)
	default:
		t.Logf("WARNING: kubelet v1.%d does NOT write events into its pod cache the way 1.35/1.36 do: this run checks "+
			"the claims, not the 1.35/1.36 cache-write path they are about; run with KUBELET_VERSION=v1.36.3 for that", minor)
	}
}

// rawPod is a static pod manifest written as is, for what kubelet.Pod does not express (a fixed uid,
// CPU resources).
func writeRawPod(t *testing.T, k *kubelet.Kubelet, name string, pod map[string]any) {
	t.Helper()
	data, err := json.MarshalIndent(pod, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(k.ManifestDir, "."+name+".json.tmp")
	if err := os.WriteFile(tmp, data, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.ManifestDir, name+".json")); err != nil {
		t.Fatal(err)
	}
}

// resizePod is a restartPolicy OnFailure pod with a fixed uid (so that a changed manifest is an update of
// the same pod, which the kubelet resizes in place, not a new pod): "app" runs with the given CPU and
// memory limits, "side" exits 0 once a file named exit appears in the pod's emptyDir, and is not
// restarted (a restart would make a 1.36 kubelet relist the pod, which hides a stale event).
func resizePod(uid, cpu, memory string) map[string]any {
	return map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata": map[string]any{"name": "resize", "namespace": kubelet.Namespace, "uid": uid,
			"labels": map[string]string{"plegkube": "true"}},
		"spec": map[string]any{
			"restartPolicy":                 "OnFailure",
			"terminationGracePeriodSeconds": 1,
			"enableServiceLinks":            false,
			"containers": []any{
				map[string]any{
					"name": "app", "image": harness.BusyboxImage, "imagePullPolicy": "Never",
					"command": []string{"sh", "-c", "exec sleep 3600"},
					"resources": map[string]any{
						"requests": map[string]string{"cpu": "100m", "memory": "64Mi"},
						"limits":   map[string]string{"cpu": cpu, "memory": memory},
					},
				},
				map[string]any{
					"name": "side", "image": harness.BusyboxImage, "imagePullPolicy": "Never",
					"command":      []string{"sh", "-c", `while [ ! -e /state/exit ]; do sleep 0.05; done; exit 0`},
					"volumeMounts": []any{map[string]string{"name": "state", "mountPath": kubelet.StateMount}},
				},
			},
			"volumes": []any{map[string]any{"name": "state", "emptyDir": map[string]any{}}},
		},
	}
}

// apiPod is the part of a v1 Pod these tests read from /pods, beyond kubelet.PodStatus.
type apiPod struct {
	Metadata struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"metadata"`
	Status struct {
		ContainerStatuses []struct {
			Name      string `json:"name"`
			Resources *struct {
				Limits map[string]string `json:"limits"`
			} `json:"resources"`
			State     kubelet.ContainerState `json:"state"`
			LastState kubelet.ContainerState `json:"lastState"`
		} `json:"containerStatuses"`
	} `json:"status"`
}

// apiPods reads the kubelet's /pods.
func apiPods(k *kubelet.Kubelet) ([]apiPod, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/pods", k.ReadOnlyPort))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var list struct {
		Items []apiPod `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("/pods: %w", err)
	}
	return list.Items, nil
}

// limitsOf returns the limits /pods shows for a container of the pod with that uid ("" when none).
func limitsOf(k *kubelet.Kubelet, uid, ctr string) (cpu, memory string, err error) {
	pods, err := apiPods(k)
	if err != nil {
		return "", "", err
	}
	for _, p := range pods {
		if p.Metadata.UID != uid {
			continue
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.Name == ctr && c.Resources != nil {
				return c.Resources.Limits["cpu"], c.Resources.Limits["memory"], nil
			}
		}
	}
	return "", "", nil
}

// TestResizeInPods (issue 11, item 1): an in-place resize of a running container (the kubelet's own
// UpdateContainerResources through pleg-nri's endpoint), then a sibling's exit: /pods keeps showing the
// new resources. Before the fix, the sibling's STOPPED carried the resized container's old resources,
// and a 1.35/1.36 kubelet wrote them back into its cache, where they stayed until its next relist.
func TestResizeInPods(t *testing.T) {
	kubeletMeaning(t)
	n := startNode(t, setupEventedPlegNRI)
	const uid = "11111111-2222-4333-8444-000000000011"
	writeRawPod(t, n.k, "resize", resizePod(uid, "200m", "128Mi"))
	p := n.waitPod("resize", "running", running)
	waitLimits := func(cpu, memory string) {
		t.Helper()
		var gotCPU, gotMem string
		err := harness.WaitFor(context.Background(), podWaitTimeout, "/pods shows app's limits "+cpu+" "+memory, func() (bool, error) {
			var err error
			gotCPU, gotMem, err = limitsOf(n.k, uid, "app")
			return gotCPU == cpu && gotMem == memory, err
		})
		if err != nil {
			t.Fatalf("%v (last: cpu %q memory %q)", err, gotCPU, gotMem)
		}
	}
	waitLimits("200m", "128Mi")

	writeRawPod(t, n.k, "resize", resizePod(uid, "300m", "96Mi"))
	waitLimits("300m", "96Mi")
	appID := strings.TrimPrefix(p.Container("app").ContainerID, "containerd://")
	if st := n.containerStatus(appID); st.GetResources().GetLinux().GetMemoryLimitInBytes() != 96<<20 {
		t.Fatalf("containerd's status of app after the resize: %v", st.GetResources())
	}

	n.triggerExit(p, n.containerPID(strings.TrimPrefix(p.Container("side").ContainerID, "containerd://")))
	n.waitPod("resize", "side completed", func(p *kubelet.PodStatus) (bool, error) {
		c := p.Container("side")
		return c != nil && c.State.Terminated != nil, nil
	})
	// The kubelet has synced the pod on the sibling's STOPPED: what it shows now came from that event.
	// Watch it for a while: it must not go back to the old limits.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		cpu, mem, err := limitsOf(n.k, uid, "app")
		if err != nil {
			t.Fatal(err)
		}
		if cpu != "300m" || mem != "96Mi" {
			t.Fatalf("/pods shows app's limits cpu %q memory %q after its sibling's exit, want 300m 96Mi (the resize's)", cpu, mem)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// oomPod is a restartPolicy Never pod whose container is OOM-killed under a 32 MiB limit: its main
// process, or (child) a child process after which the main process exits 137 a second later.
func oomPod(name string, child bool) kubelet.Pod {
	script := "exec tail /dev/zero"
	if child {
		script = "tail /dev/zero; sleep 1; exit 137"
	}
	return kubelet.Pod{Name: name, RestartPolicy: "Never", Containers: []kubelet.Container{
		{Name: "hog", Script: script, MemoryLimit: "32Mi"},
	}}
}

// TestOOMKilledOnlyInPods (issue 11, item 3): a restartPolicy Never pod's container OOM-killed (its main
// process; a child, with /tasks/oom well before the exit): /pods, polled all along, shows the container
// terminated with reason OOMKilled and never with Error (a controller watching the pod would act on it).
// With task events, /tasks/oom comes before the exit in the runs seen here; "without task events"
// runs pleg-nri on another containerd namespace, so the exit comes from NRI alone, with no reason.
func TestOOMKilledOnlyInPods(t *testing.T) {
	kubeletMeaning(t)
	for _, tc := range []struct {
		name  string
		flags []string
	}{{"with task events", nil}, {"without task events", []string{"--containerd-namespace=plegkube-none"}}} {
		t.Run(tc.name, func(t *testing.T) { oomKilledOnlyInPods(t, tc.flags) })
	}
}

func oomKilledOnlyInPods(t *testing.T, flags []string) {
	n := startNode(t, setupEventedPlegNRI, nodeOptions{plegNRIFlags: flags})
	for _, child := range []bool{false, true} {
		name := "oom-main"
		if child {
			name = "oom-child"
		}
		t.Run(name, func(t *testing.T) {
			if err := n.k.WritePod(oomPod(name, child)); err != nil {
				t.Fatal(err)
			}
			var seen []string
			var last *kubelet.PodStatus
			deadline := time.Now().Add(podWaitTimeout)
			terminatedAt := time.Time{}
			for time.Now().Before(deadline) && (terminatedAt.IsZero() || time.Since(terminatedAt) < 3*time.Second) {
				p, err := n.k.Pod(name)
				if err != nil {
					t.Fatal(err)
				}
				if c := p.Container("hog"); c != nil && c.State.Terminated != nil {
					s := fmt.Sprintf("%s/%d", c.State.Terminated.Reason, c.State.Terminated.ExitCode)
					if len(seen) == 0 || seen[len(seen)-1] != s {
						seen = append(seen, s)
					}
					if terminatedAt.IsZero() {
						terminatedAt = time.Now()
					}
				}
				last = p
				time.Sleep(10 * time.Millisecond)
			}
			if terminatedAt.IsZero() {
				t.Fatalf("the container never terminated: %s", describePod(last))
			}
			if !slices.Equal(seen, []string{"OOMKilled/137"}) {
				t.Errorf("/pods showed the OOM-killed container as %v, want only OOMKilled/137", seen)
			}
			for _, st := range n.containers(last.Metadata.UID) {
				if st.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED && st.GetReason() != "OOMKilled" {
					t.Errorf("containerd says reason %q exit %d: the container was not OOM-killed, the scenario is void", st.GetReason(), st.GetExitCode())
				}
			}
			if err := n.k.RemovePod(name); err != nil {
				t.Fatal(err)
			}
		})
	}
}

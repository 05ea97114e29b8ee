package kubelete2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
)

// racesEnv runs the tests of the kubelet's own races (make kubelet-races).
const racesEnv = "PLEG_NRI_KUBELET_RACES"

// staticPodRounds is how many times TestStaticPodRestarts rewrites the control plane's manifests.
const staticPodRounds = 20

// controlPlane are kubeadm's static pods: one container each, on the host's network.
var controlPlane = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// TestStaticPodRestarts measures a race of the kubelet itself on 1.35 and 1.36 with EventedPLEG: a
// static pod that gets a second container, because the kubelet acts on a CREATED event it sees before
// the STARTED (k/k #123087, #121349, #122763, #127086; 1.37 removed the path). kubeadm-style
// control-plane manifests (four pods, one container each, host network) are rewritten staticPodRounds
// times, as an upgrade does: each rewrite is a new pod that replaces the old one. A watcher lists
// containerd's containers every 50 ms and counts, per pod and container name, the containers the
// kubelet created beyond the first. pleg-nri must give the kubelet no reason for one (0); containerd's
// own stream's count is logged beside it.
//
// It takes minutes per setup (each rewrite waits for containerd to stop the old pods), so it runs under
// make kubelet-races (racesEnv), on the kubelets that have the race.
func TestStaticPodRestarts(t *testing.T) {
	if os.Getenv(racesEnv) != "1" {
		t.Skipf("NOT RUN: the kubelet's own races are measured by make kubelet-races (%s=1), minutes per setup", racesEnv)
	}
	if !onlyFor(t, false, "1.37 removed the kubelet's cache-writing event path and with it this race") {
		return
	}
	for _, s := range []setup{setupEventedDirect, setupEventedPlegNRI} {
		t.Run(s.Name, func(t *testing.T) {
			n := startNode(t, s, nodeOptions{kubeletDuplicates: true})
			seen := watchCreated(t, n.cri)
			uids := map[string]string{}
			start := time.Now()
			for round := range staticPodRounds {
				for _, name := range controlPlane {
					if err := n.k.WritePod(kubelet.Pod{Name: name, HostNetwork: true, Containers: []kubelet.Container{
						// It exits on SIGTERM, as a control-plane binary does.
						{Name: name, Script: fmt.Sprintf("trap 'exit 0' TERM; sleep %d & wait", 3600+round)}}}); err != nil {
						t.Fatal(err)
					}
				}
				for _, name := range controlPlane {
					p := n.waitPod(name, fmt.Sprintf("rewrite %d running", round), func(p *kubelet.PodStatus) (bool, error) {
						ok, err := running(p)
						return ok && p.Metadata.UID != uids[name], err
					})
					uids[name] = p.Metadata.UID
				}
			}
			took := time.Since(start)
			extra, where := seen.extra()
			summary := fmt.Sprintf("%d rewrites of %d static pods in %s: %d containers created beyond one per pod and name%s",
				staticPodRounds, len(controlPlane), took.Round(time.Millisecond), extra, where)
			if !s.PlegNRI {
				t.Logf("containerd's stream (kubelet %s): %s", kubeletVersion, summary)
				return
			}
			t.Logf("kubelet %s: %s", kubeletVersion, summary)
			if extra > 0 {
				t.Errorf("the kubelet created second containers on pleg-nri: %s", summary)
			}
		})
	}
}

// createdWatcher records every container containerd lists, per pod uid and container name.
type createdWatcher struct {
	mu  sync.Mutex
	ids map[string]map[string]bool
}

// watchCreated lists containerd's containers every 50 ms for as long as the test runs.
func watchCreated(t *testing.T, cri runtimeapi.RuntimeServiceClient) *createdWatcher {
	w := &createdWatcher{ids: map[string]map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			list, err := cri.ListContainers(cctx, &runtimeapi.ListContainersRequest{})
			ccancel()
			if err == nil {
				w.mu.Lock()
				for _, c := range list.GetContainers() {
					key := c.Labels[podUIDLabel] + "/" + c.Labels[containerNameLabel]
					if w.ids[key] == nil {
						w.ids[key] = map[string]bool{}
					}
					w.ids[key][c.Id] = true
				}
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(containerdWaitPeriod):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return w
}

// extra counts the containers beyond the first of each pod and name, and says where.
func (w *createdWatcher) extra() (int, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	var where []string
	for key, ids := range w.ids {
		if len(ids) > 1 {
			n += len(ids) - 1
			where = append(where, fmt.Sprintf("%s: %d", key, len(ids)))
		}
	}
	if n == 0 {
		return 0, ""
	}
	sort.Strings(where)
	return n, " (" + strings.Join(where, "; ") + ")"
}

package kubelete2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
)

// crashTimes is how often the crasher container exits 1 before it settles.
const crashTimes = 3

// exitingPods are pods whose containers exit: "crasher" exits 1 crashTimes times (counted in the
// pod's emptyDir), then runs; "oom" eats memory past its 32Mi limit on its first run (tail buffers
// /dev/zero, a line without end), then runs; "once", restartPolicy Never, fails with exit code 3.
func exitingPods() []kubelet.Pod {
	return []kubelet.Pod{
		{Name: "crasher", Containers: []kubelet.Container{{Name: "crash", State: true, Script: fmt.Sprintf(
			`n=$(cat /state/n 2>/dev/null || echo 0); [ "$n" -ge %d ] && exec sleep 3600; echo $((n+1)) >/state/n; sleep 0.3; exit 1`,
			crashTimes)}}},
		{Name: "oom", Containers: []kubelet.Container{{Name: "hog", State: true, MemoryLimit: "32Mi",
			Script: `[ -e /state/ran ] && exec sleep 3600; touch /state/ran; exec tail /dev/zero`}}},
		{Name: "once", RestartPolicy: "Never", Containers: []kubelet.Container{{Name: "fail", Script: "sleep 0.3; exit 3"}}},
	}
}

// TestKubeletOnPlegNRI: a kubelet with EventedPLEG on pleg-nri (setup 3) runs static pods, restarts a
// crashing container with the right restart count and last state, reports an OOM kill as OOMKilled,
// a failed run-once pod as Failed, stops a pod whose manifest went away, never runs two containers of
// the same name in a pod, and gets all that from the event stream without ever falling back to
// relisting.
func TestKubeletOnPlegNRI(t *testing.T) {
	n := startNode(t, setupEventedPlegNRI)
	before := n.plegMetrics()
	pods := append([]kubelet.Pod{
		{Name: "sleepers", Containers: []kubelet.Container{
			{Name: "a", Script: "exec sleep 3600"}, {Name: "b", Script: "exec sleep 3600"}}},
		{Name: "hostnet", HostNetwork: true, Containers: []kubelet.Container{{Name: "a", Script: "exec sleep 3600"}}},
	}, exitingPods()...)
	for _, p := range pods {
		if err := n.k.WritePod(p); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("pods run", func(t *testing.T) {
		for _, name := range []string{"sleepers", "hostnet"} {
			p := n.waitPod(name, "running", running)
			if name == "sleepers" && p.Status.PodIP == "" {
				t.Errorf("pod %s on the CNI network has no IP: %s", name, describePod(p))
			}
			// What the kubelet reports is what containerd runs.
			for _, c := range p.Status.ContainerStatuses {
				id := strings.TrimPrefix(c.ContainerID, "containerd://")
				st := n.containerStatus(id)
				if st.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING || st.GetMetadata().GetName() != c.Name {
					t.Errorf("the kubelet says container %s (%s) of %s runs; containerd says %s %s", c.Name, id, name,
						st.GetMetadata().GetName(), st.GetState())
				}
			}
		}
	})

	t.Run("crash restarts", func(t *testing.T) {
		p := n.waitPod("crasher", fmt.Sprintf("container crash restarted %d times and running", crashTimes),
			restartedTo("crash", crashTimes))
		c := p.Container("crash")
		if last := c.LastState.Terminated; last.ExitCode != 1 || last.Reason != "Error" {
			t.Errorf("last state of crash: exit code %d reason %q, want 1 Error", last.ExitCode, last.Reason)
		}
		// containerd agrees: the running container is attempt crashTimes, the ones before it exited 1.
		ctrs := n.containers(p.Metadata.UID)
		if len(ctrs) == 0 {
			t.Fatalf("containerd has no container of pod %s", p.Metadata.UID)
		}
		latest := ctrs[len(ctrs)-1]
		if latest.GetMetadata().GetAttempt() != crashTimes || latest.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("containerd's latest crash container is attempt %d %s, want attempt %d running",
				latest.GetMetadata().GetAttempt(), latest.GetState(), crashTimes)
		}
		for _, st := range ctrs[:len(ctrs)-1] {
			if st.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
				// The kubelet can restart a container before containerd has handled its exit (pleg-nri
				// reports exits at once, and answers reads with them): wait for containerd's record.
				st = n.waitExited(st.GetId())
			}
			if st.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED || st.GetExitCode() != 1 {
				t.Errorf("containerd: attempt %d of crash is %s with exit code %d, want exited 1",
					st.GetMetadata().GetAttempt(), st.GetState(), st.GetExitCode())
			}
		}
	})

	t.Run("OOM killed", func(t *testing.T) {
		p := n.waitPod("oom", "container hog restarted once and running", restartedTo("hog", 1))
		if last := p.Container("hog").LastState.Terminated; last.Reason != "OOMKilled" || last.ExitCode != 137 {
			t.Errorf("last state of hog: exit code %d reason %q, want 137 OOMKilled", last.ExitCode, last.Reason)
		}
	})

	t.Run("run once and fail", func(t *testing.T) {
		p := n.waitPod("once", "phase Failed", func(p *kubelet.PodStatus) (bool, error) {
			return p.Status.Phase == "Failed", nil
		})
		c := p.Container("fail")
		if c == nil || c.State.Terminated == nil || c.State.Terminated.ExitCode != 3 || c.RestartCount != 0 {
			t.Errorf("want container fail terminated with exit code 3 and never restarted: %s", describePod(p))
		}
	})

	t.Run("manifest removal stops the pod", func(t *testing.T) {
		p := n.waitPod("sleepers", "running", running)
		if err := n.k.RemovePod("sleepers"); err != nil {
			t.Fatal(err)
		}
		// The kubelet drops the pod and stops it at once; it removes the stopped sandbox at its next
		// container garbage collection (every minute), which this test does not wait for.
		n.waitPodStopped("sleepers", p.Metadata.UID)
	})

	t.Run("stream consumed", func(t *testing.T) {
		now := n.plegMetrics()
		t.Logf("kubelet: %s", now)
		n.checkConsumingStream(before, now)
		// At least the crasher's, the OOM kill's and the failed pod's exits came as events.
		if now.StoppedEvents < crashTimes+2 {
			t.Errorf("the kubelet logged %d %q lines, want at least %d", now.StoppedEvents, stoppedEventLog(), crashTimes+2)
		}
		if onlyFor(t, true, "only 1.37 turns each STOPPED into a targeted relist of its pod") {
			if d := now.PodRelists - before.PodRelists; d < crashTimes+2 {
				t.Errorf("the kubelet made %g targeted pod relists, want at least one per exit (%d)", d, crashTimes+2)
			}
		}
		if subs, err := n.p.Metric("pleg_nri_subscribers"); err != nil || subs < 1 {
			t.Errorf("pleg-nri reports %g subscribers (%v), want the kubelet's", subs, err)
		}
	})

	// Issue 58: with imageServiceEndpoint at containerd's socket (as pleg-nri's kubelet switch sets it),
	// none of the kubelet's image calls (an ImageStatus before each of the containers it created above)
	// crosses pleg-nri's front, while its runtime calls do.
	t.Run("image calls go to containerd", func(t *testing.T) {
		images, err := n.p.Metric("pleg_nri_forwarded_call_duration_seconds_count", "ImageService/")
		if err != nil {
			t.Fatal(err)
		}
		runtime, err := n.p.Metric("pleg_nri_forwarded_call_duration_seconds_count", "RuntimeService/CreateContainer")
		if err != nil {
			t.Fatal(err)
		}
		if images != 0 || runtime == 0 {
			t.Errorf("pleg-nri forwarded %g image calls and %g CreateContainer calls, want none and some", images, runtime)
		}
	})
}

// containerStatus asks containerd for a container's status.
func (n *node) containerStatus(id string) *runtimeapi.ContainerStatus {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := n.cri.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		n.t.Fatalf("containerd ContainerStatus %s: %v", id, err)
	}
	return resp.GetStatus()
}

// containerPID returns the pid of a running container's process, from containerd's verbose status.
func (n *node) containerPID(id string) int {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pid := containerdPID(ctx, n.cri, id)
	if pid == 0 {
		n.t.Fatalf("no pid in containerd's verbose status of %s", id)
	}
	return pid
}

// sandboxes lists containerd's pod sandboxes of the pod with that uid.
func (n *node) sandboxes(uid string) []*runtimeapi.PodSandbox {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := n.cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{podUIDLabel: uid}}})
	if err != nil {
		n.t.Fatalf("containerd ListPodSandbox: %v", err)
	}
	return resp.GetItems()
}

// triggerPod is a pod whose container "waiter" exits 7 once a file named exit appears in the pod's
// emptyDir (the test drops it from the host), and runs on after its restart; "steady" just runs.
func triggerPod(name string) kubelet.Pod {
	return kubelet.Pod{Name: name, Containers: []kubelet.Container{
		{Name: "waiter", State: true, Script: `[ -e /state/done ] && exec sleep 3600
while [ ! -e /state/exit ]; do sleep 0.05; done; touch /state/done; exit 7`},
		{Name: "steady", Script: "exec sleep 3600"},
	}}
}

// waiterPID returns the pid of a triggerPod's waiter process.
func (n *node) waiterPID(p *kubelet.PodStatus) int {
	n.t.Helper()
	return n.containerPID(strings.TrimPrefix(p.Container("waiter").ContainerID, "containerd://"))
}

// triggerExit makes the waiter of a triggerPod, whose process is pid, exit and waits until the
// process is gone.
func (n *node) triggerExit(p *kubelet.PodStatus, pid int) {
	n.t.Helper()
	if err := os.WriteFile(filepath.Join(n.emptyDir(p.Metadata.UID), "exit"), nil, 0o644); err != nil {
		n.t.Fatal(err)
	}
	if err := testutil.WaitGone(context.Background(), pid, 20*time.Second); err != nil {
		n.t.Fatal(err)
	}
}

// TestContainerdRestart restarts containerd under a running kubelet, with a container exiting while
// containerd is down, in setup 2 and in setup 3. With pleg-nri (setup 3) the kubelet's event stream
// survives: no connection error, no relisting, and the exit in the gap arrives as an event and the
// container is restarted. With containerd's own stream (setup 2) the stream breaks; the test records
// what the kubelet does then (it falls back to relisting for good) and requires that the stream did
// break there, so the difference is shown by the same run.
func TestContainerdRestart(t *testing.T) {
	for _, s := range []setup{setupEventedDirect, setupEventedPlegNRI} {
		t.Run(s.Name, func(t *testing.T) {
			n := startNode(t, s)
			// containerd must run again when the test ends, whatever happens.
			t.Cleanup(func() {
				if !env.Running() {
					if err := env.Start(context.Background()); err != nil {
						t.Errorf("restart containerd: %v", err)
					}
				}
			})
			if err := n.k.WritePod(triggerPod("gap")); err != nil {
				t.Fatal(err)
			}
			p := n.waitPod("gap", "running", running)
			pid := n.waiterPID(p)
			before := n.plegMetrics()

			ctx := context.Background()
			stopped := time.Now()
			if err := env.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			n.triggerExit(p, pid)
			if err := env.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("containerd was down for %s; the waiter exited while it was", time.Since(stopped).Round(time.Millisecond))

			p = n.waitPod("gap", "waiter restarted once and running", restartedTo("waiter", 1))
			if c := p.Container("steady"); c.RestartCount != 0 || c.State.Running == nil {
				t.Errorf("steady was disturbed: %s", describePod(p))
			}
			last := p.Container("waiter").LastState.Terminated
			t.Logf("the kubelet reports the exit in the gap as exit code %d reason %q (containerd never saw the exit happen)",
				last.ExitCode, last.Reason)
			after := n.plegMetrics()
			// A few seconds more show whether the kubelet relists by the second (fell back) or not.
			time.Sleep(3 * time.Second)
			later := n.plegMetrics()
			rate := (later.Relists - after.Relists) / later.At.Sub(after.At).Seconds()
			t.Logf("%s: before the restart: %s", s.Name, before)
			t.Logf("%s: after the restart:  %s", s.Name, after)
			t.Logf("%s: relists per second since: %.2f", s.Name, rate)

			if s.PlegNRI {
				n.checkConsumingStream(before, later)
				if after.StoppedEvents <= before.StoppedEvents {
					t.Errorf("the kubelet got no STOPPED event for the exit in the gap (%d %q lines before, %d after)",
						before.StoppedEvents, stoppedEventLog(), after.StoppedEvents)
				}
				return
			}
			// Setup 2: containerd's stream does not survive its restart.
			if later.ConnError == 0 {
				t.Errorf("with containerd's own stream the restart caused no connection error: %s", later)
			}
			if later.ConnError >= 5 {
				t.Logf("%s: the kubelet gave up on events after %g stream errors and relists every second for the rest of its life",
					s.Name, later.ConnError)
			}
		})
	}
}

// TestPlegNRIRestart restarts pleg-nri (the daemon a service manager runs: SIGTERM, then the same
// command again) under a running kubelet (setup 3). The kubelet's CRI endpoint belongs to pleg-nri's
// front, which the restart does not touch: the kubelet's event stream never fails (connection error
// count 0, no reconnection, no fallback to relisting), a container that exits after the restart comes
// as a STOPPED event and is restarted with the right restart count and last state, and nothing else is
// disturbed. (Before the front, one restart cost the node its events: error count 0 -> 5, and the
// kubelet relisted every second for the rest of its life.)
func TestPlegNRIRestart(t *testing.T) {
	n := startNode(t, setupEventedPlegNRI)
	if err := n.k.WritePod(triggerPod("survivor")); err != nil {
		t.Fatal(err)
	}
	p := n.waitPod("survivor", "running", running)
	before := n.plegMetrics()
	if err := n.p.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	restarted := n.plegMetrics()
	n.triggerExit(p, n.waiterPID(p))
	p = n.waitPod("survivor", "waiter restarted once and running", restartedTo("waiter", 1))
	if last := p.Container("waiter").LastState.Terminated; last.ExitCode != 7 || last.Reason != "Error" {
		t.Errorf("last state of waiter: exit code %d reason %q, want 7 Error", last.ExitCode, last.Reason)
	}
	if c := p.Container("steady"); c.RestartCount != 0 || c.State.Running == nil {
		t.Errorf("steady was disturbed: %s", describePod(p))
	}
	after := n.plegMetrics()
	time.Sleep(3 * time.Second)
	later := n.plegMetrics()
	t.Logf("before pleg-nri's restart:        %s", before)
	t.Logf("right after it:                   %s", restarted)
	t.Logf("after the exit and the restart:   %s", after)
	n.checkConsumingStream(before, later)
	if later.ConnSuccess != before.ConnSuccess {
		t.Errorf("the kubelet connected to the event stream again (%g connections, %g before): its stream was ended",
			later.ConnSuccess, before.ConnSuccess)
	}
	if after.StoppedEvents <= restarted.StoppedEvents {
		t.Errorf("the exit after the restart did not come as a STOPPED event the kubelet acted on (%d %q lines, %d before)",
			after.StoppedEvents, stoppedEventLog(), restarted.StoppedEvents)
	}
}

// TestStatusesLikeContainerdStream runs the same workload (a container crashing crashTimes times, an OOM
// kill, a run-once pod that fails) on EventedPLEG with containerd's own stream (setup 2) and on pleg-nri
// (setup 3), and requires the kubelet to report the same statuses on both: phase, and per container the
// restart count, the state and the last state (exit code and reason).
func TestStatusesLikeContainerdStream(t *testing.T) {
	pods := exitingPods()
	reported := map[string][]string{}
	for _, s := range []setup{setupEventedDirect, setupEventedPlegNRI} {
		t.Run(s.Name, func(t *testing.T) {
			n := startNode(t, s)
			for _, p := range pods {
				if err := n.k.WritePod(p); err != nil {
					t.Fatal(err)
				}
			}
			var got []string
			for _, w := range []struct {
				pod, what string
				cond      func(p *kubelet.PodStatus) (bool, error)
			}{
				{"crasher", "crash restarted " + fmt.Sprint(crashTimes) + " times and running", restartedTo("crash", crashTimes)},
				{"oom", "hog restarted once and running", restartedTo("hog", 1)},
				{"once", "phase Failed", func(p *kubelet.PodStatus) (bool, error) { return p.Status.Phase == "Failed", nil }},
			} {
				p := n.waitPod(w.pod, w.what, w.cond)
				for _, c := range p.Status.ContainerStatuses {
					got = append(got, fmt.Sprintf("%s phase=%s %s: restarts=%d state=%s last=%s", w.pod, p.Status.Phase, c.Name,
						c.RestartCount, describeState(c.State), describeState(c.LastState)))
				}
			}
			t.Logf("kubelet %s, %s:\n%s", kubeletVersion, s.Name, strings.Join(got, "\n"))
			reported[s.Name] = got
		})
	}
	direct, ours := reported[setupEventedDirect.Name], reported[setupEventedPlegNRI.Name]
	if len(direct) == 0 || len(ours) == 0 {
		t.Fatal("a setup reported nothing")
	}
	if !slices.Equal(direct, ours) {
		t.Errorf("the kubelet reports differently on pleg-nri than on containerd's stream:\ncontainerd's stream:\n%s\npleg-nri:\n%s",
			strings.Join(direct, "\n"), strings.Join(ours, "\n"))
	}
}

package kubelete2e

import (
	"context"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// slowDelete is how long the runc wrapper of TestSlowExitHandling makes `runc delete` take.
const slowDelete = 2 * time.Second

// TestSlowExitHandling: containerd updates an exited container's CRI status only after the runtime
// deleted its task (handleContainerExit: task.Delete, then the status), but publishes /tasks/exit at
// once, and pleg-nri sends STOPPED on that. Here `runc delete` takes 2 s (a wrapper), so for 2 s
// containerd's CRI says RUNNING for a container pleg-nri already reported STOPPED. A kubelet 1.36
// (PLEGOnDemandRelist, on by default) relists a pod right after a sync that started a container, gets
// containerd's RUNNING, and caches it with a newer timestamp than pleg-nri's events (the CRI answer has
// no timestamp of its own, so the kubelet uses its own clock): it then reports the exited container as
// running, and keeps doing so until its next relist of the pod (up to 300 s) or the pod's next event.
// A kubelet 1.37 relists the pod because of the STOPPED and would find it still running. pleg-nri
// answers such reads with the stop it already sent (read-freshness overlay, the default; see
// TestOverlaidExit). With containerd's own stream (setup 2) the STOPPED event comes after the status
// update.
//
// Each setup wants the waiter restarted once with its last state "terminated, exit code 7".
func TestSlowExitHandling(t *testing.T) {
	env.SlowRuncDelete(t, slowDelete)

	for _, s := range []setup{setupEventedDirect, setupEventedPlegNRI} {
		t.Run(s.Name, func(t *testing.T) {
			n := startNode(t, s)
			if err := n.k.WritePod(triggerPod("slow")); err != nil {
				t.Fatal(err)
			}
			p := n.waitPod("slow", "running", running)
			n.triggerExit(p, n.waiterPID(p))
			p = n.waitPod("slow", "waiter restarted once, running, last state terminated", restartedTo("waiter", 1))
			if last := p.Container("waiter").LastState.Terminated; last.ExitCode != 7 {
				t.Errorf("last state of waiter: exit code %d reason %q, want 7", last.ExitCode, last.Reason)
			}
		})
	}
}

// TestOverlaidExit: what the kubelet does with pleg-nri's answers while containerd has not handled an
// exit yet (read-freshness overlay, the default). containerd's exit handler is held at `runc delete`
// (a gate file) so that containerd's CRI shows the exited container RUNNING for as long as the test
// wants. The kubelet must restart the container meanwhile (1.37 relists the pod through pleg-nri because
// of the STOPPED: with the hold or off modes it would read RUNNING and wait for containerd), report the
// last state containerd reports once it catches up (exit code, reason, finished_at), never run two
// waiters at once (the node's duplicate watcher), and stop and clean up the pod when its manifest goes.
func TestOverlaidExit(t *testing.T) {
	gate := env.GateRuncDelete(t) // opens it before containerd's restart when the test ends
	n := startNode(t, setupEventedPlegNRI)
	t.Cleanup(gate.Open) // before the node's teardown (cleanups run last in, first out)
	if err := n.k.WritePod(triggerPod("held")); err != nil {
		t.Fatal(err)
	}
	p := n.waitPod("held", "running", running)
	oldID := strings.TrimPrefix(p.Container("waiter").ContainerID, "containerd://")
	gate.Close()
	n.triggerExit(p, n.waiterPID(p))
	p = n.waitPod("held", "waiter restarted once while containerd's exit handling is held", restartedTo("waiter", 1))
	if st := n.containerStatus(oldID); st.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("containerd shows the old waiter %s while its runc delete is held: the gate did not hold the exit handler", st.GetState())
	}
	last := p.Container("waiter").LastState.Terminated
	if last.ExitCode != 7 || last.Reason != "Error" {
		t.Errorf("last state of waiter: exit code %d reason %q, want 7 Error", last.ExitCode, last.Reason)
	}

	// containerd catches up and says what the kubelet already reports.
	gate.Open()
	var st *runtimeapi.ContainerStatus
	err := harness.WaitFor(context.Background(), podWaitTimeout, "containerd to handle the old waiter's exit", func() (bool, error) {
		st = n.containerStatus(oldID)
		return st.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	finished := time.Unix(0, st.GetFinishedAt()).UTC().Format(time.RFC3339)
	if st.GetExitCode() != last.ExitCode || st.GetReason() != last.Reason || finished != last.FinishedAt {
		t.Errorf("containerd: exit code %d reason %q finished %s; the kubelet reported %d %q %s", st.GetExitCode(), st.GetReason(),
			finished, last.ExitCode, last.Reason, last.FinishedAt)
	}
	p = n.waitPod("held", "still running, restarted once", restartedTo("waiter", 1))

	// The pod goes away: the kubelet stops it.
	if err := n.k.RemovePod("held"); err != nil {
		t.Fatal(err)
	}
	n.waitPodStopped("held", p.Metadata.UID)
}

package containerdit

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	evCreated = runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
	evStarted = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
	evStopped = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
	evDeleted = runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT
)

// TestContainerdLifecycle pins down what the real containerd reports, on its own GetContainerEvents
// stream and to an NRI plugin, for each step of a pod's life: run the pod, create/start/exec/stop/remove
// containers, a container that exits by itself with code 3, stop and remove the pod. pleg-nri is later
// compared against exactly this.
func TestContainerdLifecycle(t *testing.T) {
	logOnFailure(t)
	events := recordEvents(t, env.Address)
	nri := recordNRI(t, "recorder")
	c := newCRI(t, env.Address)

	// Run the pod: the sandbox's CREATED and STARTED events carry the sandbox id, and NRI sees
	// RunPodSandbox. The status has its IP from the CNI bridge.
	podID, podCfg := c.runPod("lifecycle")
	created := events.wait(t, podID, evCreated)
	started := events.wait(t, podID, evStarted)
	nri.wait(t, podID, "RunPodSandbox")
	if created.PodSandboxStatus == nil || created.PodSandboxStatus.Metadata.GetUid() != podCfg.Metadata.Uid {
		t.Errorf("sandbox CREATED event has sandbox status %v, want metadata uid %s", created.PodSandboxStatus, podCfg.Metadata.Uid)
	}
	if started.CreatedAt <= created.CreatedAt {
		t.Errorf("sandbox STARTED created_at %d not after CREATED %d", started.CreatedAt, created.CreatedAt)
	}
	ps := c.podStatus(podID)
	ip, err := netip.ParseAddr(ps.GetNetwork().GetIp())
	if err != nil || !netip.MustParsePrefix(env.Subnet).Contains(ip) {
		t.Errorf("pod IP %q is not in the harness subnet %s", ps.GetNetwork().GetIp(), env.Subnet)
	}

	// Create and start a long-running container.
	sleeper := c.create(podID, podCfg, containerConfig("sleeper", "sleep 3600"))
	ev := events.wait(t, sleeper, evCreated)
	nri.wait(t, sleeper, "CreateContainer")
	nri.wait(t, sleeper, "PostCreateContainer")
	if len(ev.ContainersStatuses) != 1 || ev.ContainersStatuses[0].State != runtimeapi.ContainerState_CONTAINER_CREATED {
		t.Errorf("CREATED event statuses = %v, want the one created container", ev.ContainersStatuses)
	}
	c.start(sleeper)
	events.wait(t, sleeper, evStarted)
	if call := nri.wait(t, sleeper, "StartContainer"); call.Pid == 0 {
		t.Errorf("NRI StartContainer has no pid; want the task's pid (it runs after task create)")
	}
	nri.wait(t, sleeper, "PostStartContainer")

	// Exec: no container event, no NRI callback.
	before, beforeNRI := len(events.Events()), len(nri.Calls())
	resp, err := c.rt.ExecSync(ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: sleeper, Cmd: []string{"sh", "-c", "echo hi; exit 7"}, Timeout: 10})
	if err != nil {
		t.Fatalf("ExecSync: %v", err)
	}
	if resp.ExitCode != 7 || string(resp.Stdout) != "hi\n" {
		t.Errorf("ExecSync = exit %d stdout %q, want 7 and hi", resp.ExitCode, resp.Stdout)
	}
	time.Sleep(300 * time.Millisecond)
	if got := events.Events()[before:]; len(got) != 0 {
		t.Errorf("exec produced container events %s", describeEvents(got))
	}
	if got := nri.Calls()[beforeNRI:]; len(got) != 0 {
		t.Errorf("exec produced NRI callbacks %v", got)
	}

	// A container that exits by itself with code 3: STOPPED with exit code 3 and reason Error, and NRI
	// StopContainer with the exit code.
	exiter := c.create(podID, podCfg, containerConfig("exiter", "exit 3"))
	c.start(exiter)
	stopped := events.wait(t, exiter, evStopped)
	st := statusOf(stopped, exiter)
	if st == nil || st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 3 || st.Reason != "Error" {
		t.Errorf("STOPPED event status of the exiter = %v, want EXITED, exit code 3, reason Error", st)
	}
	if call := nri.wait(t, exiter, "StopContainer"); call.ExitCode != 3 || call.State != api.ContainerState_CONTAINER_STOPPED {
		t.Errorf("NRI StopContainer for the exiter = %+v, want exit code 3 and state STOPPED", call)
	}
	if got := c.status(exiter); got.ExitCode != 3 || got.FinishedAt == 0 {
		t.Errorf("CRI status of the exiter = exit %d finished %d", got.ExitCode, got.FinishedAt)
	}

	// Stop the running container: STOPPED (exit 137 after SIGKILL, or 143/0 on TERM), then remove:
	// DELETED and NRI RemoveContainer.
	c.stop(sleeper, 1)
	events.wait(t, sleeper, evStopped)
	nri.wait(t, sleeper, "StopContainer")
	c.remove(sleeper)
	del := events.wait(t, sleeper, evDeleted)
	nri.wait(t, sleeper, "RemoveContainer")
	if statusOf(del, sleeper) != nil {
		t.Errorf("the DELETED event still lists the deleted container")
	}
	if statusOf(del, exiter) == nil {
		t.Errorf("the DELETED event of the sleeper does not list the exited container %s", short(exiter))
	}

	// Stop and remove the pod: sandbox STOPPED, NRI StopPodSandbox; DELETED for the remaining container
	// and the sandbox, NRI RemoveContainer and RemovePodSandbox.
	c.stopPod(podID)
	events.wait(t, podID, evStopped)
	nri.wait(t, podID, "StopPodSandbox")
	c.removePod(podID)
	events.wait(t, exiter, evDeleted)
	events.wait(t, podID, evDeleted)
	nri.wait(t, exiter, "RemoveContainer")
	nri.wait(t, podID, "RemovePodSandbox")

	// The whole record, per object, as containerd gave it.
	want := map[string][]runtimeapi.ContainerEventType{
		podID:   {evCreated, evStarted, evStopped, evDeleted},
		sleeper: {evCreated, evStarted, evStopped, evDeleted},
		exiter:  {evCreated, evStarted, evStopped, evDeleted},
	}
	for id, w := range want {
		if got := events.forID(id); !slices.Equal(got, w) {
			t.Errorf("containerd's events for %s = %v, want %v", short(id), got, w)
		}
	}
	t.Logf("containerd's stream: %s", describeEvents(events.Events()))
	for _, id := range []string{podID, sleeper, exiter} {
		t.Logf("NRI callbacks for %s: %v", short(id), nri.forID(id))
	}
	assertPerPodMonotonic(t, events.Events())
}

// statusOf returns the status of container id in an event, or nil.
func statusOf(ev *runtimeapi.ContainerEventResponse, id string) *runtimeapi.ContainerStatus {
	for _, s := range ev.ContainersStatuses {
		if s.Id == id {
			return s
		}
	}
	return nil
}

// assertPerPodMonotonic checks that created_at is in nanoseconds and strictly increasing per pod.
func assertPerPodMonotonic(t *testing.T, evs []*runtimeapi.ContainerEventResponse) {
	t.Helper()
	last := map[string]int64{}
	now := time.Now().UnixNano()
	for _, ev := range evs {
		uid := ev.PodSandboxStatus.GetMetadata().GetUid()
		if ev.CreatedAt < now-int64(time.Hour) || ev.CreatedAt > now+int64(time.Minute) {
			t.Errorf("event %s:%s created_at %d is not a nanosecond timestamp of now", short(ev.ContainerId), ev.ContainerEventType, ev.CreatedAt)
		}
		if ev.CreatedAt <= last[uid] {
			t.Errorf("event %s:%s created_at %d not after the pod's previous %d", short(ev.ContainerId), ev.ContainerEventType, ev.CreatedAt, last[uid])
		}
		last[uid] = ev.CreatedAt
	}
}

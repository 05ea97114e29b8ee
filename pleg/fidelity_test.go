package pleg

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The event fidelity tests of issue 11: what kubelet 1.35/1.36 write into their pod cache from an event
// must be containerd's current answer.

// setContainer replaces a container's status with a changed copy, as containerd's store does.
func (f *fakeCRI) setContainer(id string, change func(*runtimeapi.ContainerStatus)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := proto.Clone(f.containers[id]).(*runtimeapi.ContainerStatus)
	change(c)
	f.containers[id] = c
}

// resize is containerd's UpdateContainerResources: the store's status gets the new resources.
func (f *fakeCRI) resize(id string, shares, memory int64) {
	f.setContainer(id, func(c *runtimeapi.ContainerStatus) {
		c.Resources.Linux.CpuShares = shares
		c.Resources.Linux.MemoryLimitInBytes = memory
	})
}

// nriUpdated is NRI's PostUpdateContainer: containerd has updated the container's resources.
func nriUpdated(id, sb string, at time.Time) Observation {
	return Observation{Source: SourceNRI, Kind: KindContainer, ID: id, SandboxID: sb, StatusChanged: true, SourceTime: at}
}

// TestUpdateRechecksStatus (item 1): after UpdateContainerResources (NRI's PostUpdateContainer), every
// later event of the pod carries containerd's new status of the container, a sibling's and its own; the
// update itself gives no event (containerd's stream has none).
func TestUpdateRechecksStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		// beforeAnswer: the sibling exits before the recheck's status answer is in.
		beforeAnswer bool
	}{{"exit after the recheck", false}, {"exit before the recheck answer", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.startPod("s1", "c1", "c2")
			h.clock.Advance(time.Second)
			h.cri.resize("c1", 256, 96<<20)
			h.observe(nriUpdated("c1", "s1", h.clock.Now()))
			if !tc.beforeAnswer {
				h.settle()
				if evs := h.events(); len(evs) != 0 {
					t.Fatalf("events for the update: %v", summary(evs))
				}
			}
			h.clock.Advance(time.Millisecond)
			h.cri.exitContainer("c2", 0, h.clock.Now())
			h.observe(nriExit("c2", "s1", 0, h.clock.Now(), h.clock.Now()))
			h.settle()
			evs := h.events()
			if d := cmp.Diff([]string{"STOPPED c2"}, summary(evs)); d != "" {
				t.Fatalf("events (-want +got):\n%s", d)
			}
			if d := diffProto(h.cri.container("c1"), statusOf(evs[0], "c1")); d != "" {
				t.Errorf("c1's status in c2's STOPPED (-containerd +event):\n%s", d)
			}
			h.clock.Advance(time.Millisecond)
			h.cri.exitContainer("c1", 0, h.clock.Now())
			h.observe(nriExit("c1", "s1", 0, h.clock.Now(), h.clock.Now()))
			h.settle()
			evs = h.events()
			if d := cmp.Diff([]string{"STOPPED c1"}, summary(evs)); d != "" {
				t.Fatalf("events (-want +got):\n%s", d)
			}
			if d := diffProto(h.cri.container("c1"), statusOf(evs[0], "c1")); d != "" {
				t.Errorf("c1's own STOPPED (-containerd +event):\n%s", d)
			}
		})
	}
}

// TestExitVerificationRetries (item 2): the STOPPED built from the fast inputs is checked against
// containerd's ContainerStatus until containerd's answer shows the exit, however late; when that answer
// differs in a field the kubelet reads (here: a container killed while containerd was down, which
// containerd's CRI reports as 255/Unknown), one corrected STOPPED carries containerd's answer.
func TestExitVerificationRetries(t *testing.T) {
	for _, tc := range []struct {
		name string
		// lag is how long containerd's CRI takes to show the exit.
		lag time.Duration
		// code, reason and finished (after the exit event's time) are containerd's final answer.
		code     int32
		reason   string
		finished time.Duration
		want     []string
	}{
		{"same answer, in time", 0, 137, "Error", 0, []string{"STOPPED c1"}},
		{"same answer, 20s late", 20 * time.Second, 137, "Error", 0, []string{"STOPPED c1"}},
		{"unknown exit, in time", 0, 255, "Unknown", 300 * time.Millisecond, []string{"STOPPED c1", "STOPPED c1"}},
		{"unknown exit, 20s late", 20 * time.Second, 255, "Unknown", 20 * time.Second, []string{"STOPPED c1", "STOPPED c1"}},
		{"other exit time, 3s late", 3 * time.Second, 137, "Error", 2 * time.Second, []string{"STOPPED c1", "STOPPED c1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.startPod("s1", "c1")
			h.clock.Advance(time.Second)
			exited := h.clock.Now()
			h.observe(taskExit("c1", 137, exited))
			h.runDue()
			caught := false
			for step := time.Duration(0); step <= time.Minute; step += 100 * time.Millisecond {
				if !caught && step >= tc.lag {
					caught = true
					h.cri.setContainer("c1", func(c *runtimeapi.ContainerStatus) {
						c.State = runtimeapi.ContainerState_CONTAINER_EXITED
						c.ExitCode, c.Reason = tc.code, tc.reason
						c.FinishedAt = exited.Add(tc.finished).UnixNano()
					})
				}
				h.clock.Advance(100 * time.Millisecond)
				h.runDue()
			}
			evs := h.events()
			if d := cmp.Diff(tc.want, summary(evs)); d != "" {
				t.Fatalf("events (-want +got):\n%s", d)
			}
			if st := statusOf(evs[0], "c1"); st.ExitCode != 137 || st.Reason != "Error" {
				t.Errorf("first STOPPED: %d %s, want 137 Error from the exit event", st.ExitCode, st.Reason)
			}
			if d := diffProto(h.cri.container("c1"), statusOf(evs[len(evs)-1], "c1")); d != "" {
				t.Errorf("last STOPPED (-containerd +event):\n%s", d)
			}
		})
	}
}

// fakeOOM answers OOMKilled as containerd's task metrics do (the cgroup's oom_kill count).
type fakeOOM struct {
	mu     sync.Mutex
	killed map[string]bool
	gone   map[string]bool // the task was deleted: NotFound
	calls  int
}

func (f *fakeOOM) OOMKilled(_ context.Context, id, _ string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.gone[id] {
		return false, fmt.Errorf("task %s: %w", id, errdefs.ErrNotFound)
	}
	return f.killed[id], nil
}

// TestOOMFirstStoppedRight (item 3): containerd checks the cgroup's OOM kill count before its STOPPED of
// an exit with status 137, so its one STOPPED says OOMKilled. pleg-nri's first STOPPED must say so too,
// whether /tasks/oom comes before the exit, after it, or never; and an exit that cannot be an OOM kill
// costs no check.
func TestOOMFirstStoppedRight(t *testing.T) {
	for _, tc := range []struct {
		name   string
		code   int32
		oom    bool // the cgroup recorded an OOM kill
		gone   bool // containerd had deleted the task already (its own check done, its status says)
		event  string
		reason string
		calls  int
	}{
		{"oom, no /tasks/oom", 137, true, false, "", "OOMKilled", 1},
		{"oom, /tasks/oom after the exit", 137, true, false, "after", "OOMKilled", 1},
		{"oom, /tasks/oom before the exit", 137, true, false, "before", "OOMKilled", 0},
		{"oom, task already deleted", 137, true, true, "", "OOMKilled", 1},
		{"SIGKILL, not an OOM", 137, false, false, "", "Error", 1},
		{"exit 1", 1, false, false, "", "Error", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			oom := &fakeOOM{killed: map[string]bool{"c1": tc.oom}, gone: map[string]bool{"c1": tc.gone}}
			h := newHarness(t, func(c *Config) { c.OOM = oom })
			h.startPod("s1", "c1")
			h.clock.Advance(time.Second)
			finished := h.clock.Now()
			if tc.oom {
				h.cri.oomContainer("c1") // containerd's status says it once its handler ran
			}
			if tc.gone {
				h.cri.exitContainer("c1", tc.code, finished)
			}
			if tc.event == "before" {
				h.observe(taskOOM("c1", finished))
			}
			h.observe(taskExit("c1", tc.code, finished))
			if tc.event == "after" {
				h.observe(taskOOM("c1", finished))
			}
			h.runDue()
			h.runDue()
			evs := h.events()
			if d := cmp.Diff([]string{"STOPPED c1"}, summary(evs)); d != "" {
				t.Fatalf("events (-want +got):\n%s", d)
			}
			if got := statusOf(evs[0], "c1").Reason; got != tc.reason {
				t.Errorf("first STOPPED's reason %q, want %q", got, tc.reason)
			}
			if oom.calls != tc.calls {
				t.Errorf("%d OOM checks, want %d", oom.calls, tc.calls)
			}
			h.cri.exitContainer("c1", tc.code, finished)
			h.settle()
			if evs := h.events(); len(evs) != 0 {
				t.Errorf("events after containerd caught up: %v (%s)", summary(evs), statusOf(evs[0], "c1").Reason)
			}
		})
	}
}

// teardown is the end of containerd's StopPodSandbox: the network namespace is closed, and the
// sandbox's status has no IPs from then on (sandbox_status.go getIPs).
func (f *fakeCRI) teardown(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := proto.Clone(f.sandboxes[id]).(*runtimeapi.PodSandboxStatus)
	c.Network = &runtimeapi.PodSandboxNetworkStatus{}
	f.sandboxes[id] = c
}

// TestSandboxStatusAfterStop (item 8): containerd builds each event's sandbox status when it sends it: its
// STOPPED of a sandbox (the pause process's exit) still has the IPs, and its events after the network
// teardown (the DELETED of the containers and of the sandbox) have none. pleg-nri's match, field by field.
func TestSandboxStatusAfterStop(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1", "c1")
	h.clock.Advance(time.Second)
	h.cri.exitContainer("c1", 0, h.clock.Now())
	h.observe(nriExit("c1", "s1", 0, h.clock.Now(), h.clock.Now()))
	h.cri.stopSandbox("s1")
	h.observe(nriSandbox("s1", PhaseExited, h.clock.Now()))
	h.settle()
	evs := h.events()
	if d := cmp.Diff([]string{"STOPPED c1", "STOPPED s1"}, summary(evs)); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
	if d := diffProto(h.cri.sandbox("s1"), evs[1].Response.PodSandboxStatus); d != "" {
		t.Errorf("sandbox STOPPED's sandbox status (-containerd +event):\n%s", d)
	}
	h.cri.teardown("s1")
	torn := h.cri.sandbox("s1")
	h.clock.Advance(time.Second) // the kubelet's garbage collection
	h.cri.removeContainer("c1")
	h.observe(nriContainer("c1", "s1", PhaseRemoved, h.clock.Now()))
	h.settle()
	h.cri.removeSandbox("s1")
	h.observe(nriSandbox("s1", PhaseRemoved, h.clock.Now()))
	h.settle()
	evs = h.events()
	if d := cmp.Diff([]string{"DELETED c1", "DELETED s1"}, summary(evs)); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
	for _, ev := range evs {
		if d := diffProto(torn, ev.Response.PodSandboxStatus); d != "" {
			t.Errorf("%s's sandbox status (-containerd after the teardown +event):\n%s", summary([]Event{ev})[0], d)
		}
	}
}

// recordingOOM records the cgroup each OOM check is asked with.
type recordingOOM struct {
	fakeOOM
	cgroups []string
}

func (r *recordingOOM) OOMKilled(ctx context.Context, id, cgroup string) (bool, error) {
	r.cgroups = append(r.cgroups, cgroup)
	return r.fakeOOM.OOMKilled(ctx, id, cgroup)
}

// runningWithCgroup starts sandbox s1 and its container c1, whose cgroupsPath NRI reports as cgroup, and
// takes their events.
func (h *harness) runningWithCgroup(cgroup string) {
	h.clock.Advance(time.Millisecond)
	h.cri.runSandbox("s1", h.clock.Now())
	h.observe(nriSandbox("s1", PhaseRunning, h.clock.Now()))
	h.cri.createContainer("c1", "s1", h.clock.Now())
	o := nriContainer("c1", "s1", PhaseCreated, h.clock.Now())
	o.CgroupsPath = cgroup
	h.observe(o)
	h.cri.startContainer("c1", h.clock.Now())
	o = nriContainer("c1", "s1", PhaseRunning, h.clock.Now())
	o.StartedAt = h.clock.Now()
	h.observe(o)
	h.settle()
	h.events()
}

// TestOOMCheckGetsCgroup: the OOM check is asked with the container's cgroup as NRI reported it, so the
// daemon's checker can read the count itself.
func TestOOMCheckGetsCgroup(t *testing.T) {
	oom := &recordingOOM{fakeOOM: fakeOOM{killed: map[string]bool{"c1": true}}}
	h := newHarness(t, func(c *Config) { c.OOM = oom })
	h.runningWithCgroup("/kubepods/pod-s1/c1")
	h.observe(taskExit("c1", 137, h.clock.Now()))
	h.runDue()
	if d := cmp.Diff([]string{"/kubepods/pod-s1/c1"}, oom.cgroups); d != "" {
		t.Errorf("OOM checks' cgroups (-want +got):\n%s", d)
	}
	evs := h.events()
	if len(evs) != 1 || statusOf(evs[0], "c1").Reason != "OOMKilled" {
		t.Errorf("events %v, want one STOPPED OOMKilled", summary(evs))
	}
}

// fastOOM answers from the cgroup alone (pleg.OOMCgroupReader) for the cgroups it knows.
type fastOOM struct {
	fakeOOM
	cgroups map[string]bool // cgroupsPath -> OOM-killed; absent: cannot be read
}

func (f *fastOOM) CgroupOOMKilled(cgroup string) (bool, bool) {
	killed, ok := f.cgroups[cgroup]
	return killed, ok
}

// TestOOMCheckInline: when the checker can read the cgroup itself, the check is made inline: the STOPPED
// of an exit with status 137 goes out on the exit's own observation, with no queued call; when it cannot,
// the call is queued.
func TestOOMCheckInline(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cgroups map[string]bool
		reason  string
		calls   int
	}{
		{"readable, OOM-killed", map[string]bool{"/kubepods/pod-s1/c1": true}, "OOMKilled", 0},
		{"readable, not OOM-killed", map[string]bool{"/kubepods/pod-s1/c1": false}, "Error", 0},
		{"not readable", map[string]bool{}, "OOMKilled", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			oom := &fastOOM{fakeOOM: fakeOOM{killed: map[string]bool{"c1": true}}, cgroups: tc.cgroups}
			h := newHarness(t, func(c *Config) { c.OOM = oom })
			h.runningWithCgroup("/kubepods/pod-s1/c1")
			h.observe(taskExit("c1", 137, h.clock.Now()))
			evs := h.events()
			if tc.calls > 0 {
				if len(evs) != 0 {
					t.Fatalf("STOPPED before the queued check: %v", summary(evs))
				}
				h.runDue()
				evs = h.events()
			}
			if len(evs) != 1 || statusOf(evs[0], "c1").Reason != tc.reason {
				t.Fatalf("events %v, want one STOPPED %s", summary(evs), tc.reason)
			}
			if oom.calls != tc.calls {
				t.Errorf("%d queued OOM checks, want %d", oom.calls, tc.calls)
			}
		})
	}
}

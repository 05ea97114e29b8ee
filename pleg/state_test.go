package pleg

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// startPod runs sandbox sb and creates and starts each container, through the CRI model and NRI, and
// settles; it returns the events it produced.
func (h *harness) startPod(sb string, ctrs ...string) []Event {
	h.clock.Advance(time.Millisecond)
	h.cri.runSandbox(sb, h.clock.Now())
	h.observe(nriSandbox(sb, PhaseRunning, h.clock.Now()))
	h.settle()
	for _, c := range ctrs {
		h.clock.Advance(time.Millisecond)
		h.cri.createContainer(c, sb, h.clock.Now())
		h.observe(nriContainer(c, sb, PhaseCreated, h.clock.Now()))
		h.settle()
		h.clock.Advance(time.Millisecond)
		h.cri.startContainer(c, h.clock.Now())
		o := nriContainer(c, sb, PhaseRunning, h.clock.Now())
		o.StartedAt = h.clock.Now()
		h.observe(o)
		h.settle()
	}
	return h.events()
}

// statusOf returns the status of container id in an event (nil when absent).
func statusOf(ev Event, id string) *runtimeapi.ContainerStatus {
	for _, s := range ev.Response.ContainersStatuses {
		if s.Id == id {
			return s
		}
	}
	return nil
}

func diffProto(want, got any) string { return cmp.Diff(want, got, protocmp.Transform()) }

func TestStartPod(t *testing.T) {
	h := newHarness(t)
	evs := h.startPod("s1", "c1", "c2")
	want := []string{"CREATED s1", "STARTED s1", "CREATED c1", "STARTED c1", "CREATED c2", "STARTED c2"}
	if d := cmp.Diff(want, summary(evs)); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
	last := evs[len(evs)-1].Response
	if d := diffProto(h.cri.sandbox("s1"), last.PodSandboxStatus); d != "" {
		t.Errorf("sandbox status (-cri +event):\n%s", d)
	}
	if d := diffProto([]*runtimeapi.ContainerStatus{h.cri.container("c1"), h.cri.container("c2")}, last.ContainersStatuses); d != "" {
		t.Errorf("container statuses (-cri +event):\n%s", d)
	}
	if h.metrics.mismatch != 0 {
		t.Errorf("verification mismatches: %d", h.metrics.mismatch)
	}
	// The sandbox's own events list no container; CREATED c1 lists c1 only.
	if n := len(evs[0].Response.ContainersStatuses); n != 0 {
		t.Errorf("CREATED s1 lists %d containers", n)
	}
	if n := len(evs[2].Response.ContainersStatuses); n != 1 {
		t.Errorf("CREATED c1 lists %d containers", n)
	}
}

// TestStopArrivalOrders: the NRI exit, the task exit and a relist report the same stop, in every order,
// applied one by one or all at once: one STOPPED, field-equal to containerd's status.
func TestStopArrivalOrders(t *testing.T) {
	inputs := []string{"nri", "task", "relist"}
	var orders [][]string
	var perm func(prefix, rest []string)
	perm = func(prefix, rest []string) {
		if len(rest) == 0 {
			orders = append(orders, prefix)
			return
		}
		for i := range rest {
			r := append(append([]string{}, rest[:i]...), rest[i+1:]...)
			perm(append(append([]string{}, prefix...), rest[i]), r)
		}
	}
	perm(nil, inputs)
	for _, order := range orders {
		for _, settleEach := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v/settleEach=%v", order, settleEach), func(t *testing.T) {
				h := newHarness(t)
				h.startPod("s1", "c1")
				h.clock.Advance(time.Second)
				finished := h.clock.Now()
				h.cri.exitContainer("c1", 2, finished)
				h.clock.Advance(2 * time.Millisecond)
				for _, in := range order {
					switch in {
					case "nri":
						h.p.Observe(nriExit("c1", "s1", 2, finished, h.clock.Now()))
					case "task":
						h.p.Observe(taskExit("c1", 2, finished))
					case "relist":
						if _, err := h.p.Relist(h.ctx); err != nil {
							t.Fatal(err)
						}
					}
					if settleEach {
						h.settle()
					} else {
						h.p.drain(h.ctx)
					}
				}
				h.settle()
				evs := h.events()
				if d := cmp.Diff([]string{"STOPPED c1"}, summary(evs)); d != "" {
					t.Fatalf("events (-want +got):\n%s", d)
				}
				if d := diffProto(h.cri.container("c1"), statusOf(evs[0], "c1")); d != "" {
					t.Errorf("STOPPED status (-cri +event):\n%s", d)
				}
				if d := diffProto(h.cri.sandbox("s1"), evs[0].Response.PodSandboxStatus); d != "" {
					t.Errorf("sandbox status (-cri +event):\n%s", d)
				}
				if h.metrics.mismatch != 0 {
					t.Errorf("verification mismatches: %d", h.metrics.mismatch)
				}
			})
		}
	}
}

func TestOOM(t *testing.T) {
	type step func(h *harness, finished time.Time)
	exit := func(h *harness, finished time.Time) {
		h.cri.exitContainer("c1", 137, finished)
		h.observe(taskExit("c1", 137, finished))
	}
	oom := func(h *harness, finished time.Time) {
		h.cri.oomContainer("c1")
		h.observe(taskOOM("c1", finished.Add(-time.Millisecond)))
	}
	// oomByMetrics: containerd's handleContainerExit found the OOM in the cgroup's counters: only the CRI
	// status says so, no /tasks/oom.
	oomByMetrics := func(h *harness, finished time.Time) { h.cri.oomContainer("c1") }
	settle := func(h *harness, _ time.Time) { h.settle() }
	for _, tc := range []struct {
		name      string
		steps     []step
		want      []string
		reasons   []string // reason of c1 in each STOPPED
		corrected int
	}{
		{"oom before exit", []step{oom, exit, settle}, []string{"STOPPED c1"}, []string{"OOMKilled"}, 0},
		{"oom after exit, applied together", []step{exit, oom, settle}, []string{"STOPPED c1", "STOPPED c1"}, []string{"Error", "OOMKilled"}, 1},
		{"oom after exit, after the verification", []step{exit, settle, oom, settle, oom, settle}, []string{"STOPPED c1", "STOPPED c1"}, []string{"Error", "OOMKilled"}, 1},
		{"oom found by the verification", []step{exit, oomByMetrics, settle, oom, settle}, []string{"STOPPED c1", "STOPPED c1"}, []string{"Error", "OOMKilled"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.startPod("s1", "c1")
			h.clock.Advance(time.Second)
			finished := h.clock.Now()
			for _, s := range tc.steps {
				s(h, finished)
			}
			evs := h.events()
			if d := cmp.Diff(tc.want, summary(evs)); d != "" {
				t.Fatalf("events (-want +got):\n%s", d)
			}
			var reasons []string
			for _, ev := range evs {
				reasons = append(reasons, statusOf(ev, "c1").Reason)
			}
			if d := cmp.Diff(tc.reasons, reasons); d != "" {
				t.Errorf("reasons (-want +got):\n%s", d)
			}
			if d := diffProto(h.cri.container("c1"), statusOf(evs[len(evs)-1], "c1")); d != "" {
				t.Errorf("last status (-cri +event):\n%s", d)
			}
			if h.metrics.corrected != tc.corrected {
				t.Errorf("corrected = %d, want %d", h.metrics.corrected, tc.corrected)
			}
		})
	}
}

func TestRemovedWhileRunning(t *testing.T) {
	for _, by := range []string{"nri", "relist"} {
		t.Run(by, func(t *testing.T) {
			h := newHarness(t)
			h.startPod("s1", "c1", "c2")
			h.clock.Advance(time.Second)
			h.cri.removeContainer("c1")
			if by == "nri" {
				h.observe(nriContainer("c1", "s1", PhaseRemoved, h.clock.Now()))
			} else if _, err := h.p.Relist(h.ctx); err != nil {
				t.Fatal(err)
			}
			h.settle()
			evs := h.events()
			if d := cmp.Diff([]string{"STOPPED c1", "DELETED c1"}, summary(evs)); d != "" {
				t.Fatalf("events (-want +got):\n%s", d)
			}
			st := statusOf(evs[0], "c1")
			if st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != exitCodeUnknown || st.Reason != reasonUnknown || st.FinishedAt != h.clock.Now().UnixNano() {
				t.Errorf("synthesized exit: %v", st)
			}
			if statusOf(evs[1], "c1") != nil || statusOf(evs[1], "c2") == nil {
				t.Errorf("DELETED c1 statuses: %v", evs[1].Response.ContainersStatuses)
			}
			if by == "relist" && h.metrics.repairs["container_stopped"] != 1 || by == "relist" && h.metrics.repairs["container_deleted"] != 1 {
				t.Errorf("repairs: %v", h.metrics.repairs)
			}
			// A late exit of the deleted container is ignored.
			h.observe(taskExit("c1", 0, h.clock.Now()))
			if evs := h.events(); len(evs) != 0 {
				t.Errorf("late exit emitted %v", summary(evs))
			}
			if h.metrics.suppressed[SuppressDeleted] != 1 {
				t.Errorf("suppressed: %v", h.metrics.suppressed)
			}
		})
	}
}

func TestSandboxExitWhileContainersRun(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1", "c1")
	h.clock.Advance(time.Second)
	h.cri.stopSandbox("s1")
	h.observe(Observation{Source: SourceTaskEvent, ID: "s1", Phase: PhaseExited, HasExitCode: true, ExitCode: 137, FinishedAt: h.clock.Now(), SourceTime: h.clock.Now()})
	evs := h.events()
	if d := cmp.Diff([]string{"STOPPED s1"}, summary(evs)); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
	if d := diffProto(h.cri.sandbox("s1"), evs[0].Response.PodSandboxStatus); d != "" {
		t.Errorf("sandbox status (-cri +event):\n%s", d)
	}
	if st := statusOf(evs[0], "c1"); st == nil || st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("c1 in STOPPED s1: %v", st)
	}
	// The container then dies, and the pod is stopped and removed.
	h.clock.Advance(time.Millisecond)
	h.cri.exitContainer("c1", 0, h.clock.Now())
	h.observe(taskExit("c1", 0, h.clock.Now()), nriSandbox("s1", PhaseExited, h.clock.Now()))
	h.cri.removeContainer("c1")
	h.cri.removeSandbox("s1")
	h.observe(nriContainer("c1", "s1", PhaseRemoved, h.clock.Now()), nriSandbox("s1", PhaseRemoved, h.clock.Now()))
	h.settle()
	evs = h.events()
	if d := cmp.Diff([]string{"STOPPED c1", "DELETED c1", "DELETED s1"}, summary(evs)); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
	if statusOf(evs[0], "c1").Reason != reasonCompleted {
		t.Errorf("c1 reason %q", statusOf(evs[0], "c1").Reason)
	}
	if last := evs[2].Response; last.PodSandboxStatus == nil || len(last.ContainersStatuses) != 0 {
		t.Errorf("DELETED s1: %v", last)
	}
}

func TestSandboxRemovedTakesContainers(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1", "c1", "c2")
	h.clock.Advance(time.Second)
	h.cri.removeContainer("c1")
	h.cri.removeContainer("c2")
	h.cri.removeSandbox("s1")
	h.observe(nriSandbox("s1", PhaseRemoved, h.clock.Now()))
	h.settle()
	want := []string{"STOPPED c1", "DELETED c1", "STOPPED c2", "DELETED c2", "STOPPED s1", "DELETED s1"}
	evs := h.events()
	if d := cmp.Diff(want, summary(evs)); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
	if n := len(h.p.st.objects) + len(h.p.st.pods); n != 0 {
		t.Errorf("%d objects/pods left", n)
	}
}

func TestDuplicatesAndStale(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1", "c1")
	h.observe(nriContainer("c1", "s1", PhaseRunning, h.clock.Now()), nriSandbox("s1", PhaseRunning, h.clock.Now()))
	h.clock.Advance(time.Second)
	h.cri.exitContainer("c1", 0, h.clock.Now())
	h.observe(taskExit("c1", 0, h.clock.Now()))
	h.observe(nriContainer("c1", "s1", PhaseRunning, h.clock.Now()), nriContainer("c1", "s1", PhaseCreated, h.clock.Now()))
	h.observe(taskExit("c1", 0, h.clock.Now()))
	h.settle()
	if d := cmp.Diff([]string{"STOPPED c1"}, summary(h.events())); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
	if h.metrics.suppressed[SuppressDuplicate] != 3 || h.metrics.suppressed[SuppressStale] != 2 {
		t.Errorf("suppressed: %v", h.metrics.suppressed)
	}
}

func TestStatusNotFoundThenFound(t *testing.T) {
	h := newHarness(t)
	now := h.clock.Now()
	// NRI RunPodSandbox comes before the sandbox is in the CRI store.
	h.observe(nriSandbox("s1", PhaseRunning, now))
	h.runDue()
	h.runDue()
	h.cri.runSandbox("s1", now)
	h.cri.createContainer("c1", "s1", now)
	h.observe(nriContainer("c1", "s1", PhaseCreated, now))
	if evs := h.events(); len(evs) != 0 {
		t.Fatalf("events before the sandbox status: %v", summary(evs))
	}
	for range 20 {
		h.clock.Advance(10 * time.Millisecond)
		h.runDue()
	}
	want := []string{"CREATED s1", "STARTED s1", "CREATED c1"}
	if d := cmp.Diff(want, summary(h.events())); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
}

func TestPerPodOrderOtherPodsNotDelayed(t *testing.T) {
	h := newHarness(t)
	now := h.clock.Now()
	h.cri.runSandbox("a", now)
	h.cri.runSandbox("b", now)
	h.cri.notFound["a"] = 1000 // pod a's status is slow
	h.observe(nriSandbox("a", PhaseRunning, now), nriSandbox("b", PhaseRunning, now))
	h.runDue()
	if d := cmp.Diff([]string{"CREATED b", "STARTED b"}, summary(h.events())); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
	h.cri.mu.Lock()
	h.cri.notFound["a"] = 0
	h.cri.mu.Unlock()
	h.settle()
	if d := cmp.Diff([]string{"CREATED a", "STARTED a"}, summary(h.events())); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
}

func TestRemovedBeforeStatus(t *testing.T) {
	t.Run("sandbox never in the CRI", func(t *testing.T) {
		h := newHarness(t)
		now := h.clock.Now()
		h.observe(nriSandbox("s1", PhaseRunning, now))
		h.runDue()
		h.observe(nriSandbox("s1", PhaseRemoved, now))
		h.settle()
		if evs := h.events(); len(evs) != 0 {
			t.Fatalf("events: %v", summary(evs))
		}
		if h.metrics.dropped[DropRemovedBeforeStatus] != 1 {
			t.Errorf("dropped: %v", h.metrics.dropped)
		}
		h.observe(nriSandbox("s1", PhaseExited, now)) // late: tombstoned
		if len(h.p.st.objects) != 0 || h.metrics.suppressed[SuppressDeleted] != 1 {
			t.Errorf("objects %d, suppressed %v", len(h.p.st.objects), h.metrics.suppressed)
		}
	})
	t.Run("container created and removed before its status call", func(t *testing.T) {
		h := newHarness(t)
		h.startPod("s1")
		h.observe(nriContainer("c9", "s1", PhaseCreated, h.clock.Now()), nriContainer("c9", "s1", PhaseRemoved, h.clock.Now()))
		h.settle()
		if evs := h.events(); len(evs) != 0 {
			t.Fatalf("events: %v", summary(evs))
		}
		if h.metrics.dropped[DropRemovedBeforeStatus] != 1 {
			t.Errorf("dropped: %v", h.metrics.dropped)
		}
	})
	t.Run("never found", func(t *testing.T) {
		h := newHarness(t)
		h.observe(nriSandbox("s1", PhaseRunning, h.clock.Now()))
		h.settle()
		if evs := h.events(); len(evs) != 0 {
			t.Fatalf("events: %v", summary(evs))
		}
		if h.metrics.dropped[DropStatusNotFound] != 1 || len(h.p.st.objects) != 0 {
			t.Errorf("dropped: %v, objects %d", h.metrics.dropped, len(h.p.st.objects))
		}
	})
}

func TestFirstSeenLate(t *testing.T) {
	t.Run("first seen exited", func(t *testing.T) {
		h := newHarness(t)
		h.startPod("s1")
		now := h.clock.Now()
		h.cri.createContainer("c1", "s1", now)
		h.cri.startContainer("c1", now.Add(time.Millisecond))
		h.cri.exitContainer("c1", 3, now.Add(2*time.Millisecond))
		if _, err := h.p.Relist(h.ctx); err != nil {
			t.Fatal(err)
		}
		h.settle()
		evs := h.events()
		if d := cmp.Diff([]string{"CREATED c1", "STARTED c1", "STOPPED c1"}, summary(evs)); d != "" {
			t.Fatalf("events (-want +got):\n%s", d)
		}
		for _, ev := range evs {
			if d := diffProto(h.cri.container("c1"), statusOf(ev, "c1")); d != "" {
				t.Errorf("%s status (-cri +event):\n%s", ev.Response.ContainerEventType, d)
			}
			if ev.Source != SourceRelist {
				t.Errorf("source %s", ev.Source)
			}
		}
	})
	t.Run("created then removed, never started", func(t *testing.T) {
		h := newHarness(t)
		h.startPod("s1")
		h.cri.createContainer("c1", "s1", h.clock.Now())
		h.observe(nriContainer("c1", "s1", PhaseCreated, h.clock.Now()))
		h.runDue()
		h.cri.removeContainer("c1")
		h.observe(nriContainer("c1", "s1", PhaseRemoved, h.clock.Now()))
		h.settle()
		if d := cmp.Diff([]string{"CREATED c1", "DELETED c1"}, summary(h.events())); d != "" {
			t.Fatalf("events (-want +got):\n%s", d)
		}
	})
	t.Run("exit held until the container appears", func(t *testing.T) {
		h := newHarness(t)
		h.startPod("s1")
		now := h.clock.Now()
		h.cri.createContainer("c1", "s1", now)
		h.cri.startContainer("c1", now)
		h.cri.exitContainer("c1", 1, now.Add(time.Millisecond))
		h.observe(taskExit("c1", 1, now.Add(time.Millisecond))) // task event before NRI says anything
		if len(h.p.st.held) != 1 {
			t.Fatalf("held: %d", len(h.p.st.held))
		}
		h.observe(nriContainer("c1", "s1", PhaseCreated, now))
		h.settle()
		if d := cmp.Diff([]string{"CREATED c1", "STARTED c1", "STOPPED c1"}, summary(h.events())); d != "" {
			t.Fatalf("events (-want +got):\n%s", d)
		}
	})
	t.Run("held observation expires", func(t *testing.T) {
		h := newHarness(t)
		h.observe(taskExit("exec-1", 0, h.clock.Now()))
		h.clock.Advance(heldTTL + time.Second)
		h.p.drain(h.ctx)
		if len(h.p.st.held) != 0 || h.metrics.suppressed[SuppressHeldExpired] != 1 {
			t.Errorf("held %d, suppressed %v", len(h.p.st.held), h.metrics.suppressed)
		}
	})
}

func TestCreatedAtStrictlyIncreasing(t *testing.T) {
	h := newHarness(t)
	evs := h.startPod("s1", "c1", "c2", "c3") // the clock moves by 1ms per step, not per event
	h.clock.Advance(-time.Hour)               // even a clock going back does not break the order
	h.cri.exitContainer("c1", 0, h.clock.Now())
	h.observe(taskExit("c1", 0, h.clock.Now()))
	checkStream(t, nil, append(evs, h.events()...))
}

func TestEmittedStatusesAreNotMutated(t *testing.T) {
	h := newHarness(t)
	evs := h.startPod("s1", "c1")
	snap := make([]*runtimeapi.ContainerEventResponse, len(evs))
	for i, ev := range evs {
		snap[i] = proto.Clone(ev.Response).(*runtimeapi.ContainerEventResponse)
	}
	h.cri.oomContainer("c1")
	h.observe(taskOOM("c1", h.clock.Now()))
	h.cri.exitContainer("c1", 137, h.clock.Now())
	h.observe(taskExit("c1", 137, h.clock.Now()))
	h.cri.stopSandbox("s1")
	h.observe(nriSandbox("s1", PhaseExited, h.clock.Now()))
	h.settle()
	for i, ev := range evs {
		if d := diffProto(snap[i], ev.Response); d != "" {
			t.Errorf("event %d changed after emission:\n%s", i, d)
		}
	}
}

// TestStartTimeOnlyContainerds: a Running observation without containerd's own start time (a
// /tasks/start event, whose timestamp is not the StartedAt containerd records) does not emit STARTED
// with a guessed time: the event waits for a status answer and carries containerd's start time.
func TestStartTimeOnlyContainerds(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1")
	h.cri.createContainer("c1", "s1", h.clock.Now())
	h.observe(nriContainer("c1", "s1", PhaseCreated, h.clock.Now()))
	h.settle()
	started := h.clock.Now()
	h.clock.Advance(3 * time.Millisecond)
	h.cri.startContainer("c1", started)
	h.observe(Observation{Source: SourceTaskEvent, ID: "c1", Phase: PhaseRunning, StartedAt: h.clock.Now(), SourceTime: h.clock.Now()})
	if d := cmp.Diff([]string{"CREATED c1"}, summary(h.events())); d != "" {
		t.Fatalf("events before containerd's start time is known (-want +got):\n%s", d)
	}
	h.settle() // the status call
	evs := h.events()
	if d := cmp.Diff([]string{"STARTED c1"}, summary(evs)); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
	if st := statusOf(evs[0], "c1"); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING || st.StartedAt != started.UnixNano() {
		t.Errorf("STARTED status: %v, want RUNNING started at %d", st, started.UnixNano())
	}
	h.cri.exitContainer("c1", 0, h.clock.Now())
	h.observe(taskExit("c1", 0, h.clock.Now()))
	evs = h.events()
	if d := diffProto(h.cri.container("c1"), statusOf(evs[0], "c1")); d != "" {
		t.Errorf("STOPPED status (-cri +event):\n%s", d)
	}
}

// TestStartTimeFromNRI: NRI's start time is containerd's own: it wins over the task event's, and
// STARTED goes out at once.
func TestStartTimeFromNRI(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1")
	h.cri.createContainer("c1", "s1", h.clock.Now())
	h.observe(nriContainer("c1", "s1", PhaseCreated, h.clock.Now()))
	h.settle()
	started := h.clock.Now().Add(time.Millisecond)
	h.observe(Observation{Source: SourceTaskEvent, ID: "c1", Phase: PhaseRunning, StartedAt: h.clock.Now(), SourceTime: h.clock.Now()})
	ob := nriContainer("c1", "s1", PhaseRunning, time.Time{})
	ob.StartedAt = started
	h.observe(ob)
	evs := h.events()
	if d := cmp.Diff([]string{"CREATED c1", "STARTED c1"}, summary(evs)); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
	if st := statusOf(evs[1], "c1"); st.StartedAt != started.UnixNano() {
		t.Errorf("STARTED started_at %d, want NRI's %d", st.StartedAt, started.UnixNano())
	}
}

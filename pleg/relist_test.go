package pleg

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestDiffRelist(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	const after = 10
	type obj struct {
		id, sb    string
		kind      Kind
		phase     Phase
		seq       uint64
		hasStatus bool
	}
	sandbox := func(id string, st runtimeapi.PodSandboxState) *runtimeapi.PodSandbox {
		return &runtimeapi.PodSandbox{Id: id, State: st, CreatedAt: 1}
	}
	container := func(id, sb string, st runtimeapi.ContainerState) *runtimeapi.Container {
		return &runtimeapi.Container{Id: id, PodSandboxId: sb, State: st, CreatedAt: 2}
	}
	ready, notReady := runtimeapi.PodSandboxState_SANDBOX_READY, runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	running, exited, unknown := runtimeapi.ContainerState_CONTAINER_RUNNING, runtimeapi.ContainerState_CONTAINER_EXITED, runtimeapi.ContainerState_CONTAINER_UNKNOWN
	type want struct {
		id    string
		kind  Kind
		phase Phase
	}
	for _, tc := range []struct {
		name       string
		state      []obj
		tombs      []string
		sandboxes  []*runtimeapi.PodSandbox
		containers []*runtimeapi.Container
		want       []want
	}{
		{
			name:       "quiet",
			state:      []obj{{"s1", "s1", KindSandbox, PhaseRunning, 1, true}, {"c1", "s1", KindContainer, PhaseRunning, 2, true}},
			sandboxes:  []*runtimeapi.PodSandbox{sandbox("s1", ready)},
			containers: []*runtimeapi.Container{container("c1", "s1", running)},
		},
		{
			name:       "new sandbox and container",
			sandboxes:  []*runtimeapi.PodSandbox{sandbox("s1", ready)},
			containers: []*runtimeapi.Container{container("c1", "s1", exited)},
			want:       []want{{"s1", KindSandbox, PhaseRunning}, {"c1", KindContainer, PhaseExited}},
		},
		{
			name:       "missed exit",
			state:      []obj{{"s1", "s1", KindSandbox, PhaseRunning, 1, true}, {"c1", "s1", KindContainer, PhaseRunning, 2, true}},
			sandboxes:  []*runtimeapi.PodSandbox{sandbox("s1", notReady)},
			containers: []*runtimeapi.Container{container("c1", "s1", exited)},
			want:       []want{{"s1", KindSandbox, PhaseExited}, {"c1", KindContainer, PhaseExited}},
		},
		{
			name:       "observed after the snapshot: left alone",
			state:      []obj{{"s1", "s1", KindSandbox, PhaseRunning, 11, true}, {"c1", "s1", KindContainer, PhaseRunning, 12, true}, {"c2", "s1", KindContainer, PhaseRunning, 13, true}},
			sandboxes:  []*runtimeapi.PodSandbox{sandbox("s1", notReady)},
			containers: []*runtimeapi.Container{container("c1", "s1", exited)},
		},
		{
			name:       "list behind the state: never backwards",
			state:      []obj{{"s1", "s1", KindSandbox, PhaseExited, 1, true}, {"c1", "s1", KindContainer, PhaseExited, 2, true}},
			sandboxes:  []*runtimeapi.PodSandbox{sandbox("s1", ready)},
			containers: []*runtimeapi.Container{container("c1", "s1", running)},
		},
		{
			name: "vanished: containers first",
			state: []obj{{"s1", "s1", KindSandbox, PhaseRunning, 1, true}, {"c2", "s1", KindContainer, PhaseRunning, 2, true},
				{"c1", "s1", KindContainer, PhaseExited, 3, true}, {"s0", "s0", KindSandbox, PhaseRunning, 1, true}},
			sandboxes: []*runtimeapi.PodSandbox{sandbox("s0", ready)},
			want:      []want{{"c1", KindContainer, PhaseRemoved}, {"c2", KindContainer, PhaseRemoved}, {"s1", KindSandbox, PhaseRemoved}},
		},
		{
			name:  "no status yet: its status call decides",
			state: []obj{{"s1", "s1", KindSandbox, PhaseRunning, 1, false}, {"c1", "s1", KindContainer, PhaseCreated, 2, false}},
		},
		{
			name:       "tombstoned ids in the list",
			tombs:      []string{"s1", "c1"},
			sandboxes:  []*runtimeapi.PodSandbox{sandbox("s1", ready)},
			containers: []*runtimeapi.Container{container("c1", "s1", running)},
		},
		{
			name:       "unknown state: neither changed nor vanished",
			state:      []obj{{"s1", "s1", KindSandbox, PhaseRunning, 1, true}, {"c1", "s1", KindContainer, PhaseRunning, 2, true}},
			sandboxes:  []*runtimeapi.PodSandbox{sandbox("s1", ready)},
			containers: []*runtimeapi.Container{container("c1", "s1", unknown), container("c9", "s1", unknown)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objects := map[string]*object{}
			pods := map[string]*pod{}
			for _, o := range tc.state {
				p := pods[o.sb]
				if p == nil {
					p = &pod{id: o.sb, containers: map[string]*object{}}
					pods[o.sb] = p
				}
				x := &object{id: o.id, kind: o.kind, pod: p, phase: o.phase, lastSeq: o.seq}
				if o.hasStatus {
					if o.kind == KindSandbox {
						x.sbAnswer = &runtimeapi.PodSandboxStatus{Id: o.id}
					} else {
						x.ctrAnswer = &runtimeapi.ContainerStatus{Id: o.id}
					}
				}
				objects[o.id] = x
			}
			tombs := map[string]time.Time{}
			for _, id := range tc.tombs {
				tombs[id] = now
			}
			var got []want
			for _, ob := range diffRelist(objects, tombs, after, tc.sandboxes, tc.containers, now) {
				if ob.Source != SourceRelist || ob.SourceTime != now {
					t.Errorf("observation %v: source %s at %v", ob, ob.Source, ob.SourceTime)
				}
				got = append(got, want{ob.ID, ob.Kind, ob.Phase})
			}
			if d := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); d != "" {
				t.Errorf("diff (-want +got):\n%s", d)
			}
		})
	}
}

func TestRelistQuiet(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1", "c1", "c2")
	h.startPod("s2", "c3")
	calls := h.cri.statusCalls()
	for range 3 {
		res, err := h.p.Relist(h.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Repairs != nil || res.Sandboxes != 2 || res.Containers != 3 {
			t.Errorf("quiet relist: %+v", res)
		}
		h.settle()
	}
	if evs := h.events(); len(evs) != 0 {
		t.Errorf("quiet relist emitted %v", summary(evs))
	}
	if n := h.cri.statusCalls() - calls; n != 0 {
		t.Errorf("quiet relist made %d status calls", n)
	}
}

// TestRelistAfterRestart: while containerd (or pleg-nri's inputs) were down, a container exited
// (containerd reports 255 Unknown), another was created and started, a pod was removed.
func TestRelistAfterRestart(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1", "c1")
	h.startPod("s2", "c3")
	h.clock.Advance(time.Minute)
	now := h.clock.Now()
	h.cri.exitContainer("c1", 255, now)
	h.cri.createContainer("c2", "s1", now)
	h.cri.startContainer("c2", now.Add(time.Millisecond))
	h.cri.removeContainer("c3")
	h.cri.removeSandbox("s2")
	res, err := h.p.Relist(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantRepairs := map[string]int{"container_stopped": 2, "container_created": 1, "container_started": 1,
		"container_deleted": 1, "sandbox_stopped": 1, "sandbox_deleted": 1}
	if d := cmp.Diff(wantRepairs, res.Repairs); d != "" {
		t.Errorf("result repairs (-want +got):\n%s", d)
	}
	// What needs no status call is out already; the rest after the status calls.
	if d := cmp.Diff([]string{"STOPPED c3", "DELETED c3", "STOPPED s2", "DELETED s2"}, summary(h.events())); d != "" {
		t.Errorf("events before status calls (-want +got):\n%s", d)
	}
	h.settle()
	evs := h.events()
	if d := cmp.Diff([]string{"STOPPED c1", "CREATED c2", "STARTED c2"}, summary(evs)); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
	if d := diffProto(h.cri.container("c1"), statusOf(evs[0], "c1")); d != "" {
		t.Errorf("c1 status (-cri +event):\n%s", d)
	}
	if d := diffProto(h.cri.container("c2"), statusOf(evs[2], "c2")); d != "" {
		t.Errorf("c2 status (-cri +event):\n%s", d)
	}
	if d := cmp.Diff(wantRepairs, h.metrics.repairs); d != "" {
		t.Errorf("metric repairs (-want +got):\n%s", d)
	}
}

func TestRelistErrors(t *testing.T) {
	h := newHarness(t)
	h.cri.failList = errors.New("connection refused")
	if _, err := h.p.Relist(h.ctx); err == nil || !errors.Is(err, h.cri.failList) {
		t.Errorf("err = %v", err)
	}
	p, err := New(Config{Status: h.cri})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Relist(h.ctx); err == nil {
		t.Error("Relist without a Lister succeeded")
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New without a StatusSource succeeded")
	}
}

// TestRelistRepairLateInput: a relist that sends an exit before containerd's task event reaches
// pleg-nri repaired nothing the inputs missed: the late input is counted against the repair (once,
// however many inputs report it), and a repair no input ever reports stays a repair.
func TestRelistRepairLateInput(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1", "c1", "c2")
	h.clock.Advance(time.Second)
	now := h.clock.Now()
	h.cri.exitContainer("c1", 3, now)
	h.cri.exitContainer("c2", 3, now)
	if _, err := h.p.Relist(h.ctx); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if d := cmp.Diff([]string{"STOPPED c1", "STOPPED c2"}, summary(h.events())); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
	// c1's task exit arrives after the relist, twice (NRI's StopContainer would report it too); c2's never.
	h.observe(taskExit("c1", 3, now), nriExit("c1", "s1", 3, now, now))
	h.settle()
	if evs := h.events(); len(evs) != 0 {
		t.Errorf("the late exit emitted %v", summary(evs))
	}
	if d := cmp.Diff(map[string]int{"container_stopped": 2}, h.metrics.repairs); d != "" {
		t.Errorf("repairs (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]int{"container_stopped": 1}, h.metrics.repairsLate); d != "" {
		t.Errorf("late inputs (-want +got):\n%s", d)
	}
}

package pleg

import (
	"cmp"
	"context"
	"slices"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// readCRI is the fake CRI with what the reads need: the sandbox's whole answer (its info map, as
// containerd fills it when not verbose) and a container's list entry.
type readCRI struct{ *fakeCRI }

var (
	_ SandboxResponseSource = readCRI{}
	_ ContainerEntrySource  = readCRI{}
)

func sandboxInfo(id string) map[string]string {
	return map[string]string{"info": `{"id":"` + id + `"}`}
}

func (r readCRI) PodSandboxStatusResponse(ctx context.Context, id string) (*runtimeapi.PodSandboxStatusResponse, error) {
	st, err := r.PodSandboxStatus(ctx, id)
	if err != nil {
		return nil, err
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: st, Info: sandboxInfo(id)}, nil
}

func (r readCRI) ListContainer(ctx context.Context, id string) (*runtimeapi.Container, error) {
	all, _ := r.ListContainers(ctx)
	for _, c := range all {
		if c.Id == id {
			return c, nil
		}
	}
	return nil, errNotFound(id)
}

func errNotFound(id string) error {
	_, err := newFakeCRI().ContainerStatus(context.Background(), id)
	return err
}

// inputs is a fake InputState.
type inputs struct {
	down atomic.Bool
	gen  atomic.Uint64
}

func (in *inputs) state() (bool, uint64) { return !in.down.Load(), in.gen.Load() }

// readHarness is a harness whose PLEG serves reads, with fake inputs.
type readHarness struct {
	*harness
	in *inputs
}

func newReadHarness(t *testing.T, mod ...func(*Config)) *readHarness {
	in := &inputs{}
	cri := newFakeCRI()
	h := newHarness(t, append([]func(*Config){func(c *Config) {
		c.Status, c.Lister, c.ServeReads, c.Inputs = readCRI{cri}, readCRI{cri}, true, in.state
	}}, mod...)...)
	h.cri = cri
	return &readHarness{harness: h, in: in}
}

// relist relists, failing the test on an error.
func (h *readHarness) relist() {
	h.t.Helper()
	if _, err := h.p.Relist(h.ctx); err != nil {
		h.t.Fatal(err)
	}
	h.settle()
}

// pod makes sandbox sb with running containers ids in the fake runtime and the state, as NRI and the
// status calls report them, and settles.
func (h *readHarness) pod(sb string, ids ...string) {
	now := h.clock.Now()
	h.cri.runSandbox(sb, now)
	h.observe(nriSandbox(sb, PhaseRunning, now))
	for _, id := range ids {
		h.cri.createContainer(id, sb, now)
		h.cri.startContainer(id, now)
		o := nriContainer(id, sb, PhaseRunning, now)
		o.StartedAt = now
		h.observe(nriContainer(id, sb, PhaseCreated, now), o)
	}
	h.settle()
}

// The runtime's answers, as containerd gives them (the fake's store).

func (h *readHarness) runtimeContainerStatus(id string) *runtimeapi.ContainerStatusResponse {
	return &runtimeapi.ContainerStatusResponse{Status: h.cri.container(id)}
}

func (h *readHarness) runtimeSandboxStatus(id string) *runtimeapi.PodSandboxStatusResponse {
	return &runtimeapi.PodSandboxStatusResponse{Status: h.cri.sandbox(id), Info: sandboxInfo(id)}
}

func (h *readHarness) runtimeContainers(keep func(*runtimeapi.Container) bool) []*runtimeapi.Container {
	all, _ := h.cri.ListContainers(h.ctx)
	return slices.DeleteFunc(all, func(c *runtimeapi.Container) bool { return !keep(c) })
}

func (h *readHarness) runtimeSandboxes(keep func(*runtimeapi.PodSandbox) bool) []*runtimeapi.PodSandbox {
	all, _ := h.cri.ListPodSandbox(h.ctx)
	return slices.DeleteFunc(all, func(s *runtimeapi.PodSandbox) bool { return !keep(s) })
}

func byID[T interface{ GetId() string }](a, b T) int { return cmp.Compare(a.GetId(), b.GetId()) }

// equalLists says whether two lists hold equal entries, in any order.
func equalLists[T interface {
	proto.Message
	GetId() string
}](a, b []T) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, byID)
	slices.SortFunc(b, byID)
	return slices.EqualFunc(a, b, func(x, y T) bool { return proto.Equal(x, y) })
}

// current says whether each of the four reads of the pod sb and its container id is answered.
func (h *readHarness) current(sb, id string) (cs, ss, lc, ls bool) {
	_, cs = h.p.ContainerStatus(h.ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	_, ss = h.p.PodSandboxStatus(h.ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb})
	_, lc = h.p.ListContainers(h.ctx, &runtimeapi.ListContainersRequest{})
	_, ls = h.p.ListPodSandbox(h.ctx, &runtimeapi.ListPodSandboxRequest{})
	return
}

func (h *readHarness) wantCurrent(sb, id string, want bool) {
	h.t.Helper()
	cs, ss, lc, ls := h.current(sb, id)
	if cs != want || ss != want || lc != want || ls != want {
		h.t.Errorf("answered from the state: ContainerStatus %v, PodSandboxStatus %v, ListContainers %v, ListPodSandbox %v; want all %v",
			cs, ss, lc, ls, want)
	}
}

// wantRuntimesStatus checks that p answers ContainerStatus of id from its state with the runtime's
// status (what containerd answers).
func (h *readHarness) wantRuntimesStatus(p *PLEG, id string) {
	h.t.Helper()
	got, ok := p.ContainerStatus(h.ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if !ok || !proto.Equal(got, h.runtimeContainerStatus(id)) {
		h.t.Errorf("ContainerStatus(%s) = %v, %v; want the runtime's %v", id, got, ok, h.runtimeContainerStatus(id))
	}
}

// wantContainerReads checks whether ContainerStatus of id and ListContainers are answered.
func (h *readHarness) wantContainerReads(id string, want bool) {
	h.t.Helper()
	cs, _, lc, _ := h.current("", id)
	if cs != want || lc != want {
		h.t.Errorf("answered from the state: ContainerStatus(%s) %v, ListContainers %v; want both %v", id, cs, lc, want)
	}
}

func TestReadsAnswerAsTheRuntimeWithFilters(t *testing.T) {
	h := newReadHarness(t)
	h.pod("s1", "c1", "c2")
	h.pod("s2", "c3")
	// c2 exits; containerd shows it; the exit is verified.
	at := h.clock.Now()
	h.cri.exitContainer("c2", 1, at)
	h.observe(nriExit("c2", "s1", 1, at, at))
	h.settle()
	h.relist()

	for _, id := range []string{"c1", "c2", "c3"} {
		h.wantRuntimesStatus(h.p, id)
	}
	for _, id := range []string{"s1", "s2"} {
		got, ok := h.p.PodSandboxStatus(h.ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
		if !ok || !proto.Equal(got, h.runtimeSandboxStatus(id)) {
			t.Errorf("PodSandboxStatus(%s) = %v, %v; want the runtime's", id, got, ok)
		}
	}
	running := runtimeapi.ContainerState_CONTAINER_RUNNING
	for _, tc := range []struct {
		name   string
		filter *runtimeapi.ContainerFilter
		keep   func(*runtimeapi.Container) bool
	}{
		{"none", nil, func(*runtimeapi.Container) bool { return true }},
		{"id", &runtimeapi.ContainerFilter{Id: "c2"}, func(c *runtimeapi.Container) bool { return c.Id == "c2" }},
		{"sandbox", &runtimeapi.ContainerFilter{PodSandboxId: "s1"}, func(c *runtimeapi.Container) bool { return c.PodSandboxId == "s1" }},
		{"id of another sandbox", &runtimeapi.ContainerFilter{Id: "c3", PodSandboxId: "s1"}, func(*runtimeapi.Container) bool { return false }},
		{"state", &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: running}}, func(c *runtimeapi.Container) bool { return c.State == running }},
		{"labels", &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"io.kubernetes.container.name": "c3"}},
			func(c *runtimeapi.Container) bool { return c.Labels["io.kubernetes.container.name"] == "c3" }},
	} {
		got, ok := h.p.ListContainers(h.ctx, &runtimeapi.ListContainersRequest{Filter: tc.filter})
		if want := h.runtimeContainers(tc.keep); !ok || !equalLists(got.GetContainers(), want) {
			t.Errorf("ListContainers, filter %s = %v, %v; want the runtime's %v", tc.name, got, ok, want)
		}
	}
	ready := runtimeapi.PodSandboxState_SANDBOX_READY
	for _, tc := range []struct {
		name   string
		filter *runtimeapi.PodSandboxFilter
		keep   func(*runtimeapi.PodSandbox) bool
	}{
		{"none", nil, func(*runtimeapi.PodSandbox) bool { return true }},
		{"id", &runtimeapi.PodSandboxFilter{Id: "s2"}, func(s *runtimeapi.PodSandbox) bool { return s.Id == "s2" }},
		{"state", &runtimeapi.PodSandboxFilter{State: &runtimeapi.PodSandboxStateValue{State: ready}}, func(s *runtimeapi.PodSandbox) bool { return s.State == ready }},
		{"labels", &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"absent": "x"}}, func(*runtimeapi.PodSandbox) bool { return false }},
	} {
		got, ok := h.p.ListPodSandbox(h.ctx, &runtimeapi.ListPodSandboxRequest{Filter: tc.filter})
		if want := h.runtimeSandboxes(tc.keep); !ok || !equalLists(got.GetItems(), want) {
			t.Errorf("ListPodSandbox, filter %s = %v, %v; want the runtime's %v", tc.name, got, ok, want)
		}
	}
	// Lists come in creation order, then by id.
	got, _ := h.p.ListContainers(h.ctx, &runtimeapi.ListContainersRequest{})
	if !slices.IsSortedFunc(got.GetContainers(), func(a, b *runtimeapi.Container) int {
		return cmp.Or(cmp.Compare(a.CreatedAt, b.CreatedAt), cmp.Compare(a.Id, b.Id))
	}) {
		t.Errorf("ListContainers not in creation order: %v", got)
	}
}

func TestReadsForwardUnknownTruncatedAndVerbose(t *testing.T) {
	h := newReadHarness(t)
	h.pod("s1", "c1")
	h.relist()
	for name, ok := range map[string]bool{
		"unknown container":    second(h.p.ContainerStatus(h.ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "nope"})),
		"truncated container":  second(h.p.ContainerStatus(h.ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c"})),
		"a sandbox's id":       second(h.p.ContainerStatus(h.ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "s1"})),
		"verbose container":    second(h.p.ContainerStatus(h.ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c1", Verbose: true})),
		"unknown sandbox":      second(h.p.PodSandboxStatus(h.ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "nope"})),
		"verbose sandbox":      second(h.p.PodSandboxStatus(h.ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "s1", Verbose: true})),
		"list, truncated id":   second(h.p.ListContainers(h.ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: "c"}})),
		"list, unknown pod":    second(h.p.ListContainers(h.ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: "s"}})),
		"list, id, bad pod":    second(h.p.ListContainers(h.ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: "c1", PodSandboxId: "s"}})),
		"sandboxes, truncated": second(h.p.ListPodSandbox(h.ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{Id: "s"}})),
	} {
		if ok {
			t.Errorf("%s: answered from the state, want it forwarded", name)
		}
	}
	h.wantCurrent("s1", "c1", true)
}

func second[A any](_ A, ok bool) bool { return ok }

func TestReadsNeverWithoutServeReads(t *testing.T) {
	in := &inputs{}
	h := newHarness(t, func(c *Config) { c.Inputs = in.state })
	now := h.clock.Now()
	h.cri.runSandbox("s1", now)
	h.observe(nriSandbox("s1", PhaseRunning, now))
	h.settle()
	if _, err := h.p.Relist(h.ctx); err != nil {
		t.Fatal(err)
	}
	rh := &readHarness{harness: h, in: in}
	rh.wantCurrent("s1", "c1", false)
}

// A container created through the endpoint (NRI's PostCreateContainer seen) whose status is not fetched
// yet: the lists and its status are forwarded until the fetch answered.
func TestReadsWaitForAPendingStatusFetch(t *testing.T) {
	h := newReadHarness(t)
	h.pod("s1")
	h.relist()
	now := h.clock.Now()
	h.cri.createContainer("c1", "s1", now)
	h.observe(nriContainer("c1", "s1", PhaseCreated, now))
	h.wantContainerReads("c1", false)
	if _, ok := h.p.PodSandboxStatus(h.ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "s1"}); !ok {
		t.Error("PodSandboxStatus of the settled sandbox forwarded while a container's fetch is pending")
	}
	h.runDue() // the status call, and the list entry with it
	h.wantCurrent("s1", "c1", true)
	got, _ := h.p.ListContainers(h.ctx, &runtimeapi.ListContainersRequest{})
	if want := h.runtimeContainers(func(*runtimeapi.Container) bool { return true }); !equalLists(got.GetContainers(), want) {
		t.Errorf("ListContainers = %v, want %v", got, want)
	}
}

// A start that pleg-nri reported before containerd's status: answered once containerd's start time
// came (NRI's PostStartContainer carries it).
func TestReadsOfAStartWaitForContainerdsStartTime(t *testing.T) {
	h := newReadHarness(t)
	h.pod("s1", "c1")
	h.relist()
	now := h.clock.Now()
	h.cri.createContainer("c2", "s1", now)
	h.observe(nriContainer("c2", "s1", PhaseCreated, now))
	h.settle()
	// The task event of the start, without containerd's start time: the status is asked again.
	h.cri.startContainer("c2", now)
	h.observe(Observation{Source: SourceTaskEvent, ID: "c2", Phase: PhaseRunning, SourceTime: now})
	h.wantContainerReads("c2", false)
	h.settle()
	h.wantCurrent("s1", "c2", true)
	h.wantRuntimesStatus(h.p, "c2")
}

// A stop: the exit is reported (and emitted) before containerd's status shows it; the reads wait for
// the verification that sees containerd's exit.
func TestReadsOfAnExitWaitForContainerdsStatus(t *testing.T) {
	h := newReadHarness(t)
	h.pod("s1", "c1")
	h.relist()
	at := h.clock.Now()
	h.observe(taskExit("c1", 137, at))
	if ev := summary(h.events()); !slices.Contains(ev, "STOPPED c1") {
		t.Fatalf("events %v, want the STOPPED of c1", ev)
	}
	h.wantContainerReads("c1", false)
	h.runDue() // nothing due: the verification waits VerifyDelay
	h.wantContainerReads("c1", false)
	h.cri.exitContainer("c1", 137, at)
	h.settle()
	h.wantCurrent("s1", "c1", true)
	h.wantRuntimesStatus(h.p, "c1")
}

// An exit containerd did not show within the verification's attempts: the next relist asks again.
func TestReadsRelistReasksAnUnsettledObject(t *testing.T) {
	h := newReadHarness(t)
	h.pod("s1", "c1")
	h.relist()
	at := h.clock.Now()
	h.observe(taskExit("c1", 1, at))
	h.settle() // every verification attempt: containerd still shows it running
	h.wantContainerReads("c1", false)
	h.cri.exitContainer("c1", 1, at)
	h.relist()
	h.wantContainerReads("c1", true)
}

// A removal: the container is gone from the state; its id is forwarded (NotFound is containerd's).
func TestReadsOfARemovedContainerAreForwarded(t *testing.T) {
	h := newReadHarness(t)
	h.pod("s1", "c1", "c2")
	h.relist()
	at := h.clock.Now()
	h.cri.exitContainer("c1", 0, at)
	h.observe(nriExit("c1", "s1", 0, at, at))
	h.settle()
	h.cri.removeContainer("c1")
	h.observe(nriContainer("c1", "s1", PhaseRemoved, at))
	h.settle()
	if _, ok := h.p.ContainerStatus(h.ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c1"}); ok {
		t.Error("ContainerStatus of a removed container answered from the state")
	}
	got, ok := h.p.ListContainers(h.ctx, &runtimeapi.ListContainersRequest{})
	if want := h.runtimeContainers(func(*runtimeapi.Container) bool { return true }); !ok || !equalLists(got.GetContainers(), want) {
		t.Errorf("ListContainers = %v, %v; want %v", got, ok, want)
	}
}

// A resize (NRI's PostUpdateContainer): the container's status is forwarded until the refresh brought
// containerd's new one.
func TestReadsDuringAResize(t *testing.T) {
	h := newReadHarness(t)
	h.pod("s1", "c1")
	h.relist()
	h.cri.mu.Lock()
	c := proto.Clone(h.cri.containers["c1"]).(*runtimeapi.ContainerStatus)
	c.Resources = &runtimeapi.ContainerResources{Linux: &runtimeapi.LinuxContainerResources{CpuShares: 512}}
	h.cri.containers["c1"] = c
	h.cri.mu.Unlock()
	h.observe(Observation{Source: SourceNRI, Kind: KindContainer, ID: "c1", SandboxID: "s1", StatusChanged: true, SourceTime: h.clock.Now()})
	h.wantContainerReads("c1", false)
	h.settle()
	h.wantRuntimesStatus(h.p, "c1") // after the resize
}

// containerd restarting: the inputs go down; after they are back the reads wait for a relist that
// listed after the reconnection.
func TestReadsAcrossAnInputReconnection(t *testing.T) {
	h := newReadHarness(t)
	h.pod("s1", "c1")
	h.relist()
	h.wantCurrent("s1", "c1", true)
	h.in.down.Store(true)
	h.wantCurrent("s1", "c1", false)
	h.in.down.Store(false)
	h.in.gen.Add(1) // reconnected
	h.wantCurrent("s1", "c1", false)
	h.relist()
	h.wantCurrent("s1", "c1", true)
}

// A relist that repairs: the inputs missed something, so the reads go to containerd until a relist
// repairs nothing; an object the repair made is not settled before its status.
func TestReadsAfterARelistRepair(t *testing.T) {
	h := newReadHarness(t)
	h.pod("s1", "c1")
	h.relist()
	at := h.clock.Now()
	h.cri.exitContainer("c1", 2, at) // no input told
	if _, err := h.p.Relist(h.ctx); err != nil {
		t.Fatal(err)
	}
	h.wantCurrent("s1", "c1", false)
	h.settle()
	h.wantCurrent("s1", "c1", false) // the last relist repaired
	h.relist()
	h.wantCurrent("s1", "c1", true)
	h.wantRuntimesStatus(h.p, "c1")
}

// A task event of an id the state does not know yet is held: the lists are forwarded meanwhile.
func TestReadsListsWaitForHeldObservations(t *testing.T) {
	h := newReadHarness(t)
	h.pod("s1", "c1")
	h.relist()
	h.observe(Observation{Source: SourceTaskEvent, ID: "c9", Phase: PhaseRunning, SourceTime: h.clock.Now()})
	if _, ok := h.p.ListContainers(h.ctx, &runtimeapi.ListContainersRequest{}); ok {
		t.Error("ListContainers answered while a task event of an unknown id is held")
	}
	if _, ok := h.p.ContainerStatus(h.ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c1"}); !ok {
		t.Error("ContainerStatus of a settled container forwarded")
	}
}

// A sandbox stopped: its NOTREADY is answered once containerd's status shows it, and its status only
// once it has no IPs (the network teardown).
func TestReadsOfAStoppedSandbox(t *testing.T) {
	h := newReadHarness(t)
	h.pod("s1")
	h.relist()
	h.observe(nriSandbox("s1", PhaseExited, h.clock.Now())) // ahead of containerd
	if _, ok := h.p.ListPodSandbox(h.ctx, &runtimeapi.ListPodSandboxRequest{}); ok {
		t.Error("ListPodSandbox answered before containerd showed the sandbox's exit")
	}
	h.cri.stopSandbox("s1") // containerd's exit handling; the IPs stay until the teardown
	h.settle()
	got, ok := h.p.ListPodSandbox(h.ctx, &runtimeapi.ListPodSandboxRequest{})
	if want := h.runtimeSandboxes(func(*runtimeapi.PodSandbox) bool { return true }); !ok || !equalLists(got.GetItems(), want) {
		t.Errorf("ListPodSandbox = %v, %v; want %v", got, ok, want)
	}
	if _, ok := h.p.PodSandboxStatus(h.ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "s1"}); ok && hasIPs(h.cri.sandbox("s1")) {
		t.Error("PodSandboxStatus of a stopped sandbox with IPs answered from the state")
	}
}

// After a restart: the checkpoint's state is not answered before the startup reconciliation, nor an
// object before containerd gave this process its status.
func TestReadsAfterARestart(t *testing.T) {
	dir := t.TempDir()
	cri := newFakeCRI()
	in := &inputs{}
	cfg := func(c *Config) {
		c.Status, c.Lister, c.ServeReads, c.Inputs = readCRI{cri}, readCRI{cri}, true, in.state
		c.CheckpointPath = dir + "/checkpoint"
	}
	h := newReadHarness(t, cfg)
	h.cri = cri
	h.in = in
	h.pod("s1", "c1")
	h.relist()
	// Every subscriber received the events: the checkpoint records them.
	h.events()
	h.p.writeCheckpoint(h.ctx)

	p2, err := New(Config{Status: readCRI{cri}, Lister: readCRI{cri}, ServeReads: true, Inputs: in.state, Clock: h.clock.Now,
		CheckpointPath: dir + "/checkpoint"})
	if err != nil {
		t.Fatal(err)
	}
	h2 := &readHarness{harness: &harness{t: t, ctx: h.ctx, clock: h.clock, cri: cri, p: p2, sub: p2.Subscribe()}, in: in}
	h2.wantCurrent("s1", "c1", false) // loaded, not reconciled
	if _, err := p2.Relist(h.ctx); err != nil {
		t.Fatal(err)
	}
	h2.wantCurrent("s1", "c1", false) // reconciled, but the statuses are the checkpoint's
	h2.settle()
	h2.relist() // the startup relist's own verifications done, and a relist with nothing to repair
	h2.wantCurrent("s1", "c1", true)
	h.wantRuntimesStatus(p2, "c1")
}

package pleg

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

func TestMain(m *testing.M) {
	// Debug level exercises the debug log paths; the output is discarded.
	log.L.Logger.SetOutput(io.Discard)
	_ = log.SetLevel("debug")
	goleak.VerifyTestMain(m)
}

// The event types, short.
const (
	evCreated = runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
	evStarted = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
	evStopped = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
	evDeleted = runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT
)

// fakeCRI models containerd's CRI store: statuses as containerd answers them, replaced (never modified)
// on every change, NotFound for what is not in the store.
type fakeCRI struct {
	mu         sync.Mutex
	sandboxes  map[string]*runtimeapi.PodSandboxStatus
	containers map[string]*runtimeapi.ContainerStatus
	sandboxOf  map[string]string
	notFound   map[string]int // remaining NotFound answers per id, even when present
	failList   error
	calls      map[string]int // status calls per id
	lists      int
}

func newFakeCRI() *fakeCRI {
	return &fakeCRI{
		sandboxes: map[string]*runtimeapi.PodSandboxStatus{}, containers: map[string]*runtimeapi.ContainerStatus{},
		sandboxOf: map[string]string{}, notFound: map[string]int{}, calls: map[string]int{},
	}
}

func (f *fakeCRI) PodSandboxStatus(_ context.Context, id string) (*runtimeapi.PodSandboxStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[id]++
	if f.notFound[id] > 0 {
		f.notFound[id]--
		return nil, fmt.Errorf("an error occurred when try to find sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	s, ok := f.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("an error occurred when try to find sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return s, nil
}

func (f *fakeCRI) ContainerStatus(_ context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[id]++
	if f.notFound[id] > 0 {
		f.notFound[id]--
		return nil, fmt.Errorf("an error occurred when try to find container %q: %w", id, errdefs.ErrNotFound)
	}
	s, ok := f.containers[id]
	if !ok {
		return nil, fmt.Errorf("an error occurred when try to find container %q: %w", id, errdefs.ErrNotFound)
	}
	return s, nil
}

func (f *fakeCRI) ListPodSandbox(context.Context) ([]*runtimeapi.PodSandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	if f.failList != nil {
		return nil, f.failList
	}
	out := make([]*runtimeapi.PodSandbox, 0, len(f.sandboxes))
	for _, id := range slices.Sorted(maps.Keys(f.sandboxes)) {
		s := f.sandboxes[id]
		out = append(out, &runtimeapi.PodSandbox{Id: s.Id, Metadata: s.Metadata, State: s.State, CreatedAt: s.CreatedAt,
			Labels: s.Labels, Annotations: s.Annotations, RuntimeHandler: s.RuntimeHandler})
	}
	return out, nil
}

func (f *fakeCRI) ListContainers(context.Context) ([]*runtimeapi.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failList != nil {
		return nil, f.failList
	}
	out := make([]*runtimeapi.Container, 0, len(f.containers))
	for _, id := range slices.Sorted(maps.Keys(f.containers)) {
		c := f.containers[id]
		out = append(out, &runtimeapi.Container{Id: c.Id, PodSandboxId: f.sandboxOf[id], Metadata: c.Metadata,
			Image: c.Image, ImageRef: c.ImageRef, ImageId: c.ImageId, State: c.State, CreatedAt: c.CreatedAt,
			Labels: c.Labels, Annotations: c.Annotations})
	}
	return out, nil
}

// callsOf returns the number of status calls of id.
func (f *fakeCRI) callsOf(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[id]
}

func (f *fakeCRI) statusCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}

// Runtime changes, as containerd makes them.

func (f *fakeCRI) runSandbox(id string, at time.Time) *runtimeapi.PodSandboxStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := sandboxStatus(id, at)
	f.sandboxes[id] = s
	return s
}

func (f *fakeCRI) stopSandbox(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.sandboxes[id]; s != nil {
		c := proto.Clone(s).(*runtimeapi.PodSandboxStatus)
		c.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
		f.sandboxes[id] = c
	}
}

func (f *fakeCRI) removeSandbox(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sandboxes, id)
}

func (f *fakeCRI) createContainer(id, sandbox string, at time.Time) *runtimeapi.ContainerStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := containerStatus(id, sandbox, at)
	f.containers[id] = c
	f.sandboxOf[id] = sandbox
	return c
}

func (f *fakeCRI) startContainer(id string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.containers[id]; s != nil {
		c := proto.Clone(s).(*runtimeapi.ContainerStatus)
		c.State = runtimeapi.ContainerState_CONTAINER_RUNNING
		c.StartedAt = at.UnixNano()
		f.containers[id] = c
	}
}

// exitContainer records an exit like handleContainerExit + toCRIContainerStatus (first exit wins).
func (f *fakeCRI) exitContainer(id string, code int32, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.containers[id]
	if s == nil || s.State == runtimeapi.ContainerState_CONTAINER_EXITED {
		return
	}
	c := proto.Clone(s).(*runtimeapi.ContainerStatus)
	c.State = runtimeapi.ContainerState_CONTAINER_EXITED
	c.FinishedAt = at.UnixNano()
	c.ExitCode = code
	c.Reason = exitReason(false, s.Reason, code)
	f.containers[id] = c
}

// oomContainer is containerd's TaskOOM handler: Reason = OOMKilled in any state.
func (f *fakeCRI) oomContainer(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.containers[id]; s != nil && s.Reason != reasonOOMKilled {
		c := proto.Clone(s).(*runtimeapi.ContainerStatus)
		c.Reason = reasonOOMKilled
		f.containers[id] = c
	}
}

func (f *fakeCRI) removeContainer(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.containers, id)
	delete(f.sandboxOf, id)
}

func (f *fakeCRI) container(id string) *runtimeapi.ContainerStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.containers[id]
}

func (f *fakeCRI) sandbox(id string) *runtimeapi.PodSandboxStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sandboxes[id]
}

// sandboxStatus is a realistic PodSandboxStatus, as containerd's toCRISandboxStatus builds it.
func sandboxStatus(id string, at time.Time) *runtimeapi.PodSandboxStatus {
	name := "pod-" + id
	return &runtimeapi.PodSandboxStatus{
		Id:        id,
		Metadata:  &runtimeapi.PodSandboxMetadata{Name: name, Uid: "uid-" + id, Namespace: "default", Attempt: 0},
		State:     runtimeapi.PodSandboxState_SANDBOX_READY,
		CreatedAt: at.UnixNano(),
		Network:   &runtimeapi.PodSandboxNetworkStatus{Ip: "10.88.0.7", AdditionalIps: []*runtimeapi.PodIP{{Ip: "fd00::7"}}},
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: &runtimeapi.NamespaceOption{
			Network: runtimeapi.NamespaceMode_POD, Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD}}},
		Labels: map[string]string{
			"app": "web", "io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "default",
			"io.kubernetes.pod.uid": "uid-" + id, "pod-template-hash": "5d8f9c7b6",
		},
		Annotations: map[string]string{
			"kubernetes.io/config.seen": "2026-01-01T00:00:00.000000000Z", "kubernetes.io/config.source": "api",
		},
		RuntimeHandler: "runc",
	}
}

// containerStatus is a realistic ContainerStatus of a CREATED container, as toCRIContainerStatus builds it.
func containerStatus(id, sandbox string, at time.Time) *runtimeapi.ContainerStatus {
	name := "ctr-" + id
	return &runtimeapi.ContainerStatus{
		Id:        id,
		Metadata:  &runtimeapi.ContainerMetadata{Name: name, Attempt: 0},
		State:     runtimeapi.ContainerState_CONTAINER_CREATED,
		CreatedAt: at.UnixNano(),
		Image:     &runtimeapi.ImageSpec{Image: "registry.k8s.io/e2e-test-images/agnhost:2.53"},
		ImageRef:  "registry.k8s.io/e2e-test-images/agnhost@sha256:99c6b4bb4a1e1df3f0b3752168c89358794d02258ebebc26bf21c29399011a85",
		ImageId:   "sha256:b5e4d4a2b9a4ad4b8a5e1c1b6f1c8d6b0e0d2f8e7c6b5a4d3c2b1a0f9e8d7c6b",
		Labels: map[string]string{
			"io.kubernetes.container.name": name, "io.kubernetes.pod.name": "pod-" + sandbox,
			"io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": "uid-" + sandbox,
		},
		Annotations: map[string]string{
			"io.kubernetes.container.hash": "f3a1b2c4", "io.kubernetes.container.restartCount": "0",
			"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
			"io.kubernetes.container.terminationMessagePolicy": "File", "io.kubernetes.pod.terminationGracePeriod": "30",
			"io.kubernetes.container.ports": `[{"name":"http","containerPort":8080,"protocol":"TCP"}]`,
		},
		Mounts: []*runtimeapi.Mount{
			{ContainerPath: "/var/run/secrets/kubernetes.io/serviceaccount", HostPath: "/var/lib/kubelet/pods/uid-" + sandbox + "/volumes/kubernetes.io~projected/kube-api-access-x7k2p", Readonly: true, SelinuxRelabel: false},
			{ContainerPath: "/etc/hosts", HostPath: "/var/lib/kubelet/pods/uid-" + sandbox + "/etc-hosts"},
			{ContainerPath: "/dev/termination-log", HostPath: "/var/lib/kubelet/pods/uid-" + sandbox + "/containers/" + name + "/0a1b2c3d"},
		},
		LogPath: "/var/log/pods/default_pod-" + sandbox + "_uid-" + sandbox + "/" + name + "/0.log",
		Resources: &runtimeapi.ContainerResources{Linux: &runtimeapi.LinuxContainerResources{
			CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512, MemoryLimitInBytes: 268435456, OomScoreAdj: 936,
		}},
		User:       &runtimeapi.ContainerUser{Linux: &runtimeapi.LinuxContainerUser{Uid: 0, Gid: 0, SupplementalGroups: []int64{0, 1, 2, 3, 4, 6, 10, 11, 20, 26, 27}}},
		StopSignal: runtimeapi.Signal_SIGNAL_SIGTERM,
	}
}

// countingMetrics counts what the tests look at.
type countingMetrics struct {
	NopMetrics
	mu          sync.Mutex
	suppressed  map[string]int
	dropped     map[string]int
	corrected   int
	repairs     map[string]int
	repairsLate map[string]int
	coalesced   int
	evicted     int
	evictedWhy  []string // the reasons of the evictions, in order
	mismatch    int
	emitted     int
	ticks       int // emitted with SourceTick
}

func newCountingMetrics() *countingMetrics {
	return &countingMetrics{suppressed: map[string]int{}, dropped: map[string]int{}, repairs: map[string]int{}, repairsLate: map[string]int{}}
}

func (m *countingMetrics) ObservationSuppressed(_ Source, reason string) {
	m.mu.Lock()
	m.suppressed[reason]++
	m.mu.Unlock()
}
func (m *countingMetrics) ObjectDropped(k Kind, reason string) {
	m.mu.Lock()
	m.dropped[reason]++
	m.mu.Unlock()
}
func (m *countingMetrics) EventCorrected(Kind, Source) { m.mu.Lock(); m.corrected++; m.mu.Unlock() }
func (m *countingMetrics) EventEmitted(_ runtimeapi.ContainerEventType, _ Kind, src Source, _ time.Duration) {
	m.mu.Lock()
	m.emitted++
	if src == SourceTick {
		m.ticks++
	}
	m.mu.Unlock()
}
func (m *countingMetrics) RelistRepair(k Kind, t runtimeapi.ContainerEventType) {
	m.mu.Lock()
	m.repairs[k.String()+"_"+eventName(t)]++
	m.mu.Unlock()
}
func (m *countingMetrics) RelistRepairLate(k Kind, t runtimeapi.ContainerEventType) {
	m.mu.Lock()
	m.repairsLate[k.String()+"_"+eventName(t)]++
	m.mu.Unlock()
}
func (m *countingMetrics) EventsCoalesced(n int) { m.mu.Lock(); m.coalesced += n; m.mu.Unlock() }
func (m *countingMetrics) SubscriberEvicted(_ uint64, reason string) {
	m.mu.Lock()
	m.evicted++
	m.evictedWhy = append(m.evictedWhy, reason)
	m.mu.Unlock()
}
func (m *countingMetrics) StatusMismatch(Kind) { m.mu.Lock(); m.mismatch++; m.mu.Unlock() }

func eventName(t runtimeapi.ContainerEventType) string {
	return strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(t.String(), "CONTAINER_"), "_EVENT"))
}

// harness is a PLEG on a fake clock and a fake CRI, driven synchronously.
type harness struct {
	t       testing.TB
	ctx     context.Context
	clock   *testutil.Clock
	cri     *fakeCRI
	metrics *countingMetrics
	p       *PLEG
	sub     *Subscription
}

func newHarness(t testing.TB, mod ...func(*Config)) *harness {
	h := &harness{t: t, ctx: context.Background(), clock: testutil.NewClock(), cri: newFakeCRI(), metrics: newCountingMetrics()}
	// The harness's subscriber reads when the test says, however long after on the manual clock: no
	// stall timeout (stall_test.go sets one).
	cfg := Config{Status: h.cri, Lister: h.cri, Clock: h.clock.Now, Metrics: h.metrics, SubscriberQueue: 1 << 16,
		SubscriberStallTimeout: -1}
	for _, m := range mod {
		m(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.p = p
	h.sub = p.Subscribe()
	if cfg.Lister != nil {
		// The startup reconciliation, on an empty runtime: the tests' relists are the later ones.
		if _, err := p.Relist(h.ctx); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// observe hands observations to the PLEG and applies them (no status call).
func (h *harness) observe(obs ...Observation) {
	for _, o := range obs {
		h.p.Observe(o)
	}
	h.p.drain(h.ctx)
}

// settle applies the inbox and runs every queued status call (delayed ones included) until quiet.
func (h *harness) settle() {
	settle(h.ctx, h.p)
}

func settle(ctx context.Context, p *PLEG) {
	for range 100000 {
		p.drain(ctx)
		batch, _ := p.fetch.take(p.clock(), true)
		if len(batch) == 0 {
			return
		}
		for _, r := range batch {
			res := p.callStatus(ctx, r)
			p.enqueue(input{res: &res})
		}
	}
	panic("settle: no quiescence")
}

// runDue runs the status calls due now (not the delayed ones) once, and applies their answers.
func (h *harness) runDue() {
	h.p.drain(h.ctx)
	batch, _ := h.p.fetch.take(h.clock.Now(), false)
	for _, r := range batch {
		res := h.p.callStatus(h.ctx, r)
		h.p.enqueue(input{res: &res})
	}
	h.p.drain(h.ctx)
}

// events returns the events queued for the harness's subscriber.
func (h *harness) events() []Event { return pending(h.sub) }

func pending(s *Subscription) []Event {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out []Event
	for {
		ev, err := s.Next(ctx)
		if err != nil {
			return out
		}
		out = append(out, ev)
	}
}

// summary renders events as "TYPE id".
func summary(evs []Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = strings.ToUpper(eventName(ev.Response.ContainerEventType)) + " " + ev.Response.ContainerId
	}
	return out
}

// Observation builders, as the inputs make them.

func nriSandbox(id string, ph Phase, at time.Time) Observation {
	return Observation{Source: SourceNRI, Kind: KindSandbox, ID: id, SandboxID: id, Phase: ph, SourceTime: at}
}

func nriContainer(id, sb string, ph Phase, at time.Time) Observation {
	return Observation{Source: SourceNRI, Kind: KindContainer, ID: id, SandboxID: sb, Phase: ph, SourceTime: at}
}

func nriExit(id, sb string, code int32, finished, at time.Time) Observation {
	o := nriContainer(id, sb, PhaseExited, at)
	o.ExitCode, o.HasExitCode, o.FinishedAt = code, true, finished
	return o
}

func taskExit(id string, code int32, finished time.Time) Observation {
	return Observation{Source: SourceTaskEvent, ID: id, Phase: PhaseExited, ExitCode: code, HasExitCode: true, FinishedAt: finished, SourceTime: finished}
}

func taskOOM(id string, at time.Time) Observation {
	return Observation{Source: SourceTaskEvent, ID: id, OOMKilled: true, SourceTime: at}
}

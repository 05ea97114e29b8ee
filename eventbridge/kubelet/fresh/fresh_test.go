package fresh

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/kubelettest"
	"github.com/pleg-nri/pleg-nri/internal/grpcraw"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// laggingRuntime says "running" for c1 (container) and s1 (sandbox) until its first behind answers
// were given, then "exited" / "not ready", like containerd's CRI while its exit handler runs.
type laggingRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	behind atomic.Int64 // answers still to give with the old state
	calls  atomic.Int64
}

func (r *laggingRuntime) containerState() runtimeapi.ContainerState {
	r.calls.Add(1)
	if r.behind.Add(-1) >= 0 {
		return runtimeapi.ContainerState_CONTAINER_RUNNING
	}
	return runtimeapi.ContainerState_CONTAINER_EXITED
}

func (r *laggingRuntime) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	if req.GetContainerId() == "c0" {
		return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: "c0", State: runtimeapi.ContainerState_CONTAINER_RUNNING}}, nil
	}
	st := &runtimeapi.ContainerStatus{Id: "c1", State: r.containerState(), StartedAt: 10, CreatedAt: 5,
		Image: &runtimeapi.ImageSpec{Image: "runtime-image"}, Labels: map[string]string{"from": "runtime"}}
	if st.State == runtimeapi.ContainerState_CONTAINER_EXITED {
		st.ExitCode, st.FinishedAt, st.Reason = 7, 42, "Error"
	}
	return &runtimeapi.ContainerStatusResponse{Status: st}, nil
}

func (r *laggingRuntime) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{
		{Id: "c0", State: runtimeapi.ContainerState_CONTAINER_RUNNING}, {Id: "c1", State: r.containerState()}}}, nil
}

func (r *laggingRuntime) PodSandboxStatus(context.Context, *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	return &runtimeapi.PodSandboxStatusResponse{
		Status:             &runtimeapi.PodSandboxStatus{Id: "s0", State: runtimeapi.PodSandboxState_SANDBOX_READY},
		ContainersStatuses: []*runtimeapi.ContainerStatus{{Id: "c1", State: r.containerState()}},
	}, nil
}

func (r *laggingRuntime) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	st := runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	if r.containerState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
		st = runtimeapi.PodSandboxState_SANDBOX_READY
	}
	return &runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{{Id: "s1", State: st}}}, nil
}

type overlaidReads struct {
	// mu guards overlaid.
	mu       sync.Mutex
	overlaid []string // methods, per overlaid read
}

// snapshot returns the overlaid reads reported so far.
func (m *overlaidReads) snapshot() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.overlaid)
}

func (m *overlaidReads) OverlaidRead(method string) {
	m.mu.Lock()
	m.overlaid = append(m.overlaid, method)
	m.mu.Unlock()
}

type freshMetrics struct {
	kubelet.NopMetrics
	*overlaidReads
}

// stoppedEvents are the STOPPED events the fake source sends for c1 (container of sandbox s0, exit 7)
// and s1 (a sandbox), as pleg-nri sends them ahead of the runtime.
func stoppedEvents() []*runtimeapi.ContainerEventResponse {
	sb := func(id string, st runtimeapi.PodSandboxState) *runtimeapi.PodSandboxStatus {
		return &runtimeapi.PodSandboxStatus{Id: id, State: st, Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Uid: "u-" + id}}
	}
	return []*runtimeapi.ContainerEventResponse{
		{ContainerId: "c1", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, CreatedAt: 100,
			PodSandboxStatus: sb("s0", runtimeapi.PodSandboxState_SANDBOX_READY),
			ContainersStatuses: []*runtimeapi.ContainerStatus{
				{Id: "c0", State: runtimeapi.ContainerState_CONTAINER_RUNNING},
				{Id: "c1", State: runtimeapi.ContainerState_CONTAINER_EXITED, ExitCode: 7, StartedAt: 10, FinishedAt: 42,
					Reason: "Error", Message: "bye", Image: &runtimeapi.ImageSpec{Image: "sent-image"}},
			}},
		{ContainerId: "s1", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, CreatedAt: 101,
			PodSandboxStatus: sb("s1", runtimeapi.PodSandboxState_SANDBOX_NOTREADY)},
	}
}

// freshEnv is a lagging runtime, a proxy with a read-freshness mode in front of it, and a client that
// subscribed to the proxy's events.
type freshEnv struct {
	rt      *laggingRuntime
	source  *kubelettest.Source
	metrics *overlaidReads
	client  runtimeapi.RuntimeServiceClient
	events  grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]
}

func newFreshEnv(t *testing.T, mode ReadFreshness) *freshEnv {
	t.Helper()
	dir := testutil.ShortTempDir(t, "eb-")
	e := &freshEnv{rt: &laggingRuntime{}, source: kubelettest.NewSource(), metrics: &overlaidReads{}}
	rtPath := filepath.Join(dir, "rt.sock")
	testutil.ServeGRPC(t, rtPath, func(srv *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(srv, e.rt) })
	backend := kubelettest.Connect(t, rtPath)
	metrics := freshMetrics{overlaidReads: e.metrics}
	hooks := mustHooks(t, Config{Runtime: backend, Metrics: metrics, ReadFreshness: mode})
	s, _ := kubelettest.Serve(t, filepath.Join(dir, "cri.sock"), kubelettest.Proxy(t, kubelet.ProxyConfig{Backend: backend, Events: e.source,
		Metrics: metrics, Hooks: hooks}))
	e.client = runtimeapi.NewRuntimeServiceClient(kubelettest.Connect(t, s.Addr().String()))
	var err error
	if e.events, err = e.client.GetContainerEvents(kubelettest.Ctx(t), &runtimeapi.GetEventsRequest{}); err != nil {
		t.Fatal(err)
	}
	e.source.NextOpened(t)
	return e
}

// send publishes events and waits until the client got them.
func (e *freshEnv) send(t *testing.T, evs ...*runtimeapi.ContainerEventResponse) {
	t.Helper()
	for _, ev := range evs {
		e.source.Publish(ev)
	}
	for range evs {
		kubelettest.RecvEvent(t, e.events)
	}
}

// statusReads are the four status reads, each reporting whether its answer shows c1 exited (or s1 not
// ready).
func statusReads(ctx context.Context, c runtimeapi.RuntimeServiceClient) []struct {
	name string
	call func() (bool, error)
} {
	return []struct {
		name string
		call func() (bool, error)
	}{
		{"ContainerStatus", func() (bool, error) {
			r, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c1"})
			return r.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_EXITED, err
		}},
		{"ListContainers", func() (bool, error) {
			r, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
			return len(r.GetContainers()) == 2 && r.GetContainers()[1].GetState() == runtimeapi.ContainerState_CONTAINER_EXITED, err
		}},
		{"PodSandboxStatus", func() (bool, error) {
			r, err := c.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "s0"})
			return r.GetContainersStatuses()[0].GetState() == runtimeapi.ContainerState_CONTAINER_EXITED, err
		}},
		{"ListPodSandbox", func() (bool, error) {
			r, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
			return r.GetItems()[0].GetState() == runtimeapi.PodSandboxState_SANDBOX_NOTREADY, err
		}},
	}
}

// TestReadFreshnessOverlay: in the overlay mode, a status read whose answer shows running what the
// event stream reported stopped is answered at once, with the stopped status that was sent in the
// fields an exit changes and the runtime's answer in all others; once the runtime shows the stop, its
// own answers go through unchanged.
func TestReadFreshnessOverlay(t *testing.T) {
	ctx := kubelettest.Ctx(t)
	e := newFreshEnv(t, ReadFreshnessOverlay)
	e.send(t, stoppedEvents()...)
	e.rt.behind.Store(1 << 30)
	for _, read := range statusReads(ctx, e.client) {
		e.rt.calls.Store(0)
		fresh, err := read.call()
		if err != nil {
			t.Fatalf("%s: %v", read.name, err)
		}
		if !fresh || e.rt.calls.Load() != 1 {
			t.Errorf("%s: answer shows the stop %v after %d runtime calls, want true after 1", read.name, fresh, e.rt.calls.Load())
		}
	}
	wantOverlaid := []string{"/runtime.v1.RuntimeService/ContainerStatus", "/runtime.v1.RuntimeService/ListContainers",
		"/runtime.v1.RuntimeService/PodSandboxStatus", "/runtime.v1.RuntimeService/ListPodSandbox"}
	if overlaid := e.metrics.snapshot(); !slices.Equal(overlaid, wantOverlaid) {
		t.Errorf("overlaid reads reported: %v, want %v", overlaid, wantOverlaid)
	}

	r, err := e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	want := &runtimeapi.ContainerStatus{Id: "c1", State: runtimeapi.ContainerState_CONTAINER_EXITED, ExitCode: 7, CreatedAt: 5,
		StartedAt: 10, FinishedAt: 42, Reason: "Error", Message: "bye", Image: &runtimeapi.ImageSpec{Image: "runtime-image"},
		Labels: map[string]string{"from": "runtime"}}
	if diff := cmp.Diff(want, r.GetStatus(), protocmp.Transform()); diff != "" {
		t.Errorf("overlaid ContainerStatus (-want +got):\n%s", diff)
	}

	// A list of running containers no longer has c1.
	lr, err := e.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(lr.GetContainers()) != 1 || lr.GetContainers()[0].GetId() != "c0" {
		t.Errorf("running containers: %v, want c0 only", lr.GetContainers())
	}
	sr, err := e.client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(sr.GetItems()) != 0 {
		t.Errorf("ready sandboxes: %v, want none", sr.GetItems())
	}

	// The runtime catches up: its answers go through as they are, and the objects are forgotten.
	e.rt.behind.Store(0)
	if _, err := e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err != nil {
		t.Fatal(err)
	}
	e.rt.behind.Store(1 << 30)
	r, err = e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if r.GetStatus().GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("after the runtime caught up, c1 is still overlaid: %s", r.GetStatus().GetState())
	}
}

// TestReadFreshnessForgets: a DELETED sent for an object, and its sandbox's DELETED for a container, end
// the overlay; the mode off never changes an answer.
func TestReadFreshnessForgets(t *testing.T) {
	ctx := kubelettest.Ctx(t)
	state := func(e *freshEnv) runtimeapi.ContainerState {
		t.Helper()
		r, err := e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c1"})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetStatus().GetState()
	}
	for _, deleted := range []string{"c1", "s0"} {
		e := newFreshEnv(t, ReadFreshnessOverlay)
		e.rt.behind.Store(1 << 30)
		e.send(t, stoppedEvents()...)
		if got := state(e); got != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Fatalf("c1 %s, want overlaid EXITED", got)
		}
		e.send(t, &runtimeapi.ContainerEventResponse{ContainerId: deleted, CreatedAt: 200,
			ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT,
			PodSandboxStatus:   &runtimeapi.PodSandboxStatus{Id: "s0"}})
		if got := state(e); got != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("after a DELETED of %s: c1 %s, want the runtime's RUNNING", deleted, got)
		}
	}
	e := newFreshEnv(t, ReadFreshnessOff)
	e.rt.behind.Store(1 << 30)
	e.send(t, stoppedEvents()...)
	if got := state(e); got != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("mode off: c1 %s, want the runtime's RUNNING", got)
	}
}

// TestReadFreshnessTTL: an object the runtime never shows stopped is forgotten after stoppedTTL.
func TestReadFreshnessTTL(t *testing.T) {
	clock := testutil.NewClock()
	tr := newStoppedTracker(clock.Now, stoppedTTL)
	for _, ev := range stoppedEvents() {
		b, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		tr.observe(b)
	}
	if tr.container("c1") == nil || !tr.sandbox("s1") || tr.n.Load() != 2 {
		t.Fatalf("tracked: c1 %v s1 %v n %d, want both", tr.container("c1"), tr.sandbox("s1"), tr.n.Load())
	}
	clock.Advance(stoppedTTL)
	if tr.container("c1") != nil || tr.sandbox("s1") || tr.any() {
		t.Errorf("after the TTL: c1 %v s1 %v n %d, want none", tr.container("c1"), tr.sandbox("s1"), tr.n.Load())
	}
}

// sendCheck is a grpc.ServerStream that records, at each SendMsg, whether the proxy's tracker already
// knew the object of the event being sent.
type sendCheck struct {
	grpc.ServerStream
	ctx     context.Context
	tracker *stoppedTracker
	req     []byte
	sent    chan bool
}

func (s *sendCheck) Context() context.Context { return s.ctx }
func (s *sendCheck) RecvMsg(m any) error {
	return proto.Unmarshal(s.req, m.(proto.Message))
}
func (s *sendCheck) SendMsg(m any) error {
	h, _ := scanEvent(m.(*grpcraw.Frame).Data, false)
	id := h.id
	s.sent <- s.tracker.container(id) != nil || s.tracker.sandbox(id)
	return nil
}

// TestStoppedTrackedBeforeSend (issue 11, item 6): the proxy records a STOPPED before it writes it to
// the subscriber, so that a read the event causes always finds it.
func TestStoppedTrackedBeforeSend(t *testing.T) {
	src := kubelettest.NewSource()
	hook := hookOf[*freshReads](mustHooks(t, Config{ReadFreshness: ReadFreshnessOverlay}))
	events, err := kubelet.NewEventService(kubelet.EventServiceConfig{Source: src, Sending: hook.Sending})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := proto.Marshal(&runtimeapi.GetEventsRequest{})
	ss := &sendCheck{ctx: ctx, tracker: hook.tracker, req: req, sent: make(chan bool, 10)}
	done := make(chan error, 1)
	go func() { done <- events.Serve(ss) }()
	src.NextOpened(t)
	for _, ev := range stoppedEvents() {
		src.Publish(ev)
		if !kubelettest.Recv(t, ss.sent, "the send of "+ev.ContainerId) {
			t.Errorf("%s was written before the proxy tracked it", ev.ContainerId)
		}
	}
	cancel()
	kubelettest.Recv(t, done, "Serve to return")
}

// BenchmarkOverlayListContainers: the proxy's own work on a ListContainers answer of 100 containers
// while one object is ahead of the runtime: "related", the answer holds it (decode, overlay, encode);
// "unrelated", it does not (only the scan for tracked ids).
func BenchmarkOverlayListContainers(b *testing.B) {
	tr := newStoppedTracker(time.Now, stoppedTTL)
	for _, ev := range stoppedEvents() {
		eb, _ := proto.Marshal(ev)
		tr.observe(eb)
	}
	list := func(prefix string) []byte {
		var l runtimeapi.ListContainersResponse
		for i := 0; i < 100; i++ {
			id := fmt.Sprintf("%s%d", prefix, i+1)
			l.Containers = append(l.Containers, &runtimeapi.Container{Id: id, PodSandboxId: "sb", State: runtimeapi.ContainerState_CONTAINER_RUNNING,
				Metadata: &runtimeapi.ContainerMetadata{Name: id}, Image: &runtimeapi.ImageSpec{Image: "busybox"}, ImageRef: "sha256:0123456789abcdef",
				Labels: map[string]string{"io.kubernetes.pod.uid": "u", "io.kubernetes.container.name": id}})
		}
		b, _ := proto.Marshal(&l)
		return b
	}
	req, _ := proto.Marshal(&runtimeapi.ListContainersRequest{})
	fix := readFixes["/runtime.v1.RuntimeService/ListContainers"]
	b.Run("related", func(b *testing.B) {
		answer := list("c")
		b.ReportAllocs()
		for b.Loop() {
			if !tr.mentioned(answer) || fix.overlay(tr, req, answer) == nil {
				b.Fatal("c1 not overlaid")
			}
		}
	})
	b.Run("unrelated", func(b *testing.B) {
		answer := list("x")
		b.ReportAllocs()
		for b.Loop() {
			if tr.mentioned(answer) {
				b.Fatal("mentioned")
			}
		}
	})
}

package fresh

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/kubelettest"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// stopRuntime is a CRI runtime with one pod (sandbox s1, containers c1 and c2) that stops what it is
// asked to, except "bad", and lists with the id and sandbox filters.
type stopRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	// lists counts the ListContainers calls.
	lists *atomic.Int64
	// slowStart is where the StartContainer of "slow" waits until the test lets it go.
	slowStart chan struct{}
}

var stopRuntimeContainers = []*runtimeapi.Container{{Id: "c1", PodSandboxId: "s1"}, {Id: "c2", PodSandboxId: "s1"}}

func (stopRuntime) StopContainer(_ context.Context, r *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	if r.ContainerId == "bad" {
		return nil, status.Error(codes.NotFound, "no such container")
	}
	return &runtimeapi.StopContainerResponse{}, nil
}

func (rt stopRuntime) StartContainer(_ context.Context, r *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	if r.ContainerId == "slow" {
		<-rt.slowStart
	}
	return &runtimeapi.StartContainerResponse{}, nil
}

func (stopRuntime) StopPodSandbox(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (rt stopRuntime) ListContainers(_ context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	rt.lists.Add(1)
	var out []*runtimeapi.Container
	for _, c := range stopRuntimeContainers {
		if f := r.GetFilter(); (f.GetId() == "" || f.GetId() == c.Id) && (f.GetPodSandboxId() == "" || f.GetPodSandboxId() == c.PodSandboxId) {
			out = append(out, c)
		}
	}
	return &runtimeapi.ListContainersResponse{Containers: out}, nil
}

func (stopRuntime) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: r.ContainerId}}, nil
}

// refreshAsk is one refresh the front asked the core for.
type refreshAsk struct {
	id string
	at time.Time
}

// afterStopEnv is the front's proxy (RefreshAfterStop) in front of stopRuntime, whose refreshes go to
// asks (the front's go to the core: corelink.Relay.RefreshStopped).
type afterStopEnv struct {
	client runtimeapi.RuntimeServiceClient
	asks   chan refreshAsk
	// source is what the proxy's event streams send; lists counts the runtime's ListContainers.
	source *kubelettest.Source
	lists  *atomic.Int64
	// slowStart lets the runtime answer the StartContainer of "slow".
	slowStart chan struct{}
}

func newAfterStopEnv(t *testing.T, quiet, maxWait time.Duration) *afterStopEnv {
	return newAfterStopEnvEarly(t, quiet, maxWait, 0, 0)
}

// newAfterStopEnvEarly is newAfterStopEnv with the early exit's window and quiet time (0: the
// defaults).
func newAfterStopEnvEarly(t *testing.T, quiet, maxWait, earlyWindow, earlyQuiet time.Duration) *afterStopEnv {
	t.Helper()
	dir := testutil.ShortTempDir(t, "as-")
	rtPath := filepath.Join(dir, "rt.sock")
	e := &afterStopEnv{asks: make(chan refreshAsk, 16), source: kubelettest.NewSource(), lists: new(atomic.Int64), slowStart: make(chan struct{})}
	testutil.ServeGRPC(t, rtPath, func(s *grpc.Server) {
		runtimeapi.RegisterRuntimeServiceServer(s, stopRuntime{lists: e.lists, slowStart: e.slowStart})
	})
	refresh := func(_ context.Context, id string) error {
		e.asks <- refreshAsk{id, time.Now()}
		return nil
	}
	backend := kubelettest.Connect(t, rtPath)
	hooks := mustHooks(t, Config{Runtime: backend, ReadFreshness: ReadFreshnessOff, Refresh: refresh, RefreshAfterStop: true})
	settle := hookOf[*stopRefresher](hooks)
	settle.quiet, settle.max = quiet, maxWait
	if earlyWindow > 0 {
		settle.earlyWindow, settle.earlyQuiet = earlyWindow, earlyQuiet
	}
	srv, _ := kubelettest.Serve(t, filepath.Join(dir, "front.sock"), kubelettest.Proxy(t, kubelet.ProxyConfig{Backend: backend,
		Events: e.source, Hooks: hooks}))
	e.client = runtimeapi.NewRuntimeServiceClient(kubelettest.Connect(t, srv.Addr().String()))
	return e
}

// relay sends evs to a client of the proxy's event stream (opened by the first call), and waits until
// it got them.
func (e *afterStopEnv) relay(t *testing.T, events *grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse], evs ...*runtimeapi.ContainerEventResponse) {
	t.Helper()
	if *events == nil {
		var err error
		if *events, err = e.client.GetContainerEvents(kubelettest.Ctx(t), &runtimeapi.GetEventsRequest{}); err != nil {
			t.Fatal(err)
		}
		e.source.NextOpened(t)
	}
	for _, ev := range evs {
		e.source.Publish(ev)
	}
	for range evs {
		kubelettest.RecvEvent(t, *events)
	}
}

// noAsk fails t if a refresh is asked for within d.
func (e *afterStopEnv) noAsk(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case a := <-e.asks:
		t.Fatalf("unexpected refresh of %s", a.id)
	case <-time.After(d):
	}
}

// TestRefreshAfterStop: the front asks the core for one refresh per stopped pod, of the sandbox once it
// was stopped, only once the calls about the pod have been quiet for the quiet time, and for none
// after a stop that failed.
func TestRefreshAfterStop(t *testing.T) {
	const quiet = 100 * time.Millisecond
	e := newAfterStopEnv(t, quiet, 5*time.Second)
	ctx := kubelettest.Ctx(t)

	// The kubelet's termination: the containers' stops, the sandbox's, then its reads of the pod.
	for _, c := range []string{"c1", "c2"} {
		if _, err := e.client.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: c}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: "s1"}); err != nil {
		t.Fatal(err)
	}
	// last is when the last read was sent: the endpoint receives it after that, so its quiet time ends
	// after last+quiet (a time taken after the call returns would be later than the endpoint's own).
	var last time.Time
	for range 5 {
		time.Sleep(quiet / 2)
		last = time.Now()
		if _, err := e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c2"}); err != nil {
			t.Fatal(err)
		}
	}
	a := kubelettest.Recv(t, e.asks, "the refresh after the pod's stop")
	if a.id != "s1" {
		t.Errorf("refresh of %s, want the sandbox s1", a.id)
	}
	if a.at.Before(last.Add(quiet)) {
		t.Errorf("refresh asked %s after the last read of the pod, before the quiet time %s", a.at.Sub(last), quiet)
	}
	e.noAsk(t, 3*quiet)

	// A container's stop alone: its own refresh.
	if _, err := e.client.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: "c1"}); err != nil {
		t.Fatal(err)
	}
	if a := kubelettest.Recv(t, e.asks, "the refresh after a container's stop"); a.id != "c1" {
		t.Errorf("refresh of %s, want c1", a.id)
	}

	// A failed stop: none.
	if _, err := e.client.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: "bad"}); status.Code(err) != codes.NotFound {
		t.Fatalf("stop of bad: %v, want NotFound", err)
	}
	e.noAsk(t, 3*quiet)
}

// TestRefreshAfterStopBounded: calls about the pod that never stop do not hold the refresh for ever:
// it comes while they go on (without the bound it would wait for them to stop), and not before the
// bound.
func TestRefreshAfterStopBounded(t *testing.T) {
	const quiet, maxWait = 200 * time.Millisecond, 500 * time.Millisecond
	e := newAfterStopEnv(t, quiet, maxWait)
	ctx := kubelettest.Ctx(t)
	start := time.Now()
	if _, err := e.client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: "s1"}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(quiet / 4):
			}
			_, _ = e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c1"})
		}
	})
	a := kubelettest.Recv(t, e.asks, "the bounded refresh")
	close(done)
	wg.Wait()
	if a.id != "s1" {
		t.Errorf("refresh of %s, want s1", a.id)
	}
	if d := a.at.Sub(start); d < maxWait {
		t.Errorf("refresh %s after the stop, before the bound %s although reads of the pod went on", d, maxWait)
	}
}

// podEvent is an event of object id of pod s1, whose statuses list the containers.
func podEvent(id string, typ runtimeapi.ContainerEventType, containers ...string) *runtimeapi.ContainerEventResponse {
	ev := kubelettest.Event(id, typ)
	ev.ContainersStatuses = nil
	for _, c := range containers {
		ev.ContainersStatuses = append(ev.ContainersStatuses, &runtimeapi.ContainerStatus{Id: c, Metadata: &runtimeapi.ContainerMetadata{Name: c}})
	}
	return ev
}

// TestRefreshAfterStopFromRelayedEvents (issue 57): the refresh after a stop takes the pod of a stopped
// container, and the pod's containers, from the events the endpoint already sent, without asking the
// runtime; the runtime is asked only about a container no event named, and a pod's DELETED is
// forgotten.
func TestRefreshAfterStopFromRelayedEvents(t *testing.T) {
	const quiet = 50 * time.Millisecond
	e := newAfterStopEnv(t, quiet, 5*time.Second)
	ctx := kubelettest.Ctx(t)
	var events grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]
	created := runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
	e.relay(t, &events, podEvent("s1", runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT),
		podEvent("c1", created, "c1"), podEvent("c2", created, "c1", "c2"))

	if _, err := e.client.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: "c1"}); err != nil {
		t.Fatal(err)
	}
	// c2's read pushes the end of the pod's settling: c2 is known to be s1's from the events.
	time.Sleep(quiet / 2)
	if _, err := e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c2"}); err != nil {
		t.Fatal(err)
	}
	if a := kubelettest.Recv(t, e.asks, "the refresh after c1's stop"); a.id != "c1" {
		t.Errorf("refresh of %s, want c1", a.id)
	}
	if n := e.lists.Load(); n != 0 {
		t.Errorf("the runtime was asked %d times for the pod of a container the events named, want 0", n)
	}

	// The pod deleted: its containers are no longer known, and the runtime is asked again.
	e.relay(t, &events, podEvent("s1", runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT))
	if _, err := e.client.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: "c2"}); err != nil {
		t.Fatal(err)
	}
	if a := kubelettest.Recv(t, e.asks, "the refresh after c2's stop"); a.id != "c2" {
		t.Errorf("refresh of %s, want c2", a.id)
	}
	if n := e.lists.Load(); n != 2 {
		t.Errorf("the runtime was asked %d times for the pod of a container no live event named, want 2", n)
	}
}

// TestRefreshAfterEarlyExit (issue 59): a container that exits right after the kubelet started it (an
// init container, a job) gets its STOPPED sent again once the calls about its pod have been quiet for
// the early exit's quiet time. Kubelet 1.37 relists the pod on the first STOPPED while the sync that
// the start's own relist began still runs with the container shown running; that sync ends after the
// relist began, so the pod's next sync waits for a status newer than its end: the next 1 s relist,
// unless the refresh's relist gives one (docs/workloads-standalone.md). A container that exits long
// after its start, or that the endpoint never started, gets none.
func TestRefreshAfterEarlyExit(t *testing.T) {
	const quiet, window, early = 200 * time.Millisecond, 300 * time.Millisecond, 20 * time.Millisecond
	e := newAfterStopEnvEarly(t, quiet, 5*time.Second, window, early)
	ctx := kubelettest.Ctx(t)
	var events grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]
	stopped := runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
	e.relay(t, &events, podEvent("s1", runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT),
		podEvent("c1", runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT, "c1"))

	// c1 started, and exits at once.
	if _, err := e.client.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: "c1"}); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	e.relay(t, &events, podEvent("c1", stopped, "c1"))
	a := kubelettest.Recv(t, e.asks, "the refresh after c1's early exit")
	if a.id != "c1" {
		t.Errorf("refresh of %s, want c1", a.id)
	}
	if d := a.at.Sub(sent); d < early {
		t.Errorf("refresh asked %s after the STOPPED, before the early exit's quiet time %s", d, early)
	}
	e.noAsk(t, 3*early)

	// c2 exits after the window: none.
	if _, err := e.client.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: "c2"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(window + window/2)
	e.relay(t, &events, podEvent("c2", stopped, "c1", "c2"))
	e.noAsk(t, 5*early)

	// A container the endpoint never started: none.
	e.relay(t, &events, podEvent("c3", stopped, "c1", "c2", "c3"))
	e.noAsk(t, 5*early)

	// A container whose STOPPED is sent before the runtime answered its start: refreshed, once.
	started := make(chan error, 1)
	go func() {
		_, err := e.client.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: "slow"})
		started <- err
	}()
	for range 100 {
		// The endpoint has the call once the runtime holds it: retry the STOPPED's wait until then.
		e.relay(t, &events, podEvent("slow", stopped, "c1", "slow"))
		select {
		case a := <-e.asks:
			if a.id != "slow" {
				t.Errorf("refresh of %s, want slow", a.id)
			}
			close(e.slowStart)
			if err := <-started; err != nil {
				t.Fatal(err)
			}
			e.noAsk(t, 5*early)
			return
		case <-time.After(10 * early):
		}
	}
	t.Fatal("no refresh of a container whose STOPPED was sent while its start was under way")
}

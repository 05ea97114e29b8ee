package corelink

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/fresh"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/kubelettest"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// The front's event path as it runs in pleg-nri's front process: the kubelet's endpoint (a Proxy in a
// read-freshness mode) whose events come from a Relay of the core's event socket (a Proxy over the
// core's fan-out, here a fakeSource).

// frontOverRelay serves, at dir/front.sock, a Proxy in mode whose events come from a Relay of the core at
// dir/core.sock (started or not). It returns the front's server, its metrics and the relay's
// resubscription count.
func frontOverRelay(t *testing.T, dir string, mode fresh.ReadFreshness) (*kubelet.Server, *streamMetrics, *atomic.Int64) {
	t.Helper()
	resubscribed := new(atomic.Int64)
	relay, err := DialRelay(RelayConfig{Endpoint: "unix://" + filepath.Join(dir, "core.sock"), Resubscribed: func() { resubscribed.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	metrics := &streamMetrics{}
	backend := runtimeConn(t)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	hooks, err := fresh.Hooks(fresh.Config{Runtime: backend, Metrics: metrics, ReadFreshness: mode, Refresh: relay.RefreshStopped, Done: done})
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := startServer(t, filepath.Join(dir, "front.sock"), kubelet.ProxyConfig{Backend: backend, Events: relay, Metrics: metrics, Hooks: hooks})
	return srv, metrics, resubscribed
}

// TestFrontRelaysBurst (issue 26): a burst of events through the front reaches its client whole and in
// order, in both read-freshness modes. A refresh event of the (since retired) hold mode, built in the
// front, used to end the relay's Next to make room for itself, which ended the relay's upstream stream:
// the events the core had queued for it were lost (2, 1 and 15 of 3,000 in three runs) and the relay
// subscribed again. The core sends every refresh now, in its stream (fresh.Config.Refresh).
func TestFrontRelaysBurst(t *testing.T) {
	const burst = 3000
	for _, mode := range []fresh.ReadFreshness{fresh.ReadFreshnessOverlay, fresh.ReadFreshnessOff} {
		t.Run(string(mode), func(t *testing.T) {
			dir := testutil.ShortTempDir(t, "eb-")
			core := startUpstream(t, filepath.Join(dir, "core.sock"))
			_, _, resubscribed := frontOverRelay(t, dir, mode)
			client := runtimeapi.NewRuntimeServiceClient(kubelettest.Connect(t, filepath.Join(dir, "front.sock")))
			stream, err := client.GetContainerEvents(kubelettest.Ctx(t), &runtimeapi.GetEventsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			core.src.NextOpened(t)
			go func() {
				for i := range burst {
					core.src.Publish(kubelettest.Event(fmt.Sprintf("e%d", i), runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT))
				}
			}()
			for got := range burst {
				ev := kubelettest.RecvEvent(t, stream)
				if want := fmt.Sprintf("e%d", got); ev.GetContainerId() != want {
					t.Fatalf("event %d of the burst is %s, want %s (%d lost)", got, ev.GetContainerId(), want, lost(ev.GetContainerId(), got))
				}
			}
			if n := resubscribed.Load(); n != 0 {
				t.Errorf("the relay subscribed again %d times with the core running, want 0", n)
			}
		})
	}
}

// lost is how many events of the burst were skipped when e<got> was expected and id came.
func lost(id string, got int) int {
	var n int
	if _, err := fmt.Sscanf(id, "e%d", &n); err != nil {
		return -1
	}
	return n - got
}

// TestFrontStopsWithoutCore (issue 26): a front whose core is absent (never started, stopped, or gone
// with its streams open) ends a subscriber's stream when the subscriber leaves and stops within its
// stop deadline with subscribers still connected. Its event streams used to wait in the relay for a
// core that does not come back, on a context that neither the client nor the stop ended, and the
// server's stop waited for them for ever.
func TestFrontStopsWithoutCore(t *testing.T) {
	for _, core := range []string{"never started", "stopped", "stopped with its streams open"} {
		t.Run(core, func(t *testing.T) {
			dir := testutil.ShortTempDir(t, "eb-")
			var up *upstreamCore
			if core != "never started" {
				up = startUpstream(t, filepath.Join(dir, "core.sock"))
			}
			if core == "stopped" {
				up.stop()
			}
			front, metrics, _ := frontOverRelay(t, dir, fresh.ReadFreshnessOverlay)
			client := runtimeapi.NewRuntimeServiceClient(kubelettest.Connect(t, filepath.Join(dir, "front.sock")))
			subscribe := func(ctx context.Context) {
				t.Helper()
				if _, err := client.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{}); err != nil {
					t.Fatal(err)
				}
			}
			leaving, leave := context.WithCancel(context.Background())
			defer leave()
			subscribe(leaving)
			staying, stay := context.WithCancel(context.Background())
			defer stay()
			subscribe(staying)
			testutil.Eventually(t, kubelettest.WaitTimeout, "both streams to open", func() bool { open, _ := metrics.streams(); return open == 2 })
			if core == "stopped with its streams open" {
				up.src.NextOpened(t)
				up.src.NextOpened(t)
				up.stop()
			}

			// A subscriber that leaves ends its stream.
			leave()
			testutil.Eventually(t, kubelettest.WaitTimeout, "the leaving subscriber's stream to end", func() bool {
				open, closed := metrics.streams()
				return open == 1 && slices.Equal(closed, []codes.Code{codes.Canceled})
			})

			// The stop ends the other within its deadline.
			stopCtx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			stopped := make(chan struct{})
			go func() {
				front.Stop(stopCtx)
				close(stopped)
			}()
			kubelettest.Recv(t, stopped, "the front's server to stop")
			if open, closed := metrics.streams(); open != 0 || !slices.Equal(closed, []codes.Code{codes.Canceled, codes.Unavailable}) {
				t.Errorf("after the stop: %d event streams open, closed with %v; want none open, closed with [Canceled Unavailable]", open, closed)
			}
		})
	}
}

// linkRuntime is a runtime with two containers, c0 and c1, running; it stops what it is asked to.
type linkRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (linkRuntime) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	if r.GetContainerId() != "c0" && r.GetContainerId() != "c1" {
		return nil, status.Errorf(codes.NotFound, "container %q not found", r.GetContainerId())
	}
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: r.GetContainerId(), State: runtimeapi.ContainerState_CONTAINER_RUNNING}}, nil
}

func (linkRuntime) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{{Id: "c0"}, {Id: "c1"}}}, nil
}

func (linkRuntime) StopContainer(context.Context, *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	return &runtimeapi.StopContainerResponse{}, nil
}

// linkEnv is a front over a Relay of a Core, both in front of a linkRuntime.
type linkEnv struct {
	src       *kubelettest.Source
	refreshed chan string
	relay     *Relay
	stopCore  func()
	core      *grpc.ClientConn
	client    runtimeapi.RuntimeServiceClient
}

func newLinkEnv(t *testing.T) *linkEnv {
	t.Helper()
	dir := testutil.ShortTempDir(t, "cl-")
	rtPath := filepath.Join(dir, "rt.sock")
	testutil.ServeGRPC(t, rtPath, func(s *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(s, linkRuntime{}) })
	e := &linkEnv{src: kubelettest.NewSource(), refreshed: make(chan string, 4)}
	var core *kubelet.Server
	core, e.stopCore = kubelettest.Serve(t, filepath.Join(dir, "core.sock"), mustCore(t, CoreConfig{Events: e.src,
		RefreshStopped: func(id string) { e.refreshed <- id }}))
	var err error
	if e.relay, err = DialRelay(RelayConfig{Endpoint: "unix://" + core.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.relay.Close() })
	front, _ := startServer(t, filepath.Join(dir, "front.sock"), kubelet.ProxyConfig{Backend: kubelettest.Connect(t, rtPath), Events: e.relay})
	e.client = runtimeapi.NewRuntimeServiceClient(kubelettest.Connect(t, front.Addr().String()))
	e.core = kubelettest.Connect(t, core.Addr().String())
	return e
}

// TestRefreshStoppedThroughTheCore: a front's refresh (fresh.Config.Refresh) reaches the core's
// RefreshStopped with the id; a request without an id is refused.
func TestRefreshStoppedThroughTheCore(t *testing.T) {
	e := newLinkEnv(t)
	ctx := kubelettest.Ctx(t)
	if err := e.relay.RefreshStopped(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if id := kubelettest.Recv(t, e.refreshed, "the core's RefreshStopped"); id != "c1" {
		t.Errorf("the core refreshed %q, want c1", id)
	}
	if err := e.relay.RefreshStopped(ctx, ""); status.Code(err) != codes.InvalidArgument {
		t.Errorf("RefreshStopped without an id: %v, want INVALID_ARGUMENT", err)
	}
}

// TestCoreSocketIsNoCRIEndpoint (issue 57): the core's socket answers the front's methods only; every
// other CRI call is UNIMPLEMENTED with a message that names the endpoints to use, and reaches no
// runtime.
func TestCoreSocketIsNoCRIEndpoint(t *testing.T) {
	e := newLinkEnv(t)
	ctx := kubelettest.Ctx(t)
	core := runtimeapi.NewRuntimeServiceClient(e.core)
	_, err := core.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: "c0"})
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "kubelet's CRI endpoint") {
		t.Errorf("StopContainer on the core's socket: %v, want UNIMPLEMENTED naming the kubelet's endpoint", err)
	}
	if _, err := runtimeapi.NewImageServiceClient(e.core).ListImages(ctx, &runtimeapi.ListImagesRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("ListImages on the core's socket: %v, want UNIMPLEMENTED", err)
	}
	// Its event stream is the CRI's, for any CRI client.
	stream, err := core.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.src.NextOpened(t)
	e.src.Publish(kubelettest.Event("c9", runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT))
	if ev := kubelettest.RecvEvent(t, stream); ev.GetContainerId() != "c9" {
		t.Errorf("the core's stream sent %s, want c9", ev.GetContainerId())
	}
}

// TestEventStreamCapsThroughTheFront: the front's relay carries every stream of the kubelet's endpoint
// to the core over one connection, so the core's socket (Core) has CoreMaxEventStreams in all and per
// connection: the front's kubelet.DefaultMaxEventStreams streams, from clients on
// kubelet.DefaultMaxEventStreams / kubelet.DefaultMaxEventStreamsPerConnection connections, all get the
// core's events, and the front refuses the next one itself. With the front's caps on the core instead
// (a kubelet.Proxy as the core), the core refuses the front's stream
// kubelet.DefaultMaxEventStreamsPerConnection+1, and its client gets that RESOURCE_EXHAUSTED.
func TestEventStreamCapsThroughTheFront(t *testing.T) {
	for _, tc := range []struct {
		name      string
		coreLimit int // the core's caps, both
		accepted  int // the front's streams that get events
		says      string
	}{
		{"core caps", CoreMaxEventStreams, kubelet.DefaultMaxEventStreams, fmt.Sprintf("at most %d in all", kubelet.DefaultMaxEventStreams)},
		{"front caps on the core", kubelet.DefaultMaxEventStreamsPerConnection, kubelet.DefaultMaxEventStreamsPerConnection, "at most 16 per connection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.ShortTempDir(t, "eb-")
			core := &upstreamCore{src: kubelettest.NewSource()}
			var service kubelet.Service = mustCore(t, CoreConfig{Events: core.src})
			if tc.coreLimit != CoreMaxEventStreams {
				service = kubelettest.Proxy(t, kubelet.ProxyConfig{Backend: runtimeConn(t), Events: core.src,
					MaxEventStreams: tc.coreLimit, MaxEventStreamsPerConnection: tc.coreLimit})
			}
			_, core.stop = kubelettest.Serve(t, filepath.Join(dir, "core.sock"), service)
			front, _, _ := frontOverRelay(t, dir, fresh.ReadFreshnessOff)
			ctx := kubelettest.Ctx(t)
			var clients []grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]
			var conn *grpc.ClientConn
			for i := range tc.accepted + 1 {
				if i%kubelet.DefaultMaxEventStreamsPerConnection == 0 {
					conn = kubelettest.Connect(t, front.Addr().String())
				}
				c, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
				if err != nil {
					t.Fatal(err)
				}
				clients = append(clients, c)
				if i < tc.accepted {
					core.src.NextOpened(t)
				}
			}
			if _, err := clients[tc.accepted].Recv(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("stream %d through the front: %v, want ResourceExhausted saying %q", tc.accepted+1, err, tc.says)
			}
			core.src.Publish(kubelettest.Event("c1", runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT))
			for i, c := range clients[:tc.accepted] {
				if got := kubelettest.RecvEvent(t, c); got.ContainerId != "c1" {
					t.Fatalf("stream %d got %s", i, got.ContainerId)
				}
			}
		})
	}
}

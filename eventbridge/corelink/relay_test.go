package corelink

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/kubelettest"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// serveRelay serves a Proxy whose events come from relay, and returns a client of it.
func serveRelay(t *testing.T, path string, relay *Relay) runtimeapi.RuntimeServiceClient {
	t.Helper()
	srv, _ := startServer(t, path, kubelet.ProxyConfig{Backend: runtimeConn(t), Events: relay})
	return runtimeapi.NewRuntimeServiceClient(kubelettest.Connect(t, srv.Addr().String()))
}

// waitConnState waits until conn is in state want.
func waitConnState(t *testing.T, conn *grpc.ClientConn, want connectivity.State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), kubelettest.WaitTimeout)
	defer cancel()
	for st := conn.GetState(); st != want; st = conn.GetState() {
		if !conn.WaitForStateChange(ctx, st) {
			t.Fatalf("connection still %s after %s, want %s", st, kubelettest.WaitTimeout, want)
		}
	}
}

// TestRelaySurvivesUpstreamRestarts: a client's stream through the relay stays open while the upstream
// ends its streams (UNAVAILABLE), goes away (its socket removed, then refused) and comes back, or
// breaks the connection; the relay subscribes again each time and the client gets the new upstream's
// events. An eviction (RESOURCE_EXHAUSTED) is not hidden: it ends the client's stream.
func TestRelaySurvivesUpstreamRestarts(t *testing.T) {
	dir := testutil.ShortTempDir(t, "eb-")
	corePath, frontPath := filepath.Join(dir, "core.sock"), filepath.Join(dir, "front.sock")
	up := startUpstream(t, corePath)
	resubscribed := make(chan struct{}, 10)
	relay, err := DialRelay(RelayConfig{Endpoint: "unix://" + corePath, Resubscribed: func() { resubscribed <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	client := serveRelay(t, frontPath, relay)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := client.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	up.src.NextOpened(t)
	up.src.Publish(&runtimeapi.ContainerEventResponse{ContainerId: "c1"})
	if id := kubelettest.RecvEvent(t, stream).ContainerId; id != "c1" {
		t.Fatalf("got %q, want c1", id)
	}

	// A graceful stop and a later start. The relay finds the socket gone first: its connection fails.
	up.stop()
	waitConnState(t, relay.conn, connectivity.TransientFailure)
	up = startUpstream(t, corePath)
	up.src.NextOpened(t)
	up.src.Publish(&runtimeapi.ContainerEventResponse{ContainerId: "c2"})
	if id := kubelettest.RecvEvent(t, stream).ContainerId; id != "c2" {
		t.Fatalf("got %q, want c2", id)
	}

	// The upstream's stream ends with UNAVAILABLE while its server runs on.
	up.src.Last().End <- status.Error(codes.Unavailable, "core shutting down")
	up.src.NextOpened(t)
	up.src.Publish(&runtimeapi.ContainerEventResponse{ContainerId: "c3"})
	if id := kubelettest.RecvEvent(t, stream).ContainerId; id != "c3" {
		t.Fatalf("got %q, want c3", id)
	}
	if n := len(resubscribed); n != 2 {
		t.Errorf("resubscribed %d times, want 2", n)
	}

	// An eviction ends the client's stream with its status.
	up.src.Last().End <- status.Error(codes.ResourceExhausted, "evicted")
	if _, err := stream.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("after an eviction upstream the client got %v, want RESOURCE_EXHAUSTED", err)
	}
}

// TestRelayClosesUpstreamWithClient: when the client goes away, the upstream subscription ends too.
func TestRelayClosesUpstreamWithClient(t *testing.T) {
	dir := testutil.ShortTempDir(t, "eb-")
	up := startUpstream(t, filepath.Join(dir, "core.sock"))
	relay, err := DialRelay(RelayConfig{Endpoint: "unix://" + filepath.Join(dir, "core.sock")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	client := serveRelay(t, filepath.Join(dir, "front.sock"), relay)
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := client.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{}); err != nil {
		t.Fatal(err)
	}
	s := up.src.NextOpened(t)
	cancel()
	kubelettest.WaitClosed(t, s)
}

// graceFront serves, at dir/front.sock, a front over a Relay of the core at dir/core.sock (started or
// not) with CoreGrace grace. It returns a client of the front and the count of the relay's CoreGone.
func graceFront(t *testing.T, dir string, grace time.Duration) (runtimeapi.RuntimeServiceClient, *atomic.Int64) {
	t.Helper()
	var gone atomic.Int64
	relay, err := DialRelay(RelayConfig{Endpoint: "unix://" + filepath.Join(dir, "core.sock"), CoreGrace: grace,
		CoreGone: func() { gone.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	return serveRelay(t, filepath.Join(dir, "front.sock"), relay), &gone
}

// openEvents opens a client's event stream, which lives as long as the test, and returns it with the
// time just before it was opened.
func openEvents(t *testing.T, client runtimeapi.RuntimeServiceClient) (grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse], time.Time) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	start := time.Now()
	stream, err := client.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return stream, start
}

// streamEnd is how a client's stream ended: its error and when the client saw it.
type streamEnd struct {
	err error
	at  time.Time
}

// awaitEnd returns a channel that receives the end of a client's stream; an event instead fails t.
func awaitEnd(t *testing.T, stream grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]) <-chan streamEnd {
	ch := make(chan streamEnd, 1)
	go func() {
		ev, err := stream.Recv()
		if err == nil {
			t.Errorf("got event %q, want the stream to end", ev.ContainerId)
		}
		ch <- streamEnd{err, time.Now()}
	}()
	return ch
}

// checkCoreGone fails t unless end is the relay's end for a core gone for grace, and came at least
// grace after since.
func checkCoreGone(t *testing.T, end streamEnd, grace time.Duration, since time.Time) {
	t.Helper()
	if status.Code(end.err) != codes.Unavailable || !strings.Contains(status.Convert(end.err).Message(), "has not come back within "+grace.String()) {
		t.Errorf("the client's stream ended with %v, want UNAVAILABLE saying the core has not come back within %s", end.err, grace)
	}
	if d := end.at.Sub(since); d < grace {
		t.Errorf("the client's stream ended %s after the core went away, before the grace of %s", d, grace)
	}
}

// TestRelayEndsWhenCoreGone (issue 56): when the core goes away and nothing restarts it, the client's
// stream ends with UNAVAILABLE once the core has been gone for CoreGrace, not before; the metric's
// hook counts it. It used to stay open and silent for ever, and a kubelet 1.35/1.36 learnt of exits
// only at its next relist, up to 300 s later.
func TestRelayEndsWhenCoreGone(t *testing.T) {
	const grace = 500 * time.Millisecond
	dir := testutil.ShortTempDir(t, "eb-")
	up := startUpstream(t, filepath.Join(dir, "core.sock"))
	client, gone := graceFront(t, dir, grace)
	stream, _ := openEvents(t, client)
	up.src.NextOpened(t)
	up.src.Publish(&runtimeapi.ContainerEventResponse{ContainerId: "c1"})
	if id := kubelettest.RecvEvent(t, stream).ContainerId; id != "c1" {
		t.Fatalf("got %q, want c1", id)
	}
	lost := time.Now()
	up.stop()
	checkCoreGone(t, kubelettest.Recv(t, awaitEnd(t, stream), "the end of the client's stream"), grace, lost)
	if n := gone.Load(); n != 1 {
		t.Errorf("CoreGone called %d times, want 1", n)
	}
}

// TestRelayCoreBackWithinGrace: a core that comes back within CoreGrace ends nothing, however long
// its stream then stays quiet; every loss of a core that had come back starts a grace of its own. An
// eviction still ends the client's stream with its own status.
func TestRelayCoreBackWithinGrace(t *testing.T) {
	const grace = 2 * time.Second
	dir := testutil.ShortTempDir(t, "eb-")
	corePath := filepath.Join(dir, "core.sock")
	up := startUpstream(t, corePath)
	client, gone := graceFront(t, dir, grace)
	stream, _ := openEvents(t, client)
	up.src.NextOpened(t)
	ended := awaitEnd(t, stream)

	for i := range 2 {
		lost := time.Now()
		up.stop()
		up = startUpstream(t, corePath)
		up.src.NextOpened(t)
		// Past the grace of the loss, with the core's new stream quiet.
		time.Sleep(time.Until(lost.Add(grace + 300*time.Millisecond)))
		select {
		case end := <-ended:
			t.Fatalf("restart %d: the client's stream ended (%v) although the core came back", i, end.err)
		default:
		}
	}
	if n := gone.Load(); n != 0 {
		t.Errorf("CoreGone called %d times, want 0", n)
	}
	up.src.Last().End <- status.Error(codes.ResourceExhausted, "evicted")
	if end := kubelettest.Recv(t, ended, "the end of the client's stream"); status.Code(end.err) != codes.ResourceExhausted {
		t.Fatalf("after an eviction upstream the client got %v, want RESOURCE_EXHAUSTED", end.err)
	}
}

// TestRelayEndsWhenCoreCrashLoops: a core that accepts the relay's subscriptions and ends each at
// once, without an event (crash-looping), does not keep the client's stream open: it ends CoreGrace
// after the core's last good stream ended.
func TestRelayEndsWhenCoreCrashLoops(t *testing.T) {
	const grace = 2 * time.Second
	dir := testutil.ShortTempDir(t, "eb-")
	up := startUpstream(t, filepath.Join(dir, "core.sock"))
	client, gone := graceFront(t, dir, grace)
	stream, _ := openEvents(t, client)
	first := up.src.NextOpened(t)
	up.src.Publish(&runtimeapi.ContainerEventResponse{ContainerId: "c1"})
	if id := kubelettest.RecvEvent(t, stream).ContainerId; id != "c1" {
		t.Fatalf("got %q, want c1", id)
	}
	ended := awaitEnd(t, stream)

	crash := status.Error(codes.Unavailable, "pleg-nri is shutting down")
	var opened atomic.Int64
	done := make(chan struct{})
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		for {
			select {
			case s := <-up.src.Opened:
				opened.Add(1)
				s.End <- crash
			case <-done:
				return
			}
		}
	}()
	defer func() { close(done); <-loopDone }()
	lost := time.Now()
	first.End <- crash
	checkCoreGone(t, kubelettest.Recv(t, ended, "the end of the client's stream"), grace, lost)
	if n := opened.Load(); n < 3 {
		t.Errorf("the relay subscribed %d times while the core crash-looped, want at least 3", n)
	}
	if n := gone.Load(); n != 1 {
		t.Errorf("CoreGone called %d times, want 1", n)
	}
}

// TestRelayNewSubscriptionCoreDown: a subscription made while the core is down ends CoreGrace after
// it was made, whether the core never ran or went away before: each subscription has its own grace.
func TestRelayNewSubscriptionCoreDown(t *testing.T) {
	const grace = 600 * time.Millisecond
	dir := testutil.ShortTempDir(t, "eb-")
	client, gone := graceFront(t, dir, grace)
	// No core yet.
	stream, start := openEvents(t, client)
	checkCoreGone(t, kubelettest.Recv(t, awaitEnd(t, stream), "the end of the client's stream"), grace, start)

	// A core that goes away: the stream opened before it ends first, one opened later its grace after.
	up := startUpstream(t, filepath.Join(dir, "core.sock"))
	early, _ := openEvents(t, client)
	up.src.NextOpened(t)
	up.src.Publish(&runtimeapi.ContainerEventResponse{ContainerId: "c1"})
	if id := kubelettest.RecvEvent(t, early).ContainerId; id != "c1" {
		t.Fatalf("got %q, want c1", id)
	}
	lost := time.Now()
	up.stop()
	earlyEnd := awaitEnd(t, early)
	time.Sleep(grace / 2)
	late, lateStart := openEvents(t, client)
	lateEnd := awaitEnd(t, late)
	checkCoreGone(t, kubelettest.Recv(t, earlyEnd, "the end of the early stream"), grace, lost)
	checkCoreGone(t, kubelettest.Recv(t, lateEnd, "the end of the late stream"), grace, lateStart)
	if n := gone.Load(); n != 3 {
		t.Errorf("CoreGone called %d times, want 3", n)
	}
}

package kubelet

import (
	"context"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// upstreamCore is a server like the core's event socket: a Proxy with a fakeSource, on a path, that
// the test can stop (a restart of the core starts another on the same path).
type upstreamCore struct {
	src *fakeSource
	// stop stops the server, as a core's SIGTERM does: open streams end with UNAVAILABLE.
	stop func()
}

func startUpstream(t *testing.T, path string) *upstreamCore {
	t.Helper()
	u := &upstreamCore{src: newFakeSource()}
	_, u.stop = startServer(t, path, ProxyConfig{Backend: runtimeConn(t), Events: u.src, ReadFreshness: ReadFreshnessOff})
	return u
}

// serveRelay serves a Proxy whose events come from relay, and returns a client of it.
func serveRelay(t *testing.T, path string, relay *Relay) runtimeapi.RuntimeServiceClient {
	t.Helper()
	srv, _ := startServer(t, path, ProxyConfig{Backend: runtimeConn(t), Events: relay, ReadFreshness: ReadFreshnessOff})
	return runtimeapi.NewRuntimeServiceClient(connect(t, srv.Addr().String()))
}

// runtimeConn is a connection to a fake runtime, the proxies' backend.
func runtimeConn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	path := filepath.Join(testutil.ShortTempDir(t, "eb-"), "rt.sock")
	startBackend(t, path, &fakeRuntime{})
	return connect(t, path)
}

// waitConnState waits until conn is in state want.
func waitConnState(t *testing.T, conn *grpc.ClientConn, want connectivity.State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for st := conn.GetState(); st != want; st = conn.GetState() {
		if !conn.WaitForStateChange(ctx, st) {
			t.Fatalf("connection still %s after %s, want %s", st, waitTimeout, want)
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
	nextOpened(t, up.src)
	up.src.publish(&runtimeapi.ContainerEventResponse{ContainerId: "c1"})
	if id := recvEvent(t, stream).ContainerId; id != "c1" {
		t.Fatalf("got %q, want c1", id)
	}

	// A graceful stop and a later start. The relay finds the socket gone first: its connection fails.
	up.stop()
	waitConnState(t, relay.conn, connectivity.TransientFailure)
	up = startUpstream(t, corePath)
	nextOpened(t, up.src)
	up.src.publish(&runtimeapi.ContainerEventResponse{ContainerId: "c2"})
	if id := recvEvent(t, stream).ContainerId; id != "c2" {
		t.Fatalf("got %q, want c2", id)
	}

	// The upstream's stream ends with UNAVAILABLE while its server runs on.
	up.src.last().end <- status.Error(codes.Unavailable, "core shutting down")
	nextOpened(t, up.src)
	up.src.publish(&runtimeapi.ContainerEventResponse{ContainerId: "c3"})
	if id := recvEvent(t, stream).ContainerId; id != "c3" {
		t.Fatalf("got %q, want c3", id)
	}
	if n := len(resubscribed); n != 2 {
		t.Errorf("resubscribed %d times, want 2", n)
	}

	// An eviction ends the client's stream with its status.
	up.src.last().end <- status.Error(codes.ResourceExhausted, "evicted")
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
	s := nextOpened(t, up.src)
	cancel()
	waitClosed(t, s)
}

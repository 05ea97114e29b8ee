package kubelet

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// TestEventStreamCaps: with the default caps, a connection gets DefaultMaxEventStreamsPerConnection
// event streams and the endpoint DefaultMaxEventStreams; a stream beyond either ends at once with
// RESOURCE_EXHAUSTED saying which cap (no subscription made, counted by cap), the streams open go on,
// and a stream that ends makes room for a new one.
func TestEventStreamCaps(t *testing.T) {
	e := newEnv(t, 1)
	ctx := testCtx(t)
	type openStream struct {
		client grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]
		sub    *fakeStream
		cancel context.CancelFunc
	}
	var streams []openStream
	openOn := func(conn *grpc.ClientConn) grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse] {
		t.Helper()
		sctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		c, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(sctx, &runtimeapi.GetEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, openStream{client: c, cancel: cancel})
		return c
	}
	accepted := func(conn *grpc.ClientConn) {
		t.Helper()
		openOn(conn)
		streams[len(streams)-1].sub = nextOpened(t, e.source)
	}
	refused := func(conn *grpc.ClientConn, says string) {
		t.Helper()
		_, err := openOn(conn).Recv()
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), says) {
			t.Fatalf("stream beyond the cap: %v, want ResourceExhausted saying %q", err, says)
		}
		select {
		case <-e.source.opened:
			t.Fatal("a refused stream subscribed")
		default:
		}
	}

	for range DefaultMaxEventStreamsPerConnection {
		accepted(e.proxied)
	}
	refused(e.proxied, "at most 16 per connection")
	var conn *grpc.ClientConn
	for i := range DefaultMaxEventStreams - DefaultMaxEventStreamsPerConnection {
		if i%DefaultMaxEventStreamsPerConnection == 0 {
			conn = connect(t, e.server.Addr().String())
		}
		accepted(conn)
	}
	late := connect(t, e.server.Addr().String())
	refused(late, fmt.Sprintf("at most %d in all", DefaultMaxEventStreams))

	// The streams open go on.
	e.source.publish(event("c1", runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT))
	if got := recvEvent(t, streams[0].client); got.ContainerId != "c1" {
		t.Errorf("first stream got %s", got.ContainerId)
	}
	// One ends: the late connection gets a stream.
	streams[0].cancel()
	waitClosed(t, streams[0].sub)
	accepted(late)

	opened, _ := e.metrics.streams()
	e.metrics.mu.Lock()
	refusedBy := e.metrics.refused
	e.metrics.mu.Unlock()
	if opened != DefaultMaxEventStreams {
		t.Errorf("%d streams counted open, want %d", opened, DefaultMaxEventStreams)
	}
	if d := cmp.Diff(map[string]int{StreamLimitConnection: 1, StreamLimitTotal: 1}, refusedBy); d != "" {
		t.Errorf("refused streams by cap (-want +got):\n%s", d)
	}
}

// TestEventStreamCapsThroughTheFront: the front's relay carries every stream of the kubelet's endpoint
// to the core over one connection, so the core's socket has CoreMaxEventStreams in all and per
// connection: the front's DefaultMaxEventStreams streams, from clients on DefaultMaxEventStreams /
// DefaultMaxEventStreamsPerConnection connections, all get the core's events, and the front refuses the
// next one itself. With the front's caps on the core instead, the core refuses the front's stream
// DefaultMaxEventStreamsPerConnection+1, and its client gets that RESOURCE_EXHAUSTED.
func TestEventStreamCapsThroughTheFront(t *testing.T) {
	for _, tc := range []struct {
		name      string
		coreLimit int // the core's caps, both
		accepted  int // the front's streams that get events
		says      string
	}{
		{"core caps", CoreMaxEventStreams, DefaultMaxEventStreams, fmt.Sprintf("at most %d in all", DefaultMaxEventStreams)},
		{"front caps on the core", DefaultMaxEventStreamsPerConnection, DefaultMaxEventStreamsPerConnection, "at most 16 per connection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.ShortTempDir(t, "eb-")
			core := &upstreamCore{src: newFakeSource()}
			_, core.stop = startServer(t, filepath.Join(dir, "core.sock"), ProxyConfig{Backend: runtimeConn(t), Events: core.src,
				ReadFreshness: ReadFreshnessOff, MaxEventStreams: tc.coreLimit, MaxEventStreamsPerConnection: tc.coreLimit})
			front, _, _ := frontOverRelay(t, dir, ReadFreshnessOff)
			ctx := testCtx(t)
			var clients []grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]
			var conn *grpc.ClientConn
			for i := range tc.accepted + 1 {
				if i%DefaultMaxEventStreamsPerConnection == 0 {
					conn = connect(t, front.Addr().String())
				}
				c, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
				if err != nil {
					t.Fatal(err)
				}
				clients = append(clients, c)
				if i < tc.accepted {
					nextOpened(t, core.src)
				}
			}
			if _, err := clients[tc.accepted].Recv(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("stream %d through the front: %v, want ResourceExhausted saying %q", tc.accepted+1, err, tc.says)
			}
			core.src.publish(event("c1", runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT))
			for i, c := range clients[:tc.accepted] {
				if got := recvEvent(t, c); got.ContainerId != "c1" {
					t.Fatalf("stream %d got %s", i, got.ContainerId)
				}
			}
		})
	}
}

package kubelet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/internal/endpointtest"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// TestEventStreamCaps: with the default caps, a connection gets DefaultMaxEventStreamsPerConnection
// event streams and the endpoint DefaultMaxEventStreams; a stream beyond either ends at once with
// RESOURCE_EXHAUSTED saying which cap (no subscription made, counted by cap), the streams open go on,
// and a stream that ends makes room for a new one.
func TestEventStreamCaps(t *testing.T) {
	e := newEnv(t, 1)
	ctx := endpointtest.Ctx(t)
	type openStream struct {
		client grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]
		sub    *endpointtest.Stream
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
		streams[len(streams)-1].sub = e.source.NextOpened(t)
	}
	refused := func(conn *grpc.ClientConn, says string) {
		t.Helper()
		_, err := openOn(conn).Recv()
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), says) {
			t.Fatalf("stream beyond the cap: %v, want ResourceExhausted saying %q", err, says)
		}
		select {
		case <-e.source.Opened:
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
			conn = endpointtest.Connect(t, e.server.Addr().String())
		}
		accepted(conn)
	}
	late := endpointtest.Connect(t, e.server.Addr().String())
	refused(late, fmt.Sprintf("at most %d in all", DefaultMaxEventStreams))

	// The streams open go on.
	e.source.Publish(endpointtest.Event("c1", runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT))
	if got := endpointtest.RecvEvent(t, streams[0].client); got.ContainerId != "c1" {
		t.Errorf("first stream got %s", got.ContainerId)
	}
	// One ends: the late connection gets a stream.
	streams[0].cancel()
	endpointtest.WaitClosed(t, streams[0].sub)
	accepted(late)

	// The service counts a stream open just after it subscribed (which accepted waits for), and the
	// ended one closed once its Next returned: wait for both (seen once as 255 in a fresh-clone make test).
	if err := testutil.Poll(context.Background(), 5*time.Second, "the streams counted open", func() (bool, error) {
		opened, _ := e.metrics.streams()
		return opened == DefaultMaxEventStreams, fmt.Errorf("%d streams counted open, want %d", opened, DefaultMaxEventStreams)
	}); err != nil {
		t.Error(err)
	}
	e.metrics.mu.Lock()
	refusedBy := e.metrics.refused
	e.metrics.mu.Unlock()
	if d := cmp.Diff(map[string]int{StreamLimitConnection: 1, StreamLimitTotal: 1}, refusedBy); d != "" {
		t.Errorf("refused streams by cap (-want +got):\n%s", d)
	}
}

package kubelet

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/internal/endpointtest"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// countingSource is an endless event source that counts the events its subscriptions hand out: as the
// core's fan-out, an event handed out is one the subscriber took (the core's checkpoint records it as
// received).
type countingSource struct{ taken atomic.Int64 }

func (s *countingSource) Subscribe() EventStream { return countingStream{s} }

type countingStream struct{ s *countingSource }

func (c countingStream) Next(ctx context.Context) (*runtimeapi.ContainerEventResponse, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return nil, time.Time{}, err
	}
	n := c.s.taken.Add(1)
	return &runtimeapi.ContainerEventResponse{ContainerId: fmt.Sprint(n)}, time.Time{}, nil
}

func (countingStream) Close() {}

// TestShutdownSendsWhatWasTaken: when the endpoint stops, every event its stream took from the source
// reaches the client before the stream ends. The stream's pump takes the next event while the last one
// is sent; a stop used to drop that one, which the core had recorded as received: after a graceful
// restart of the core (an upgrade), the front never got it and the next core did not send it again.
func TestShutdownSendsWhatWasTaken(t *testing.T) {
	for range 20 {
		dir := testutil.ShortTempDir(t, "eb-")
		src := &countingSource{}
		b := startBackend(t, filepath.Join(dir, "backend.sock"), newFakeRuntime(0))
		srv, stop := startServer(t, filepath.Join(dir, "cri.sock"), ProxyConfig{Backend: endpointtest.Connect(t, b.path), Events: src})
		client := runtimeapi.NewRuntimeServiceClient(endpointtest.Connect(t, srv.Addr().String()))
		stream, err := client.GetContainerEvents(endpointtest.Ctx(t), &runtimeapi.GetEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		received := 0
		for received < 100 {
			if _, err := stream.Recv(); err != nil {
				t.Fatal(err)
			}
			received++
		}
		stopped := make(chan struct{})
		go func() {
			stop()
			close(stopped)
		}()
		for {
			if _, err := stream.Recv(); err != nil {
				break
			}
			received++
		}
		endpointtest.Recv(t, stopped, "the stop")
		if taken := src.taken.Load(); int64(received) != taken {
			t.Fatalf("the client received %d events, the stream took %d from the source", received, taken)
		}
	}
}

// Package kubelettest has what the tests of the packages around the kubelet's endpoint share (fresh,
// corelink): package endpointtest's fakes and helpers (an event source the test publishes to, a
// client's view of a stream, connections, bounded waits), with servers and proxies of package kubelet
// on unix sockets in the test's temporary directory. Fakes for tests only.
package kubelettest

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/internal/endpointtest"
)

// WaitTimeout bounds every wait of a test for what a working machine does at once.
const WaitTimeout = endpointtest.WaitTimeout

// Stream is one subscription of a Source (endpointtest.Stream).
type Stream = endpointtest.Stream

// Ctx is a context that ends with the test, or after 20 s (endpointtest.Ctx).
func Ctx(t *testing.T) context.Context { return endpointtest.Ctx(t) }

// Connect returns a connection to the unix socket at path, closed when the test ends
// (endpointtest.Connect).
func Connect(t testing.TB, path string) *grpc.ClientConn {
	t.Helper()
	return endpointtest.Connect(t, path)
}

// Event is an event of container id in sandbox s1 (endpointtest.Event).
func Event(id string, typ runtimeapi.ContainerEventType) *runtimeapi.ContainerEventResponse {
	return endpointtest.Event(id, typ)
}

// RecvEvent returns the next event of a client's stream, and fails t when the stream ends or no event
// comes (endpointtest.RecvEvent).
func RecvEvent(t testing.TB, s grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]) *runtimeapi.ContainerEventResponse {
	t.Helper()
	return endpointtest.RecvEvent(t, s)
}

// WaitClosed fails t unless s is closed (endpointtest.WaitClosed).
func WaitClosed(t testing.TB, s *Stream) {
	t.Helper()
	endpointtest.WaitClosed(t, s)
}

// Recv returns the next value from ch, and fails t when none comes within WaitTimeout
// (endpointtest.Recv).
func Recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	return endpointtest.Recv(t, ch, what)
}

// Source is endpointtest's event source as a kubelet.EventSource.
type Source struct{ *endpointtest.Source }

var _ kubelet.EventSource = (*Source)(nil)

// NewSource returns an event source with no stream.
func NewSource() *Source { return &Source{endpointtest.NewSource()} }

// Subscribe opens a stream.
func (s *Source) Subscribe() kubelet.EventStream { return s.Source.Subscribe() }

// Serve serves service on the unix socket at path. stop stops it (once; the test's end calls it too)
// and fails the test if serving ended with an error.
func Serve(t testing.TB, path string, service kubelet.Service) (srv *kubelet.Server, stop func()) {
	t.Helper()
	srv, err := kubelet.NewServer("unix://"+path, service)
	if err != nil {
		t.Fatal(err)
	}
	return srv, endpointtest.Start(t, srv)
}

// Proxy is kubelet.NewProxy, failing t on an error.
func Proxy(t testing.TB, cfg kubelet.ProxyConfig) *kubelet.Proxy {
	t.Helper()
	p, err := kubelet.NewProxy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Package endpointtest has what the tests of the kubelet's endpoint and of the packages around it share:
// an event source the test publishes to, a client's view of a stream, connections and servers on unix
// sockets, bounded waits. It imports nothing of package kubelet, so that the kubelet package's own
// tests can use it; package kubelettest adapts it to the kubelet package's types for the others. Fakes
// for tests only.
package endpointtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// WaitTimeout bounds every wait of a test for what a working machine does at once.
const WaitTimeout = 10 * time.Second

// Ctx is a context that ends with the test, or after 20 s.
func Ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Recv returns the next value from ch, and fails t when none comes within WaitTimeout.
func Recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	return testutil.Next(t, ch, what, WaitTimeout)
}

// Connect returns a connection (dial.CRI) to the unix socket at path, closed when the test ends.
func Connect(t testing.TB, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := dial.CRI("unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Server is what Start runs: the kubelet package's Server.
type Server interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context)
	Err() <-chan error
}

// Start starts srv. stop stops it (once; the test's end calls it too) and fails the test if serving
// ended with an error.
func Start(t testing.TB, srv Server) (stop func()) {
	t.Helper()
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	stop = sync.OnceFunc(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Stop(ctx)
		if err := <-srv.Err(); err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	t.Cleanup(stop)
	return stop
}

// Source is an event source whose streams get what the test publishes. Its Subscribe returns a
// *Stream; the kubelet package's EventSource returns its stream interface, which callers adapt to.
type Source struct {
	// mu guards streams.
	mu      sync.Mutex
	streams []*Stream
	// Opened receives each new stream.
	Opened chan *Stream
}

// NewSource returns an event source with no stream.
func NewSource() *Source { return &Source{Opened: make(chan *Stream, 10)} }

// Subscribe opens a stream.
func (s *Source) Subscribe() *Stream {
	st := &Stream{ch: make(chan *runtimeapi.ContainerEventResponse, 100), End: make(chan error, 1), Closed: make(chan struct{})}
	s.mu.Lock()
	s.streams = append(s.streams, st)
	s.mu.Unlock()
	s.Opened <- st
	return st
}

// Publish sends ev to every open stream.
func (s *Source) Publish(ev *runtimeapi.ContainerEventResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.streams {
		select {
		case <-st.Closed:
		default:
			st.ch <- ev
		}
	}
}

// Last returns the stream opened last.
func (s *Source) Last() *Stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[len(s.streams)-1]
}

// NextOpened returns the next stream s opens, and fails t when none is opened.
func (s *Source) NextOpened(t testing.TB) *Stream {
	t.Helper()
	return Recv(t, s.Opened, "a subscription")
}

// Stream is one subscription of a Source.
type Stream struct {
	ch chan *runtimeapi.ContainerEventResponse
	// End, when it receives, ends the stream with that error.
	End chan error
	// Closed is closed when the subscriber closes the stream.
	Closed    chan struct{}
	closeOnce sync.Once
}

// Next returns the next event published, its source time a millisecond ago.
func (s *Stream) Next(ctx context.Context) (*runtimeapi.ContainerEventResponse, time.Time, error) {
	select {
	case ev := <-s.ch:
		return ev, time.Now().Add(-time.Millisecond), nil
	case err := <-s.End:
		return nil, time.Time{}, err
	case <-ctx.Done():
		return nil, time.Time{}, ctx.Err()
	}
}

// Close ends the subscription.
func (s *Stream) Close() { s.closeOnce.Do(func() { close(s.Closed) }) }

// WaitClosed fails t unless s is closed.
func WaitClosed(t testing.TB, s *Stream) {
	t.Helper()
	Recv(t, s.Closed, "the subscription to be closed")
}

// Event is an event of container id (labelled a=b) in sandbox s1.
func Event(id string, typ runtimeapi.ContainerEventType) *runtimeapi.ContainerEventResponse {
	return &runtimeapi.ContainerEventResponse{
		ContainerId: id, ContainerEventType: typ, CreatedAt: time.Now().UnixNano(),
		PodSandboxStatus:   &runtimeapi.PodSandboxStatus{Id: "s1", Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Uid: "u", Namespace: "n"}},
		ContainersStatuses: []*runtimeapi.ContainerStatus{{Id: id, Labels: map[string]string{"a": "b"}}},
	}
}

// RecvEvent returns the next event of a client's stream, and fails t when the stream ends or no event
// comes.
func RecvEvent(t testing.TB, s grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]) *runtimeapi.ContainerEventResponse {
	t.Helper()
	type result struct {
		ev  *runtimeapi.ContainerEventResponse
		err error
	}
	ch := make(chan result, 1)
	go func() {
		ev, err := s.Recv()
		ch <- result{ev, err}
	}()
	r := Recv(t, ch, "an event")
	if r.err != nil {
		t.Fatalf("Recv: %v", r.err)
	}
	return r.ev
}

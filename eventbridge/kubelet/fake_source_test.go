package kubelet

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeSource is an EventSource whose streams get what the test publishes.
type fakeSource struct {
	// mu guards streams.
	mu      sync.Mutex
	streams []*fakeStream
	// opened receives each new stream.
	opened chan *fakeStream
}

func newFakeSource() *fakeSource { return &fakeSource{opened: make(chan *fakeStream, 10)} }

func (s *fakeSource) Subscribe() EventStream {
	st := &fakeStream{ch: make(chan *runtimeapi.ContainerEventResponse, 100), end: make(chan error, 1), closed: make(chan struct{})}
	s.mu.Lock()
	s.streams = append(s.streams, st)
	s.mu.Unlock()
	s.opened <- st
	return st
}

// publish sends ev to every open stream.
func (s *fakeSource) publish(ev *runtimeapi.ContainerEventResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.streams {
		select {
		case <-st.closed:
		default:
			st.ch <- ev
		}
	}
}

// nextOpened returns the next stream src opens, and fails t when none is opened.
func nextOpened(t testing.TB, src *fakeSource) *fakeStream {
	t.Helper()
	return recv(t, src.opened, "a subscription")
}

type fakeStream struct {
	ch chan *runtimeapi.ContainerEventResponse
	// end, when it receives, ends the stream with that error.
	end       chan error
	closed    chan struct{}
	closeOnce sync.Once
}

func (s *fakeStream) Next(ctx context.Context) (*runtimeapi.ContainerEventResponse, time.Time, error) {
	select {
	case ev := <-s.ch:
		return ev, time.Now().Add(-time.Millisecond), nil
	case err := <-s.end:
		return nil, time.Time{}, err
	case <-ctx.Done():
		return nil, time.Time{}, ctx.Err()
	}
}

func (s *fakeStream) Close() { s.closeOnce.Do(func() { close(s.closed) }) }

// waitClosed fails t unless the proxy closes s.
func waitClosed(t testing.TB, s *fakeStream) {
	t.Helper()
	recv(t, s.closed, "the subscription to be closed")
}

// event is an event of container id in sandbox s1.
func event(id string, typ runtimeapi.ContainerEventType) *runtimeapi.ContainerEventResponse {
	return &runtimeapi.ContainerEventResponse{
		ContainerId: id, ContainerEventType: typ, CreatedAt: time.Now().UnixNano(),
		PodSandboxStatus:   &runtimeapi.PodSandboxStatus{Id: "s1", Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Uid: "u", Namespace: "n"}},
		ContainersStatuses: []*runtimeapi.ContainerStatus{{Id: id, Labels: map[string]string{"a": "b"}}},
	}
}

// recvEvent returns the next event of a client's stream, and fails t when the stream ends or no event
// comes.
func recvEvent(t testing.TB, s grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]) *runtimeapi.ContainerEventResponse {
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
	r := recv(t, ch, "an event")
	if r.err != nil {
		t.Fatalf("Recv: %v", r.err)
	}
	return r.ev
}

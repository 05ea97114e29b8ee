package corelink

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// The link as it runs: the front's kubelet.Proxy, whose events come from a Relay of the core's socket,
// served here by a Core over a fakeSource (the core's fan-out).

// waitTimeout bounds every wait of a test for what a working machine does at once.
const waitTimeout = 10 * time.Second

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// recv returns the next value from ch, and fails t when none comes within waitTimeout.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	return testutil.Next(t, ch, what, waitTimeout)
}

// connect returns a connection (dial.CRI) to the unix socket at path, closed when the test ends.
func connect(t testing.TB, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := dial.CRI("unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// serve serves service on the unix socket at path. stop stops it (once; the test's end calls it too)
// and fails the test if serving ended with an error.
func serve(t testing.TB, path string, service kubelet.Service) (srv *kubelet.Server, stop func()) {
	t.Helper()
	srv, err := kubelet.NewServer("unix://"+path, service)
	if err != nil {
		t.Fatal(err)
	}
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
	return srv, stop
}

// mustProxy is kubelet.NewProxy, failing t on an error.
func mustProxy(t testing.TB, cfg kubelet.ProxyConfig) *kubelet.Proxy {
	t.Helper()
	p, err := kubelet.NewProxy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startServer serves a front's kubelet.Proxy made from cfg on the unix socket at path (see serve).
func startServer(t testing.TB, path string, cfg kubelet.ProxyConfig) (srv *kubelet.Server, stop func()) {
	t.Helper()
	return serve(t, path, mustProxy(t, cfg))
}

// mustCore is NewCore, failing t on an error.
func mustCore(t testing.TB, cfg CoreConfig) *Core {
	t.Helper()
	c, err := NewCore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// upstreamCore is the core's socket: a Core over a fakeSource, on a path, that the test can stop (a
// restart of the core starts another on the same path).
type upstreamCore struct {
	src *fakeSource
	// stop stops the server, as a core's SIGTERM does: open streams end with UNAVAILABLE.
	stop func()
}

func startUpstream(t *testing.T, path string) *upstreamCore {
	t.Helper()
	u := &upstreamCore{src: newFakeSource()}
	_, u.stop = serve(t, path, mustCore(t, CoreConfig{Events: u.src}))
	return u
}

// runtimeConn is a connection to a fake runtime, the front's backend.
func runtimeConn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	path := filepath.Join(testutil.ShortTempDir(t, "cl-"), "rt.sock")
	testutil.ServeGRPC(t, path, func(srv *grpc.Server) {
		runtimeapi.RegisterRuntimeServiceServer(srv, &runtimeapi.UnimplementedRuntimeServiceServer{})
	})
	return connect(t, path)
}

// fakeSource is the core's fan-out: its streams get what the test publishes.
type fakeSource struct {
	// mu guards streams.
	mu      sync.Mutex
	streams []*fakeStream
	// opened receives each new stream.
	opened chan *fakeStream
}

func newFakeSource() *fakeSource { return &fakeSource{opened: make(chan *fakeStream, 10)} }

func (s *fakeSource) Subscribe() kubelet.EventStream {
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

// last returns the stream opened last.
func (s *fakeSource) last() *fakeStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[len(s.streams)-1]
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

// waitClosed fails t unless the core closes s.
func waitClosed(t testing.TB, s *fakeStream) {
	t.Helper()
	recv(t, s.closed, "the subscription to be closed")
}

// event is an event of container id in sandbox s1.
func event(id string, typ runtimeapi.ContainerEventType) *runtimeapi.ContainerEventResponse {
	return &runtimeapi.ContainerEventResponse{
		ContainerId: id, ContainerEventType: typ, CreatedAt: time.Now().UnixNano(),
		PodSandboxStatus:   &runtimeapi.PodSandboxStatus{Id: "s1", Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Uid: "u", Namespace: "n"}},
		ContainersStatuses: []*runtimeapi.ContainerStatus{{Id: id}},
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

// streamMetrics counts the event streams a front opened and closed.
type streamMetrics struct {
	kubelet.NopMetrics
	// mu guards everything below.
	mu     sync.Mutex
	open   int
	closed []codes.Code
}

func (m *streamMetrics) EventStreamOpened() { m.mu.Lock(); m.open++; m.mu.Unlock() }

func (m *streamMetrics) EventStreamClosed(c codes.Code) {
	m.mu.Lock()
	m.open--
	m.closed = append(m.closed, c)
	m.mu.Unlock()
}

// streams returns the number of open event streams and the codes of the closed ones.
func (m *streamMetrics) streams() (open int, closed []codes.Code) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.open, slices.Clone(m.closed)
}

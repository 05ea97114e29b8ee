package kubelet

import (
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/internal/endpointtest"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// fakeSource is endpointtest's event source as an EventSource.
type fakeSource struct{ *endpointtest.Source }

func newFakeSource() *fakeSource { return &fakeSource{endpointtest.NewSource()} }

func (s *fakeSource) Subscribe() EventStream { return s.Source.Subscribe() }

func mustProxy(t testing.TB, cfg ProxyConfig) *Proxy {
	t.Helper()
	p, err := NewProxy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startServer serves a Proxy made from cfg on the unix socket at path, with the extra server options.
// stop stops it (once; the test's end calls it too) and fails the test if serving ended with an error.
func startServer(t testing.TB, path string, cfg ProxyConfig, opts ...grpc.ServerOption) (srv *Server, stop func()) {
	t.Helper()
	return serveProxy(t, path, mustProxy(t, cfg), opts...)
}

// serveProxy is startServer with a proxy already made.
func serveProxy(t testing.TB, path string, p *Proxy, opts ...grpc.ServerOption) (srv *Server, stop func()) {
	t.Helper()
	srv, err := NewServer("unix://"+path, p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return srv, endpointtest.Start(t, srv)
}

// env is a fake backend, the proxy in front of it (with a fakeSource of events, read freshness off), and
// clients of both.
type env struct {
	backend *backend
	source  *fakeSource
	metrics *recordingMetrics
	server  *Server
	// direct and proxied are connections to the backend and to the proxy.
	direct, proxied *grpc.ClientConn
}

// newEnv returns an env whose backend has the given number of containers; opts are added to the proxy's
// server options.
func newEnv(t testing.TB, containers int, opts ...grpc.ServerOption) *env {
	t.Helper()
	dir := testutil.ShortTempDir(t, "eb-")
	e := &env{source: newFakeSource(), metrics: &recordingMetrics{}}
	e.backend = startBackend(t, filepath.Join(dir, "backend.sock"), newFakeRuntime(containers))
	e.server, _ = startServer(t, filepath.Join(dir, "run", "cri.sock"), ProxyConfig{Backend: endpointtest.Connect(t, e.backend.path),
		Events: e.source, Metrics: e.metrics}, opts...)
	e.direct = endpointtest.Connect(t, e.backend.path)
	e.proxied = endpointtest.Connect(t, e.server.Addr().String())
	return e
}

// recordingMetrics counts what the proxy reports.
type recordingMetrics struct {
	// mu guards everything below.
	mu        sync.Mutex
	forwarded map[string][]codes.Code
	open      int
	sent      int
	closed    []codes.Code
	upstream  []bool
	refused   map[string]int // EventStreamRefused, by limit
}

func (m *recordingMetrics) ForwardedCall(method string, code codes.Code, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.forwarded == nil {
		m.forwarded = map[string][]codes.Code{}
	}
	m.forwarded[method] = append(m.forwarded[method], code)
}
func (m *recordingMetrics) EventStreamOpened() { m.mu.Lock(); m.open++; m.mu.Unlock() }
func (m *recordingMetrics) EventStreamClosed(c codes.Code) {
	m.mu.Lock()
	m.open--
	m.closed = append(m.closed, c)
	m.mu.Unlock()
}
func (m *recordingMetrics) EventSent(time.Duration) { m.mu.Lock(); m.sent++; m.mu.Unlock() }
func (m *recordingMetrics) EventStreamRefused(limit string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refused == nil {
		m.refused = map[string]int{}
	}
	m.refused[limit]++
}
func (m *recordingMetrics) RuntimeConnectionState(up bool) {
	m.mu.Lock()
	m.upstream = append(m.upstream, up)
	m.mu.Unlock()
}

// streams returns the number of open event streams and the codes of the closed ones.
func (m *recordingMetrics) streams() (open int, closed []codes.Code) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.open, slices.Clone(m.closed)
}

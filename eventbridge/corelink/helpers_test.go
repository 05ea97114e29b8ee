package corelink

import (
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/kubelettest"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// The link as it runs: the front's kubelet.Proxy, whose events come from a Relay of the core's socket,
// served here by a Core over a kubelettest.Source (the core's fan-out).

// startServer serves a front's kubelet.Proxy made from cfg on the unix socket at path (see kubelettest.Serve).
func startServer(t testing.TB, path string, cfg kubelet.ProxyConfig) (srv *kubelet.Server, stop func()) {
	t.Helper()
	return kubelettest.Serve(t, path, kubelettest.Proxy(t, cfg))
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

// upstreamCore is the core's socket: a Core over a kubelettest.Source, on a path, that the test can stop (a
// restart of the core starts another on the same path).
type upstreamCore struct {
	src *kubelettest.Source
	// stop stops the server, as a core's SIGTERM does: open streams end with UNAVAILABLE.
	stop func()
}

func startUpstream(t *testing.T, path string) *upstreamCore {
	t.Helper()
	u := &upstreamCore{src: kubelettest.NewSource()}
	_, u.stop = kubelettest.Serve(t, path, mustCore(t, CoreConfig{Events: u.src}))
	return u
}

// runtimeConn is a connection to a fake runtime, the front's backend.
func runtimeConn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	path := filepath.Join(testutil.ShortTempDir(t, "cl-"), "rt.sock")
	testutil.ServeGRPC(t, path, func(srv *grpc.Server) {
		runtimeapi.RegisterRuntimeServiceServer(srv, &runtimeapi.UnimplementedRuntimeServiceServer{})
	})
	return kubelettest.Connect(t, path)
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

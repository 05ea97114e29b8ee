package corelink

import (
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// initializingRuntime is a CRI server that, like containerd's CRI before it has recovered its state,
// fails its first `unready` Version calls with UNAVAILABLE.
type initializingRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	unready int64
	calls   atomic.Int64
}

func (r *initializingRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	if r.calls.Add(1) <= r.unready {
		return nil, status.Error(codes.Unavailable, "server is not initialized yet")
	}
	return &runtimeapi.VersionResponse{RuntimeName: "fake"}, nil
}

// serveRuntime serves r on sock until the returned stop is called.
func serveRuntime(t *testing.T, sock string, r *initializingRuntime) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, r)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return srv.Stop
}

// ready connects g's connection and returns once g has seen it ready: the connection's state does not
// change during the waits that follow, so they make a known number of calls.
func ready(t *testing.T, g *RuntimeGate) {
	t.Helper()
	testutil.Eventually(t, time.Minute, "the gate sees the connection ready", func() bool {
		g.conn.ResetConnectBackoff()
		g.conn.Connect()
		return connectivity.State(g.watched.Load()) == connectivity.Ready
	})
}

// gateOn serves r on a new socket and returns a gate on a connection to it, seen ready, with the
// socket and the server's stop. The gate and the connection end with the test.
func gateOn(t *testing.T, r *initializingRuntime) (ctx context.Context, g *RuntimeGate, sock string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sock = filepath.Join(testutil.ShortTempDir(t, "pn-"), "cri.sock")
	stop = serveRuntime(t, sock, r)
	conn, err := dial.CRI("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	g = NewRuntimeGate(ctx, conn)
	ready(t, g)
	return ctx, g, sock, stop
}

// TestRuntimeGate: an event waits until the runtime answers, again after the runtime restarted, and
// costs no call while the connection stays as checked.
func TestRuntimeGate(t *testing.T) {
	first := &initializingRuntime{unready: 3}
	ctx, g, sock, stop := gateOn(t, first)

	g.Wait(ctx, time.Minute)
	if got := first.calls.Load(); got != 4 || !g.serving() {
		t.Fatalf("after the first wait: %d Version calls, serving %v; want 4 (3 refused, 1 answered), true", got, g.serving())
	}
	g.Wait(ctx, time.Minute)
	if got := first.calls.Load(); got != 4 {
		t.Errorf("a wait on a checked connection made %d more Version calls, want none", got-4)
	}

	// The runtime restarts, and initializes again.
	stop()
	testutil.Eventually(t, time.Minute, "the gate notices the runtime went away", func() bool { return !g.serving() })
	second := &initializingRuntime{unready: 2}
	serveRuntime(t, sock, second)
	ready(t, g)
	g.Wait(ctx, time.Minute)
	if got := second.calls.Load(); got != 3 || !g.serving() {
		t.Fatalf("after the restart: %d Version calls, serving %v; want 3 (2 refused, 1 answered), true", got, g.serving())
	}
}

// TestRuntimeGateBound: an event waits for a runtime that never answers until the bound, and not
// much longer (the slack is for a loaded machine, far below the next bound checked); once a wait ran
// out, the next events wait gateRetry, not their bound.
func TestRuntimeGateBound(t *testing.T) {
	const bound, slack = 200 * time.Millisecond, 2 * time.Second
	never := &initializingRuntime{unready: 1 << 62}
	ctx, g, _, _ := gateOn(t, never)
	waited := func(max time.Duration) time.Duration {
		t.Helper()
		done := make(chan time.Duration)
		go func() {
			start := time.Now()
			g.Wait(ctx, max)
			done <- time.Since(start)
		}()
		select {
		case d := <-done:
			return d
		case <-time.After(time.Minute):
			t.Fatalf("an event still waits after a minute (bound %s)", max)
			return 0
		}
	}
	if d := waited(bound); d < bound || d > bound+slack {
		t.Errorf("the first event waited %s, want its bound %s (at most %s more)", d, bound, slack)
	}
	if never.calls.Load() == 0 || g.serving() {
		t.Errorf("%d Version calls, serving %v; want some, false", never.calls.Load(), g.serving())
	}
	// The next events wait gateRetry, however long their bound.
	for range 3 {
		if d := waited(time.Hour); d < gateRetry || d > gateRetry+slack {
			t.Errorf("a later event waited %s, want gateRetry %s (at most %s more)", d, gateRetry, slack)
		}
	}
}

// deadlineRuntime ends every Version call with DEADLINE_EXCEEDED at once, as gRPC does when the
// server's copy of a call's deadline runs out just before the client's.
type deadlineRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	calls atomic.Int64
}

func (r *deadlineRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	r.calls.Add(1)
	return nil, status.Error(codes.DeadlineExceeded, "context deadline exceeded")
}

// TestRuntimeGateDeadlineIsNoAnswer: a check that ran out of time is no answer, even when its context
// has not expired yet. It used to open the gate (TestRuntimeGateBound failed now and then on a loaded
// machine: a Version call ended by the server's deadline counted as the runtime serving).
func TestRuntimeGateDeadlineIsNoAnswer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sock := filepath.Join(testutil.ShortTempDir(t, "pn-"), "cri.sock")
	r := &deadlineRuntime{}
	testutil.ServeGRPC(t, sock, func(s *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(s, r) })
	conn, err := dial.CRI("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	g := NewRuntimeGate(ctx, conn)
	ready(t, g)
	g.Wait(ctx, 100*time.Millisecond)
	if r.calls.Load() == 0 || g.serving() {
		t.Errorf("%d Version calls, serving %v; want some, false", r.calls.Load(), g.serving())
	}
}

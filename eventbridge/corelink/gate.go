package corelink

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/containerd/log"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RuntimeCatchUp bounds how long a relayed event waits for the runtime to serve calls.
const RuntimeCatchUp = 2 * time.Second

// RuntimeGate holds each relayed event until the runtime behind the front serves CRI calls.
//
// An event means the core reached containerd; after a restart of containerd it can come before the
// runtime serves the kubelet: the front's connection may not have redialed yet (gRPC backs off up to
// 2 s between attempts), and containerd serves its socket, and calls NRI plugins, before its CRI
// service has recovered its state (until then every CRI call fails with UNAVAILABLE "server is not
// initialized yet": checkInitialized in containerd's internal/cri/instrument). The kubelet acts on the
// event at once (a STOPPED: it restarts the container), and a call that then fails makes it back off
// that pod for 10 s. So after each change of the connection's state the gate asks the runtime for its
// version, and an event waits until that is answered. While the connection stays as it was checked,
// the gate costs two atomic loads and a state read.
type RuntimeGate struct {
	conn    *grpc.ClientConn
	runtime runtimeapi.RuntimeServiceClient
	// changes counts the connection's state changes seen by watch; checked holds changes+1 as of the
	// last answered check (0: none yet), expired as of the last wait that ran out.
	changes, checked, expired atomic.Uint64
	// watched is the connection state watch saw last (a connectivity.State).
	watched atomic.Int32
}

// gateRetry bounds an event's wait once a wait ran out on the same connection state: a runtime that
// stays unready holds the stream back by the bound once, not by the bound for each event.
const gateRetry = 20 * time.Millisecond

// NewRuntimeGate returns a gate on conn, watching its state until ctx is done.
func NewRuntimeGate(ctx context.Context, conn *grpc.ClientConn) *RuntimeGate {
	g := &RuntimeGate{conn: conn, runtime: runtimeapi.NewRuntimeServiceClient(conn)}
	go g.watch(ctx)
	return g
}

// watch counts the connection's state changes: any of them (a redial, a new server) voids the last
// check.
func (g *RuntimeGate) watch(ctx context.Context) {
	s := g.conn.GetState()
	g.watched.Store(int32(s))
	for s != connectivity.Shutdown && g.conn.WaitForStateChange(ctx, s) {
		g.changes.Add(1)
		s = g.conn.GetState()
		g.watched.Store(int32(s))
	}
}

// serving reports whether the last check holds.
func (g *RuntimeGate) serving() bool {
	return g.checked.Load() == g.changes.Load()+1 && g.conn.GetState() == connectivity.Ready
}

// check asks the runtime for its version, waiting until deadline at most: true once it answers with
// anything but UNAVAILABLE on a connection that did not change meanwhile. A call that ran out of time
// is no answer, whether its context says so yet or not: gRPC can end it with DEADLINE_EXCEEDED (the
// server's copy of the deadline) just before the client's context expires.
func (g *RuntimeGate) check(ctx context.Context, deadline time.Time) bool {
	seen := g.changes.Load()
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	_, err := g.runtime.Version(cctx, &runtimeapi.VersionRequest{})
	if code := status.Code(err); err != nil && (code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled || cctx.Err() != nil) {
		return false
	}
	g.checked.Store(seen + 1)
	return g.changes.Load() == seen
}

// Wait returns once the runtime serves, or after max (after gateRetry once a wait ran out since the
// connection's last change). It runs before each relayed event is sent on.
func (g *RuntimeGate) Wait(ctx context.Context, max time.Duration) {
	if g.serving() {
		return
	}
	if g.expired.Load() == g.changes.Load()+1 {
		max = min(max, gateRetry)
	}
	start := time.Now()
	deadline := start.Add(max)
	for {
		switch g.conn.GetState() {
		case connectivity.Shutdown:
			return
		case connectivity.Ready:
			if g.check(ctx, deadline) {
				if waited := time.Since(start); waited > 10*time.Millisecond {
					log.G(ctx).WithField("waited", waited).Debug("relaying an event once the runtime serves again")
				}
				return
			}
		case connectivity.TransientFailure, connectivity.Idle:
			// Redial now rather than at the end of gRPC's backoff (one attempt per poll at most).
			g.conn.ResetConnectBackoff()
			g.conn.Connect()
		}
		left := time.Until(deadline)
		if left <= 0 {
			g.expired.Store(g.changes.Load() + 1)
			log.G(ctx).WithField("state", g.conn.GetState()).Debug("relaying an event while the runtime does not serve")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(left, 10*time.Millisecond)):
		}
	}
}

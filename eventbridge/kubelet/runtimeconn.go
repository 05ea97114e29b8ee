package kubelet

import (
	"context"

	"github.com/containerd/log"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// WatchRuntime reports the state of the connection to the runtime to the metrics until ctx is done (see
// WatchConnection).
func (p *Proxy) WatchRuntime(ctx context.Context) {
	WatchConnection(ctx, p.backend, p.metrics.RuntimeConnectionState)
}

// WatchConnection reports the state of conn to report until ctx is done: up when it is READY, down when
// it is in TRANSIENT_FAILURE (other states change nothing). It asks the connection to connect, so that
// the state is known before the first call.
func WatchConnection(ctx context.Context, conn *grpc.ClientConn, report func(up bool)) {
	conn.Connect()
	var up *bool
	for {
		st := conn.GetState()
		var now *bool
		switch st {
		case connectivity.Ready:
			now = new(true)
		case connectivity.TransientFailure:
			now = new(false)
		case connectivity.Shutdown:
			return
		case connectivity.Idle:
			// The connection went idle (no calls for a while, or the runtime closed it): reconnect,
			// so that a runtime that went away shows as down.
			conn.Connect()
		}
		if now != nil && (up == nil || *up != *now) {
			up = now
			log.G(ctx).WithField("up", *now).Info("runtime connection state changed")
			report(*now)
		}
		if !conn.WaitForStateChange(ctx, st) {
			return
		}
	}
}

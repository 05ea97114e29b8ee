package kubelet

import (
	"context"

	"github.com/containerd/log"
	"google.golang.org/grpc/connectivity"
)

// WatchUpstream reports the state of the connection to the runtime to the metrics until ctx is done: up
// when it is READY, down when it is in TRANSIENT_FAILURE (other states change nothing). It asks the
// connection to connect, so that the state is known before the first forwarded call.
func (p *Proxy) WatchUpstream(ctx context.Context) {
	p.backend.Connect()
	var up *bool
	for {
		st := p.backend.GetState()
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
			p.backend.Connect()
		}
		if now != nil && (up == nil || *up != *now) {
			up = now
			log.G(ctx).WithField("up", *now).Info("runtime connection state changed")
			p.metrics.UpstreamConnectionState(*now)
		}
		if !p.backend.WaitForStateChange(ctx, st) {
			return
		}
	}
}

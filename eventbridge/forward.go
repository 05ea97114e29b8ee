package eventbridge

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"

	"github.com/containerd/log"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// forwardUnary proxies a call of a known unary method: one request, one answer, with gRPC's unary client
// path (no goroutine). On the wire it is the same as forward. With a fix (a status read while the event
// stream is ahead of the runtime, see ProxyConfig.ReadFreshness), the overlay mode rewrites an answer that shows
// running what the stream reported stopped, and the hold mode asks the runtime again while the answer is
// older than the stream, within p.freshWait, and sends the last answer as the runtime sent it.
func (p *Proxy) forwardUnary(ss grpc.ServerStream, method string, fix *readFix) error {
	var req frame
	defer req.free()
	if err := ss.RecvMsg(&req); err != nil {
		return err
	}
	if fix != nil {
		// The request may be sent more than once, or read: keep its bytes (a sent buffer goes to gRPC).
		b := req.bytes()
		req.free()
		req.data = b
	}
	ctx := ss.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	ctx = metadata.NewOutgoingContext(ctx, forwardableMD(md))
	start := p.now()
	delay := freshRetryMin
	held := false
	var resp frame
	defer resp.free()
	for {
		var hdr, trl metadata.MD
		err := p.backend.Invoke(ctx, method, &req, &resp, grpc.ForceCodecV2(rawCodec{}), grpc.Header(&hdr), grpc.Trailer(&trl))
		var answer []byte
		if err == nil && fix != nil {
			if answer = resp.bytes(); !p.fresh.mentioned(answer) {
				answer = nil // nothing in it is ahead of the runtime
			}
		}
		if answer != nil && p.freshMode == ReadFreshnessOverlay {
			if b := fix.overlay(p.fresh, req.data, answer); b != nil {
				resp.free()
				resp.data = b
				if m, ok := p.metrics.(FreshnessMetrics); ok {
					m.OverlaidRead(method)
				}
			}
		} else if stale := staleIDs(fix, p.fresh, answer); len(stale) > 0 {
			if p.now().Add(delay).Sub(start) < p.freshWait {
				held = true
				resp.free()
				select {
				case <-time.After(delay):
				case <-ctx.Done():
					return status.FromContextError(ctx.Err()).Err()
				}
				delay = min(2*delay, freshRetryMax)
				continue
			}
			p.staleRead(method, start, false)
			log.G(ctx).WithField("method", method).WithField("waited", p.now().Sub(start)).
				Warn("the runtime's status still shows running what the event stream reported stopped: answered as it is")
			if p.refresh != nil {
				for _, id := range stale {
					if sb := p.fresh.sandboxOf(id); sb != "" {
						p.refresh.watch(context.WithoutCancel(ctx), id, sb)
					}
				}
			}
		} else if held {
			p.staleRead(method, start, err == nil)
		}
		if len(hdr) > 0 {
			if herr := ss.SetHeader(forwardableMD(hdr)); herr != nil {
				return herr
			}
		}
		ss.SetTrailer(forwardableMD(trl))
		if err != nil {
			return err
		}
		return ss.SendMsg(&resp)
	}
}

// staleIDs returns, in the hold mode, the objects an answer (nil: none to look at) shows running that the
// stream reported stopped.
func staleIDs(fix *readFix, t *stoppedTracker, answer []byte) []string {
	if answer == nil {
		return nil
	}
	return fix.stale(t, answer)
}

// staleRead reports a status read the runtime first answered with an older state than the event stream.
func (p *Proxy) staleRead(method string, start time.Time, caughtUp bool) {
	if m, ok := p.metrics.(FreshnessMetrics); ok {
		m.StaleRead(method, p.now().Sub(start), caughtUp)
	}
}

// streamDesc describes every forwarded call: a bidirectional stream is the general form of all four
// kinds of gRPC method, and on the wire it is the same.
var streamDesc = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// forward proxies one call to the backend. The backend's status error is returned unchanged, so the
// client gets its code, message and details.
func (p *Proxy) forward(ss grpc.ServerStream, method string) error {
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	md, _ := metadata.FromIncomingContext(ctx)
	ctx = metadata.NewOutgoingContext(ctx, forwardableMD(md))

	cs, err := p.backend.NewStream(ctx, streamDesc, method, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return err
	}

	// Client -> backend, in its own goroutine. It ends with the client's half-close (or the end of the
	// call: ctx is canceled when this handler returns).
	go func() {
		for {
			var f frame
			if err := ss.RecvMsg(&f); err != nil {
				if errors.Is(err, io.EOF) {
					_ = cs.CloseSend()
				}
				return
			}
			err := cs.SendMsg(&f)
			f.free()
			if err != nil {
				// The backend ended the call; RecvMsg below returns its status.
				return
			}
		}
	}()

	// Backend -> client. Headers go as soon as the backend sends them (a trailers-only answer has none).
	if hdr, err := cs.Header(); err == nil && len(hdr) > 0 {
		if err := ss.SendHeader(forwardableMD(hdr)); err != nil {
			return err
		}
	}
	for {
		var f frame
		if err := cs.RecvMsg(&f); err != nil {
			ss.SetTrailer(forwardableMD(cs.Trailer()))
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		err := ss.SendMsg(&f)
		f.free()
		if err != nil {
			return err
		}
	}
}

// forwardableMD returns a copy of md without the keys gRPC itself sets on the next hop (pseudo-headers,
// content type, user agent, encodings, timeout); the deadline is carried by the context.
func forwardableMD(md metadata.MD) metadata.MD {
	out := make(metadata.MD, len(md))
	for k, v := range md {
		if strings.HasPrefix(k, ":") {
			continue
		}
		switch k {
		case "content-type", "user-agent", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding",
			"grpc-message", "grpc-status", "grpc-status-details-bin":
			continue
		}
		out[k] = append([]string(nil), v...)
	}
	return out
}

package kubelet

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/containerd/log"
	"google.golang.org/grpc/status"
)

// The delays between the calls of a held status read: freshRetryMin, doubling up to freshRetryMax.
const (
	freshRetryMin = 2 * time.Millisecond
	freshRetryMax = 50 * time.Millisecond
)

// readFixOf returns the fix of a call of method when it is a status read and some object is tracked as
// stopped ahead of the runtime; otherwise nil, and the call is forwarded as it is.
func (p *Proxy) readFixOf(method string) *readFix {
	if p.fresh == nil || !p.fresh.any() {
		return nil
	}
	return readFixes[method]
}

// invokeFresh makes the status read c, whose answers fix reads, and leaves in c the answer the client is
// to get, consistent with the events this proxy sent (see ProxyConfig.ReadFreshness):
//   - in the overlay mode, the runtime's answer, in which the objects it shows running that the stream
//     reported stopped are shown as the stream reported them (one call);
//   - in the hold mode, the first of the runtime's answers that shows none of them running, asking
//     again freshRetryMin, doubling up to freshRetryMax, apart; once p.freshWait has passed, the last
//     answer as it is, and the objects it still shows running are watched for a refresh (see
//     refresh.go).
//
// The calls are made on the caller's goroutine. It returns an error only when ctx ends while the read is
// held: the client gets that error and none of the runtime's answers.
func (p *Proxy) invokeFresh(ctx context.Context, c *unaryCall, fix *readFix) error {
	// The request may be sent more than once, or read.
	c.req.Keep()
	if p.freshMode == ReadFreshnessOverlay {
		p.invokeOverlaid(ctx, c, fix)
		return nil
	}
	return p.invokeHeld(ctx, c, fix)
}

// invokeOverlaid is invokeFresh in the overlay mode.
func (p *Proxy) invokeOverlaid(ctx context.Context, c *unaryCall, fix *readFix) {
	c.invoke(ctx, p.backend)
	if c.err != nil {
		return
	}
	answer := c.resp.Bytes()
	if !p.fresh.mentioned(answer) {
		return // nothing in it is ahead of the runtime
	}
	if b := fix.overlay(p.fresh, c.req.Data, answer); b != nil {
		c.resp.Free()
		c.resp.Data = b
		c.raw = answer
		if m, ok := p.metrics.(FreshnessMetrics); ok {
			m.OverlaidRead(c.method)
		}
	}
}

// invokeHeld is invokeFresh in the hold mode.
func (p *Proxy) invokeHeld(ctx context.Context, c *unaryCall, fix *readFix) error {
	start := p.now()
	held := false
	retry := &backoff.ExponentialBackOff{InitialInterval: freshRetryMin, Multiplier: 2, MaxInterval: freshRetryMax}
	for {
		c.invoke(ctx, p.backend)
		var stale []string
		if c.err == nil {
			if answer := c.resp.Bytes(); p.fresh.mentioned(answer) {
				stale = fix.stale(p.fresh, answer)
			}
		}
		if len(stale) == 0 {
			if held {
				p.staleRead(c.method, start, c.err == nil)
			}
			return nil
		}
		delay := retry.NextBackOff()
		if p.now().Add(delay).Sub(start) >= p.freshWait {
			p.staleRead(c.method, start, false)
			log.G(ctx).WithField("method", c.method).WithField("waited", p.now().Sub(start)).
				Warn("the runtime's status still shows running what the event stream reported stopped: answered as it is")
			if p.refresh != nil {
				for _, id := range stale {
					if sb := p.fresh.sandboxOf(id); sb != "" {
						p.refresh.watch(context.WithoutCancel(ctx), id, sb)
					}
				}
			}
			return nil
		}
		held = true
		c.resp.Free()
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// staleRead reports a status read the runtime first answered with an older state than the event stream.
func (p *Proxy) staleRead(method string, start time.Time, caughtUp bool) {
	if m, ok := p.metrics.(FreshnessMetrics); ok {
		m.StaleRead(method, p.now().Sub(start), caughtUp)
	}
}

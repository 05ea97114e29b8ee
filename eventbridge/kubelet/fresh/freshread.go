package fresh

import (
	"context"
	"time"

	"github.com/containerd/log"
	"google.golang.org/grpc/status"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/internal/retry"
)

// The delays between the calls of a held status read: freshRetryMin, doubling up to freshRetryMax.
const (
	freshRetryMin = 2 * time.Millisecond
	freshRetryMax = 50 * time.Millisecond
)

// freshReads is the read-freshness hook: it tracks the objects the served events reported stopped
// (stoppedTracker), and makes the status reads whose answers show one of them running consistent with
// the events (see Config.ReadFreshness).
type freshReads struct {
	mode    ReadFreshness
	tracker *stoppedTracker
	// wait bounds a held read.
	wait time.Duration
	// refresh, in the hold mode, watches the objects whose held reads gave up and asks for their
	// refresh (refresh.go); nil: none.
	refresh *refresher
	metrics kubelet.Metrics
	now     func() time.Time
}

var _ kubelet.ReadHook = (*freshReads)(nil)

func newFreshReads(mode ReadFreshness, wait time.Duration, refresh *refresher, metrics kubelet.Metrics, now func() time.Time) *freshReads {
	if wait <= 0 {
		wait = DefaultFreshnessWait
	}
	ttl := overlayTTL
	if mode == ReadFreshnessHold {
		ttl = stoppedTTL
	}
	return &freshReads{mode: mode, tracker: newStoppedTracker(now, ttl), wait: wait, refresh: refresh, metrics: metrics, now: now}
}

// Sending records a STOPPED (or forgets a DELETED object) before the event is sent.
func (f *freshReads) Sending(event []byte) { f.tracker.observe(event) }

// Wants the status reads while some object is tracked as stopped ahead of the runtime; a single atomic
// load for every other call.
func (f *freshReads) Wants(method string) bool { return f.tracker.any() && readFixes[method] != nil }

// Call makes the status read c and leaves in it the answer the client is to get, consistent with the
// events this proxy sent (see Config.ReadFreshness):
//   - in the overlay mode, the runtime's answer, in which the objects it shows running that the stream
//     reported stopped are shown as the stream reported them (one call);
//   - in the hold mode, the first of the runtime's answers that shows none of them running, asking
//     again freshRetryMin, doubling up to freshRetryMax, apart; once f.wait has passed, the last
//     answer as it is, and the objects it still shows running are watched for a refresh (see
//     refresh.go).
//
// The calls are made on the caller's goroutine. It returns an error only when ctx ends while the read is
// held: the client gets that error and none of the runtime's answers.
func (f *freshReads) Call(ctx context.Context, c *kubelet.Call, forward func(context.Context) error) error {
	fix := readFixes[c.Method()]
	if f.mode == ReadFreshnessOverlay {
		if err := forward(ctx); err != nil {
			return err
		}
		f.overlay(c, fix)
		return nil
	}
	return f.hold(ctx, c, fix, forward)
}

// overlay is Call in the overlay mode, once the runtime answered.
func (f *freshReads) overlay(c *kubelet.Call, fix *readFix) {
	answer, err := c.Answer()
	if err != nil || !f.tracker.mentioned(answer) {
		return // nothing in it is ahead of the runtime
	}
	if b := fix.overlay(f.tracker, c.Request(), answer); b != nil {
		c.SetAnswer(b)
		if m, ok := f.metrics.(kubelet.FreshnessMetrics); ok {
			m.OverlaidRead(c.Method())
		}
	}
}

// hold is Call in the hold mode.
func (f *freshReads) hold(ctx context.Context, c *kubelet.Call, fix *readFix, forward func(context.Context) error) error {
	start := f.now()
	held := false
	retry := retry.Doubling(freshRetryMin, freshRetryMax)
	for {
		if err := forward(ctx); err != nil {
			return err
		}
		var stale []string
		answer, err := c.Answer()
		if err == nil && f.tracker.mentioned(answer) {
			stale = fix.stale(f.tracker, answer)
		}
		if len(stale) == 0 {
			if held {
				f.staleRead(c.Method(), start, err == nil)
			}
			return nil
		}
		delay := retry.NextBackOff()
		if f.now().Add(delay).Sub(start) >= f.wait {
			f.staleRead(c.Method(), start, false)
			log.G(ctx).WithField("method", c.Method()).WithField("waited", f.now().Sub(start)).
				Warn("the runtime's status still shows running what the event stream reported stopped: answered as it is")
			if f.refresh != nil {
				for _, id := range stale {
					if sb := f.tracker.sandboxOf(id); sb != "" {
						f.refresh.watch(context.WithoutCancel(ctx), id, sb)
					}
				}
			}
			return nil
		}
		held = true
		c.ClearAnswer()
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// staleRead reports a status read the runtime first answered with an older state than the event stream.
func (f *freshReads) staleRead(method string, start time.Time, caughtUp bool) {
	if m, ok := f.metrics.(kubelet.FreshnessMetrics); ok {
		m.StaleRead(method, f.now().Sub(start), caughtUp)
	}
}

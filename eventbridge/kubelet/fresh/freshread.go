package fresh

import (
	"context"
	"time"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
)

// freshReads is the read-freshness hook: it tracks the objects the served events reported stopped
// (stoppedTracker), and overlays the status reads whose answers show one of them running with the
// status the stream sent (see Config.ReadFreshness).
type freshReads struct {
	tracker *stoppedTracker
	metrics kubelet.Metrics
}

var _ kubelet.ReadHook = (*freshReads)(nil)

func newFreshReads(metrics kubelet.Metrics, now func() time.Time) *freshReads {
	return &freshReads{tracker: newStoppedTracker(now, stoppedTTL), metrics: metrics}
}

// Sending records a STOPPED (or forgets a DELETED object) before the event is sent.
func (f *freshReads) Sending(event []byte) { f.tracker.observe(event) }

// Wants the status reads while some object is tracked as stopped ahead of the runtime; a single atomic
// load for every other call.
func (f *freshReads) Wants(method string) bool { return f.tracker.any() && readFixes[method] != nil }

// Call makes the status read c (one call to the runtime) and leaves in it the runtime's answer, in
// which the objects it shows running that the stream reported stopped are shown as the stream reported
// them.
func (f *freshReads) Call(ctx context.Context, c *kubelet.Call, forward func(context.Context) error) error {
	if err := forward(ctx); err != nil {
		return err
	}
	answer, err := c.Answer()
	if err != nil || !f.tracker.mentioned(answer) {
		return nil // nothing in it is ahead of the runtime
	}
	if b := readFixes[c.Method()].overlay(f.tracker, c.Request(), answer); b != nil {
		c.SetAnswer(b)
		if m, ok := f.metrics.(kubelet.FreshnessMetrics); ok {
			m.OverlaidRead(c.Method())
		}
	}
	return nil
}

package kubelet

import (
	"time"

	"google.golang.org/grpc/codes"
)

// Metrics is told about the proxy's work. Implementations must be safe for concurrent use and fast.
type Metrics interface {
	// ForwardedCall is called when a forwarded call ends, with the full method name, the code the
	// client got and how long the call took (for a stream: its whole life).
	ForwardedCall(method string, code codes.Code, d time.Duration)
	// EventStreamOpened and EventStreamClosed count the open GetContainerEvents streams; closed gets
	// the code the stream ended with.
	EventStreamOpened()
	EventStreamClosed(code codes.Code)
	// EventSent is called for each event sent, with the time from its source to the send.
	EventSent(latency time.Duration)
	// RuntimeConnectionState is called when the connection to the runtime goes up or down.
	RuntimeConnectionState(up bool)
}

// NopMetrics is a Metrics that does nothing.
type NopMetrics struct{}

var _ Metrics = NopMetrics{}

// ForwardedCall does nothing.
func (NopMetrics) ForwardedCall(string, codes.Code, time.Duration) {}

// EventStreamOpened does nothing.
func (NopMetrics) EventStreamOpened() {}

// EventStreamClosed does nothing.
func (NopMetrics) EventStreamClosed(codes.Code) {}

// EventSent does nothing.
func (NopMetrics) EventSent(time.Duration) {}

// RuntimeConnectionState does nothing.
func (NopMetrics) RuntimeConnectionState(bool) {}

// FreshnessMetrics is implemented by a Metrics that wants to know about the status reads that showed
// running an object the event stream had already reported stopped (see fresh.Config.ReadFreshness).
type FreshnessMetrics interface {
	// OverlaidRead is called when the proxy answered a status read with the stopped status the event
	// stream had sent instead of the runtime's older one.
	OverlaidRead(method string)
}

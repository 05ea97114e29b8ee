package plugin

import "time"

// Metrics receives the plugin's measurements (PrometheusMetrics in the daemon). Every method is called
// from an NRI callback or the connection loop and must not block.
type Metrics interface {
	// HookDuration records how long the plugin took to handle one callback, from its arrival to its return.
	HookDuration(cb Callback, d time.Duration)
	// Observations counts the observations one callback handed to the observer.
	Observations(cb Callback, n int)
	// ConnectionState records whether the plugin is registered with the runtime.
	ConnectionState(up bool)
	// Reconnected counts a registration with the runtime after a lost connection (not the first one).
	Reconnected()
	// Synchronized records whether the plugin has answered the runtime's Synchronize on its current
	// connection: true once it has (the runtime holds its pod and container starts until it has that
	// answer), false when that connection is gone. Its true may come before or after ConnectionState's
	// (see Plugin.session).
	Synchronized(done bool)
}

// NopMetrics is a Metrics that records nothing.
type NopMetrics struct{}

var _ Metrics = NopMetrics{}

// HookDuration does nothing.
func (NopMetrics) HookDuration(Callback, time.Duration) {}

// Observations does nothing.
func (NopMetrics) Observations(Callback, int) {}

// ConnectionState does nothing.
func (NopMetrics) ConnectionState(bool) {}

// Reconnected does nothing.
func (NopMetrics) Reconnected() {}

// Synchronized does nothing.
func (NopMetrics) Synchronized(bool) {}

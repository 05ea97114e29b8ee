// Package retry has pleg-nri's one shape of delay between attempts: from an initial delay, doubling up
// to a bound, with no jitter (every retry here is of a local socket or a local daemon's answer, where
// many clients retrying in step is not a concern).
package retry

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Doubling returns the delays initial, 2*initial, ... up to max; Reset goes back to initial.
func Doubling(initial, max time.Duration) *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{InitialInterval: initial, Multiplier: 2, MaxInterval: max}
}

// Nth returns the delay before attempt n+1 of Doubling(initial, max), n counting from 0 (initial), for a
// caller that counts its attempts itself.
func Nth(initial, max time.Duration, n int) time.Duration {
	d := initial
	for i := 0; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

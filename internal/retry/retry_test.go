package retry

import (
	"testing"
	"time"
)

// TestDoubling: the delays double from the initial one up to the bound, with no jitter, and Reset starts
// over; Nth gives the same delays by number.
func TestDoubling(t *testing.T) {
	b := Doubling(2*time.Millisecond, 10*time.Millisecond)
	want := []time.Duration{2, 4, 8, 10, 10}
	for i, w := range want {
		w *= time.Millisecond
		if got := b.NextBackOff(); got != w {
			t.Errorf("delay %d: %s, want %s", i, got, w)
		}
		if got := Nth(2*time.Millisecond, 10*time.Millisecond, i); got != w {
			t.Errorf("Nth(%d): %s, want %s", i, got, w)
		}
	}
	b.Reset()
	if got := b.NextBackOff(); got != 2*time.Millisecond {
		t.Errorf("after Reset: %s, want 2ms", got)
	}
	if got := Nth(time.Second, time.Minute, 1000); got != time.Minute {
		t.Errorf("Nth of a large n: %s, want the bound", got)
	}
}

package testutil

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	var n atomic.Int32
	if err := Poll(context.Background(), time.Second, "the third call", func() (bool, error) { return n.Add(1) == 3, nil }); err != nil {
		t.Fatal(err)
	}
	err := Poll(context.Background(), 30*time.Millisecond, "never", func() (bool, error) { return false, errors.New("not yet") })
	if err == nil || !strings.Contains(err.Error(), "waiting for never: not yet") {
		t.Fatalf("Poll of a condition that never holds: %v", err)
	}
}

func TestClock(t *testing.T) {
	c := NewClock()
	start := c.Now()
	c.Advance(time.Second)
	if got := c.Now().Sub(start); got != time.Second {
		t.Fatalf("advanced by %s, want 1s", got)
	}
	c.Set(start)
	if !c.Now().Equal(start) {
		t.Fatalf("Set: %s, want %s", c.Now(), start)
	}
}

func TestPollEvery(t *testing.T) {
	var n atomic.Int32
	start := time.Now()
	if err := PollEvery(context.Background(), 5*time.Second, 50*time.Millisecond, "the third call", func() (bool, error) { return n.Add(1) == 3, nil }); err != nil {
		t.Fatal(err)
	}
	// At once, then twice more, 50 ms apart.
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("three calls in %s: not every 50 ms", d)
	}
}

func TestPollStop(t *testing.T) {
	exited := errors.New("it exited")
	var n atomic.Int32
	start := time.Now()
	err := Poll(context.Background(), time.Minute, "readiness", func() (bool, error) {
		if n.Add(1) == 2 {
			return false, Stop(exited)
		}
		return false, errors.New("not yet")
	})
	if !errors.Is(err, exited) || !strings.Contains(err.Error(), "readiness") || n.Load() != 2 {
		t.Fatalf("Poll after Stop: %v after %d calls, want %v at the second", err, n.Load(), exited)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Poll went on %s after Stop", d)
	}
}

package pleg

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestResyncer: a kick relists at once and then at each delay after it; a kick during the schedule
// relists at once and starts the schedule over. In a synctest bubble, so the times are exact.
func TestResyncer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var mu sync.Mutex // guards relists: Kick relists on the caller's goroutine, the schedule on run's
		var relists []time.Duration
		s := newResyncer(func() {
			mu.Lock()
			relists = append(relists, time.Since(start))
			mu.Unlock()
		}, []time.Duration{time.Second, 2 * time.Second})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- s.run(ctx) }()

		s.Kick()
		time.Sleep(1500 * time.Millisecond)
		s.Kick() // during the schedule: at once, then +1 s and +2 s from here
		time.Sleep(10 * time.Second)
		synctest.Wait()
		ms := time.Millisecond
		mu.Lock()
		defer mu.Unlock()
		if want := []time.Duration{0, 1000 * ms, 1500 * ms, 2500 * ms, 3500 * ms}; !slices.Equal(relists, want) {
			t.Errorf("relists at %v, want %v", relists, want)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

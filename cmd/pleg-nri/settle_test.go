package main

import (
	"context"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// TestSettler: a kick relists at once and then at each delay; a kick during the schedule starts it over.
func TestSettler(t *testing.T) {
	relists := make(chan struct{}, 100)
	timers := make(chan chan time.Time, 100)
	after := func(time.Duration) <-chan time.Time {
		c := make(chan time.Time, 1)
		timers <- c
		return c
	}
	s := newSettler(func() { relists <- struct{}{} }, []time.Duration{time.Second, 2 * time.Second}, after)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.run(ctx) }()
	expect := func(n int) {
		t.Helper()
		for range n {
			testutil.Receive(t, relists, struct{}{}, 5*time.Second)
		}
		select {
		case <-relists:
			t.Fatal("one relist too many")
		default:
		}
	}
	fire := func() {
		t.Helper()
		select {
		case c := <-timers:
			c <- time.Now()
		case <-time.After(5 * time.Second):
			t.Fatal("no timer")
		}
	}
	s.Kick()
	expect(1) // at once
	fire()
	expect(1) // +1s
	s.Kick()  // again: at once, then the schedule from the start
	expect(1)
	<-timers // the +2s timer of the first schedule, abandoned
	fire()
	expect(1)
	fire()
	expect(1)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Package testutil holds what the tests of every package share: one way to wait for a condition
// (Eventually, Poll, PollEvery), one manual clock (Clock), one look at a process (Alive, WaitGone) and
// one short temporary directory for unix sockets (ShortTempDir), one write of a file (WriteFile), one free loopback port (FreeLoopbackAddr),
// one capture of the global logger (CaptureLog), one buffer safe for concurrent use (SyncBuffer), one
// fake CRI runtime that answers Version (VersionRuntime, ServeVersionRuntime) and one fake /readyz
// (ServeReadyz).
// It is for tests and test harnesses only.
package testutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// PollInterval is how often Eventually and Poll look at their condition.
const PollInterval = 10 * time.Millisecond

// Eventually fails t unless cond returns true within timeout; what names the condition in the failure.
// cond is called at once, then every PollInterval.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := Poll(context.Background(), timeout, what, func() (bool, error) { return cond(), nil }); err != nil {
		t.Fatal(err)
	}
}

// Poll calls cond at once and then every PollInterval until it returns true, or until timeout or ctx ends;
// the error then names what and holds cond's last error.
func Poll(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	return PollEvery(ctx, timeout, PollInterval, what, cond)
}

// PollEvery is Poll with interval between the end of one call of cond and the next: for a condition
// that costs more than a look at memory (a call to a daemon, a command in a container), which a slow
// answer must not make back-to-back.
func PollEvery(ctx context.Context, timeout, interval time.Duration, what string, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		var stop stopError
		if errors.As(err, &stop) {
			return fmt.Errorf("gave up waiting for %s: %w", what, stop.err)
		}
		t.Reset(interval)
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("timed out after %s waiting for %s: %w", timeout, what, err)
			}
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		case <-t.C:
		}
	}
}

// Stop wraps the error a condition of Poll or PollEvery returns when waiting longer cannot make it true
// (the process it waits for has exited): the poll then ends at once with err.
func Stop(err error) error { return stopError{err} }

type stopError struct{ err error }

func (s stopError) Error() string { return s.err.Error() }
func (s stopError) Unwrap() error { return s.err }

// Receive reads from ch until want arrives, and fails t after timeout.
func Receive[T comparable](t testing.TB, ch <-chan T, want T, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case got := <-ch:
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("timed out after %s waiting for %v", timeout, want)
		}
	}
}

// Clock is a manual clock, safe for concurrent use: Now stays where Advance or Set put it.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock at a fixed, arbitrary instant (2023-11-14T22:13:20Z), the same in every test.
func NewClock() *Clock { return &Clock{now: time.Unix(1_700_000_000, 0)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Set puts the clock at t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// ShortTempDir is a new directory under os.TempDir with a short path (a unix socket's path is limited
// to 108 bytes, and t.TempDir's paths carry the test's name), removed when the test ends.
func ShortTempDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// WriteFile writes data to path (mode 0644), making its directory first (0755), and fails t if it
// cannot.
func WriteFile(t testing.TB, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Next returns the next value from ch, and fails t when none comes within timeout; what names the
// value in the failure.
func Next[T any](t testing.TB, ch <-chan T, what string, timeout time.Duration) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
	var zero T
	return zero
}

// StopProcess sends sig to p, whose Wait's result done delivers, and waits up to grace for it to
// exit; then it kills p and waits. It says whether p had to be killed.
func StopProcess(p *os.Process, done <-chan error, sig os.Signal, grace time.Duration) (killed bool) {
	_ = p.Signal(sig)
	select {
	case <-done:
		return false
	case <-time.After(grace):
		_ = p.Kill()
		<-done
		return true
	}
}

package pleg

import (
	"testing"
	"time"
)

// TestStatusRetriesDoNotMultiply: a container an input saw start whose CRI status never catches up (its
// start was cut short by a kill of containerd: the CRI says CREATED for good) is re-fetched one call at
// a time with backoff, and given up after the retry window: each answer must not start a second chain
// of retries (found by TestFaultContainerdKill: thousands of status calls a second).
func TestStatusRetriesDoNotMultiply(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1")
	now := h.clock.Now()
	h.cri.createContainer("c1", "s1", now)
	h.observe(nriContainer("c1", "s1", PhaseCreated, now))
	h.settle()
	// /tasks/start, and containerd's CRI never records the start.
	h.observe(Observation{Source: SourceTaskEvent, ID: "c1", Phase: PhaseRunning, StartedAt: now, SourceTime: now})
	calls := h.cri.statusCalls()
	for range 2000 {
		h.runDue()
		h.clock.Advance(10 * time.Millisecond)
		if h.p.st.objects["c1"].fetchGaveUp {
			break
		}
	}
	n := h.cri.statusCalls() - calls
	if !h.p.st.objects["c1"].fetchGaveUp {
		t.Fatalf("still retrying after %d status calls", n)
	}
	if n > defaultBackoff.maxAttempts {
		t.Errorf("%d status calls in the retry window, want at most %d", n, defaultBackoff.maxAttempts)
	}
	t.Logf("%d status calls before giving up", n)
}

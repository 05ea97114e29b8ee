package pleg

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

const testStall = 30 * time.Second

// stallProcess is a PLEG with a checkpoint, the default queue and a stall timeout of testStall, on a
// manual clock; no verification calls (the churn's observations carry their statuses).
func stallProcess(t *testing.T) (*harness, *testutil.Clock, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "checkpoint")
	clock, cri := testutil.NewClock(), newFakeCRI()
	h, _ := newProcess(t, cri, clock, path, func(c *Config) {
		c.SubscriberQueue = DefaultSubscriberQueue
		c.SubscriberStallTimeout = testStall
		c.VerifyDelay = -1
	})
	return h, clock, path
}

// churn creates and deletes n pods (8 events each, burstObservations) numbered from first, and applies
// them; the drain runs the sweep when a sweepPeriod has passed.
func churn(h *harness, first, n int) {
	for i := first; i < first+n; i++ {
		for _, o := range burstObservations(i, h.clock.Now()) {
			h.p.Observe(o)
		}
	}
	h.p.drain(h.ctx)
}

// checkpointPhase reads the checkpoint at path and returns the phase it records for the object id
// (PhaseNone when it does not record it).
func checkpointPhase(t *testing.T, path, id string) Phase {
	t.Helper()
	c, err := ReadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range c.Objects {
		if o.ID == id {
			return o.Phase
		}
	}
	return PhaseNone
}

// TestStalledSubscriberEvicted: a subscriber that takes no event while pods churn through the fan-out
// (fewer distinct pods than its queue: it is coalesced, its queue never fills) is evicted with
// RESOURCE_EXHAUSTED at the first sweep after testStall without progress, through the eviction path of
// a full queue (metric, stats); the subscribers that read are untouched; the checkpoint's watermark,
// which it held back, advances at once, and the deleted objects kept for it are released.
func TestStalledSubscriberEvicted(t *testing.T) {
	h, clock, path := stallProcess(t)
	other := h.p.Subscribe()
	read := func() {
		h.events()
		pending(other)
	}
	churn(h, 0, 10)
	read()

	stuck := h.p.Subscribe()
	// Received by the readers, not by stuck; coalesced in stuck's queue to STARTED live-c, its oldest
	// event from then on: the checkpoint records live-c created, not running.
	h.startPod("live", "live-c")
	read()
	start := clock.Now()     // stuck's queue is not empty from here on
	const podsPerSecond = 10 // 300 distinct pods within testStall (2 events each once coalesced): never a full queue
	pod := 10
	for clock.Now().Sub(start) < testStall-time.Second {
		clock.Advance(time.Second)
		churn(h, pod, podsPerSecond)
		pod += podsPerSecond
		read()
		if st := stuck.Stats(); st.Evicted {
			t.Fatalf("stuck evicted %s after its queue filled, before the bound %s: %+v", clock.Now().Sub(start), testStall, st)
		}
	}
	st := stuck.Stats()
	if st.Coalesced == 0 || st.Queued == 0 || st.Queued >= DefaultSubscriberQueue {
		t.Fatalf("stuck before the bound: %+v, want coalesced with a queue not full", st)
	}
	h.mustWriteCheckpoint()
	if ph := checkpointPhase(t, path, "live-c"); ph != PhaseCreated || len(h.p.st.unacked) == 0 {
		t.Fatalf("before the eviction: live-c recorded %s, %d deleted objects kept; want %s (stuck has not received its STARTED) and some kept",
			ph, len(h.p.st.unacked), PhaseCreated)
	}
	kept := len(h.p.st.unacked)

	// The sweep samples progress once a sweepPeriod: stuck goes within two of them after the bound.
	for !stuck.Stats().Evicted && clock.Now().Sub(start) < testStall+2*sweepPeriod {
		clock.Advance(time.Second)
		churn(h, pod, 1)
		pod++
		read()
	}
	st = stuck.Stats()
	if !st.Evicted {
		t.Fatalf("stuck not evicted %s after its queue filled (bound %s): %+v", clock.Now().Sub(start), testStall, st)
	}
	t.Logf("stuck evicted %s after its queue filled (bound %s)", clock.Now().Sub(start), testStall)
	err := stuck.nextErr()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "took no event") {
		t.Errorf("stuck's Next: %v, want ResourceExhausted saying it took no event", err)
	}
	if st.Queued != 0 || st.Offered != st.Delivered+st.Coalesced+st.Dropped {
		t.Errorf("stuck's stats after the eviction: %+v", st)
	}
	if len(h.metrics.evictedWhy) != 1 || h.metrics.evictedWhy[0] != EvictedStalled || h.p.fan.count() != 2 {
		t.Errorf("evictions %v, subscribers %d; want one %s and 2", h.metrics.evictedWhy, h.p.fan.count(), EvictedStalled)
	}
	for name, s := range map[string]*Subscription{"h.sub": h.sub, "other": other} {
		if st := s.Stats(); st.Evicted || st.Offered != st.Delivered || st.Offered == 0 {
			t.Errorf("%s: %+v, want every event delivered, not evicted", name, st)
		}
	}

	h.mustWriteCheckpoint()
	if got, want := h.p.fan.delivered(), h.p.fan.seq; got != want {
		t.Errorf("watermark %d after the eviction, want every event (%d)", got, want)
	}
	if ph := checkpointPhase(t, path, "live-c"); ph != PhaseRunning {
		t.Errorf("the checkpoint records live-c %s after stuck's eviction, want %s", ph, PhaseRunning)
	}
	if len(h.p.st.unacked) != 0 {
		t.Errorf("%d deleted objects still kept after the eviction (%d before)", len(h.p.st.unacked), kept)
	}
}

// TestSlowSubscriberNotEvicted: a subscriber that takes an event a little more often than the stall
// timeout, its queue never empty, is never evicted; nor is one that has nothing to take on a quiet
// node, however long.
func TestSlowSubscriberNotEvicted(t *testing.T) {
	h, clock, _ := stallProcess(t)
	idle := h.p.Subscribe()
	slow := h.p.Subscribe()
	churn(h, 0, 100) // 800 events queued for slow
	taken := 0
	for step := range 10 * 60 { // 10 minutes
		clock.Advance(time.Second)
		if step%5 == 0 {
			churn(h, 100+step, 1)
		} else {
			h.p.drain(h.ctx) // the sweep, every second as Run's
		}
		if step%(int(testStall/time.Second)-1) == 0 {
			if _, err := slow.Next(h.ctx); err != nil {
				t.Fatalf("slow's Next after %d events: %v", taken, err)
			}
			taken++
		}
		h.events()
		pending(idle)
	}
	if st := slow.Stats(); st.Evicted || st.Queued == 0 {
		t.Errorf("slow: %+v, want not evicted and still behind", st)
	}
	// A quiet node: nothing queued for anyone for an hour.
	pending(slow)
	for range 3600 {
		clock.Advance(time.Second)
		h.p.drain(h.ctx)
	}
	for name, s := range map[string]*Subscription{"idle": idle, "slow": slow, "h.sub": h.sub} {
		if s.Stats().Evicted {
			t.Errorf("%s evicted: %+v", name, s.Stats())
		}
	}
	if h.metrics.evicted != 0 {
		t.Errorf("%d evictions", h.metrics.evicted)
	}
}

// TestStallTimeoutSkipsCoreFreeze: a core that did not run for longer than the stall timeout (SIGSTOP,
// a paused VM: its sweep's clock jumps) does not evict the subscribers that had events queued, which
// could not take them either; their wait starts again, and one that still takes nothing goes after
// the timeout.
func TestStallTimeoutSkipsCoreFreeze(t *testing.T) {
	h, clock, _ := stallProcess(t)
	stuck := h.p.Subscribe()
	churn(h, 0, 10)
	h.events()
	clock.Advance(time.Second)
	h.p.drain(h.ctx) // the sweep sees stuck's queue
	clock.Advance(10 * time.Minute)
	h.p.drain(h.ctx)
	if st := stuck.Stats(); st.Evicted {
		t.Fatalf("stuck evicted at the first sweep after the core's freeze: %+v", st)
	}
	for range int((testStall + 2*sweepPeriod) / time.Second) {
		clock.Advance(time.Second)
		h.p.drain(h.ctx)
	}
	if st := stuck.Stats(); !st.Evicted {
		t.Errorf("stuck not evicted %s after the core ran again: %+v", testStall+2*sweepPeriod, st)
	}
}

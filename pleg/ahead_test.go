package pleg

import (
	"testing"
	"time"
)

// TestStoppedAhead: a STOPPED emitted while the CRI still says RUNNING marks the container "stopped
// ahead" until a status answer says EXITED; one emitted after the CRI caught up does not; removal and
// the TTL end the mark too.
func TestStoppedAhead(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1", "c1", "c2", "c3")
	h.events()
	if h.p.AnyStoppedAhead() {
		t.Fatal("stopped ahead before any exit")
	}

	// c1 exits; the task event comes before containerd's CRI handled the exit.
	h.clock.Advance(time.Millisecond)
	h.observe(taskExit("c1", 1, h.clock.Now()))
	if got := summary(h.events()); len(got) != 1 || got[0] != "STOPPED c1" {
		t.Fatalf("events %v, want STOPPED c1", got)
	}
	if !h.p.AnyStoppedAhead() || !h.p.StoppedAhead("c1") || h.p.StoppedAhead("c2") {
		t.Fatalf("after STOPPED c1 with the CRI behind: any %v, c1 %v, c2 %v", h.p.AnyStoppedAhead(), h.p.StoppedAhead("c1"), h.p.StoppedAhead("c2"))
	}
	// containerd's CRI catches up; the verification call sees it.
	h.cri.exitContainer("c1", 1, h.clock.Now())
	h.clock.Advance(DefaultVerifyDelay)
	h.settle()
	if h.p.StoppedAhead("c1") || h.p.AnyStoppedAhead() {
		t.Error("c1 still stopped ahead after a status answer said EXITED")
	}

	// c2: the CRI handled the exit before the event was built: never ahead.
	h.clock.Advance(time.Millisecond)
	h.cri.exitContainer("c2", 0, h.clock.Now())
	h.observe(taskExit("c2", 0, h.clock.Now()))
	h.settle()
	if h.p.StoppedAhead("c2") {
		t.Error("c2 stopped ahead although the CRI said EXITED first")
	}

	// c3: ahead, then removed: no longer ahead.
	h.clock.Advance(time.Millisecond)
	h.observe(taskExit("c3", 2, h.clock.Now()))
	if !h.p.StoppedAhead("c3") {
		t.Fatal("c3 not stopped ahead")
	}
	h.cri.removeContainer("c3")
	h.observe(nriContainer("c3", "s1", PhaseRemoved, h.clock.Now()))
	h.settle()
	if h.p.StoppedAhead("c3") {
		t.Error("c3 still stopped ahead after its DELETED")
	}
}

// TestStoppedAheadExpires: a CRI that never catches up does not keep an object ahead forever.
func TestStoppedAheadExpires(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1", "c1")
	h.clock.Advance(time.Millisecond)
	h.observe(taskExit("c1", 1, h.clock.Now()))
	h.settle()
	if !h.p.StoppedAhead("c1") {
		t.Fatal("c1 not stopped ahead")
	}
	h.clock.Advance(aheadTTL)
	h.observe() // a drain sweeps
	if h.p.StoppedAhead("c1") || h.p.AnyStoppedAhead() {
		t.Error("c1 still stopped ahead after aheadTTL")
	}
}

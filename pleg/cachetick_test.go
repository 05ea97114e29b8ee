package pleg

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// tick applies the inbox and sends the cache tick, as Run's processing loop does every Config.CacheTick.
func (h *harness) tick() []Event {
	h.p.mu.Lock()
	h.p.drainLocked(h.ctx)
	h.p.st.cacheTick(h.ctx)
	h.p.mu.Unlock()
	return h.events()
}

// TestCacheTick: a tick sends, for every pod whose events are all out, a CREATED about its sandbox with
// the statuses containerd gives and a created_at after the pod's other events; a pod with an event on its
// way gets none (that event is newer), and the tick is never replayed to a late subscriber.
func TestCacheTick(t *testing.T) {
	h := newHarness(t)
	last := map[string]int64{}
	for _, ev := range append(h.startPod("s1", "c1", "c2"), h.startPod("s2")...) {
		last[ev.Response.PodSandboxStatus.Id] = ev.Response.CreatedAt
	}

	h.clock.Advance(time.Second)
	evs := h.tick()
	got := summary(evs)
	slices.Sort(got)
	if d := cmp.Diff([]string{"CREATED s1", "CREATED s2"}, got); d != "" {
		t.Fatalf("tick (-want +got):\n%s", d)
	}
	for _, ev := range evs {
		sb := ev.Response.ContainerId
		if ev.Source != SourceTick || !ev.notReplayed {
			t.Errorf("%s: source %v, replayed %v; want tick, never replayed", sb, ev.Source, !ev.notReplayed)
		}
		if ev.Response.CreatedAt <= last[sb] {
			t.Errorf("%s: created_at %d, not after the pod's last event %d", sb, ev.Response.CreatedAt, last[sb])
		}
		last[sb] = ev.Response.CreatedAt
		if d := diffProto(h.cri.sandbox(sb), ev.Response.PodSandboxStatus); d != "" {
			t.Errorf("%s: sandbox status (-cri +tick):\n%s", sb, d)
		}
	}
	s1 := evs[slices.IndexFunc(evs, func(ev Event) bool { return ev.Response.ContainerId == "s1" })]
	if len(s1.Response.ContainersStatuses) != 2 {
		t.Fatalf("s1's tick carries %d container statuses, want 2", len(s1.Response.ContainersStatuses))
	}
	for _, c := range []string{"c1", "c2"} {
		if d := diffProto(h.cri.container(c), statusOf(s1, c)); d != "" {
			t.Errorf("%s: status (-cri +tick):\n%s", c, d)
		}
	}

	// A container whose status is still being fetched: its pod's CREATED waits, and so does the tick.
	h.clock.Advance(time.Millisecond)
	h.cri.createContainer("c3", "s1", h.clock.Now())
	h.observe(nriContainer("c3", "s1", PhaseCreated, h.clock.Now()))
	if got := summary(h.tick()); !slices.Equal(got, []string{"CREATED s2"}) {
		t.Fatalf("tick with s1's CREATED c3 pending: %v, want only s2's", got)
	}
	h.settle()
	if got := summary(h.events()); !slices.Equal(got, []string{"CREATED c3"}) {
		t.Fatalf("after the fetch: %v, want CREATED c3", got)
	}
	h.clock.Advance(time.Second)
	got = summary(h.tick())
	slices.Sort(got)
	if d := cmp.Diff([]string{"CREATED s1", "CREATED s2"}, got); d != "" {
		t.Fatalf("tick after the fetch (-want +got):\n%s", d)
	}
	if n := h.metrics.ticks; n != 5 {
		t.Errorf("ticks counted %d, want 5", n)
	}

	// A new sandbox of s1's pod (same uid): only it ticks for that pod, the kubelet's cache being the
	// pod's, not the sandbox's.
	h.clock.Advance(time.Millisecond)
	h.cri.runSandbox("s3", h.clock.Now()).Metadata.Uid = "uid-s1"
	h.observe(nriSandbox("s3", PhaseRunning, h.clock.Now()))
	h.settle()
	h.events()
	h.clock.Advance(time.Second)
	got = summary(h.tick())
	slices.Sort(got)
	if d := cmp.Diff([]string{"CREATED s2", "CREATED s3"}, got); d != "" {
		t.Fatalf("tick with two sandboxes of one pod (-want +got):\n%s", d)
	}
}

// TestCacheTickNoSubscriber: with nobody subscribed, a tick sends nothing (and so takes no sequence
// number of the fan-out).
func TestCacheTickNoSubscriber(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1", "c1")
	h.sub.Close()
	seq := h.p.fan.seq
	h.tick()
	if h.p.fan.seq != seq {
		t.Errorf("a tick with no subscriber published %d events", h.p.fan.seq-seq)
	}
}

// TestCacheTickNeverReplayed: a tick is sent to the subscribers connected when it is made, never
// kept in a replay for later ones (a late subscriber would take a stale pod status for news): with a
// replay kept (here the one for reconnections, ReplayForReconnects), a subscriber that comes after a
// tick gets the pods' events from the replay but not the tick.
func TestCacheTickNeverReplayed(t *testing.T) {
	h := newHarness(t)
	h.p.ReplayForReconnects()
	started := summary(h.startPod("s1", "c1"))
	h.clock.Advance(time.Second)
	if got := summary(h.tick()); !slices.Equal(got, []string{"CREATED s1"}) {
		t.Fatalf("tick: %v, want s1's", got)
	}
	late := h.p.Subscribe()
	defer late.Close()
	if d := cmp.Diff(started, summary(pending(late))); d != "" {
		t.Errorf("a subscriber after the tick got (-want +got):\n%s", d)
	}
}

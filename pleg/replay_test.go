package pleg

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// samePod makes sandbox id a new sandbox of the pod of sandbox of (same uid and name), as the kubelet
// makes after a sandbox died.
func (f *fakeCRI) samePod(id, of string, attempt uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := proto.Clone(f.sandboxes[id]).(*runtimeapi.PodSandboxStatus)
	c.Metadata = proto.Clone(f.sandboxes[of].Metadata).(*runtimeapi.PodSandboxMetadata)
	c.Metadata.Attempt = attempt
	c.Labels = f.sandboxes[of].Labels
	f.sandboxes[id] = c
}

// TestReplayLeavesOutDeletedOfReplacedSandbox (issue 11, item 5): kubelet 1.35/1.36 apply a sandbox's
// DELETED with cache.Delete(pod uid), whatever the event's time. The startup replay must not hand a
// subscriber the DELETED of a pod's old sandbox, removed while pleg-nri was down, when the pod has a newer
// live sandbox: the kubelet would wipe the live sandbox's status from its cache until its next relist.
// A subscriber connected at the time gets it, as from containerd's stream.
func TestReplayLeavesOutDeletedOfReplacedSandbox(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint")
	clock, cri := testutil.NewClock(), newFakeCRI()
	h, _ := newProcess(t, cri, clock, path)
	if _, err := h.p.Relist(h.ctx); err != nil {
		t.Fatal(err)
	}
	h.startPod("old", "c1")
	// The pod's sandbox died; the kubelet made a new one for the same pod.
	clock.Advance(time.Millisecond)
	cri.exitContainer("c1", 0, clock.Now())
	h.observe(nriExit("c1", "old", 0, clock.Now(), clock.Now()))
	cri.stopSandbox("old")
	h.observe(nriSandbox("old", PhaseExited, clock.Now()))
	h.settle()
	clock.Advance(time.Millisecond)
	cri.runSandbox("new", clock.Now())
	cri.samePod("new", "old", 1)
	h.observe(nriSandbox("new", PhaseRunning, clock.Now()))
	h.settle()
	h.events()
	h.mustWriteCheckpoint()

	// pleg-nri is down; the kubelet's garbage collector removes the old sandbox.
	clock.Advance(time.Minute)
	cri.removeContainer("c1")
	cri.removeSandbox("old")

	h2, _ := newProcess(t, cri, clock, path, func(c *Config) { c.StartupReplay = time.Minute })
	live := h2.restart() // h2's subscriber was there from the start: it gets everything
	if !slices.Contains(summary(live), "DELETED old") {
		t.Fatalf("the restart did not report the old sandbox's removal: %v", summary(live))
	}
	late := h2.p.Subscribe()
	defer late.Close()
	replay := pending(late)
	if len(replay) == 0 {
		t.Fatal("empty startup replay")
	}
	if slices.Contains(summary(replay), "DELETED old") {
		t.Errorf("the startup replay has the DELETED of sandbox old while the pod's sandbox new is live: kubelet 1.36 would delete the pod's cache entry (replay %v)", summary(replay))
	}
}

// TestReplayForReconnects (issue 56): once the front that relayed the subscribers' streams went away
// (ReplayForReconnects), a subscriber that subscribes within ReconnectReplay, as the kubelet does
// through the new front, gets every event since, then the new ones: an exit between the front's end
// and the kubelet's new subscription is not lost (a 1.35/1.36 kubelet relists at the stream's end,
// before it subscribes again, and then only every 300 s). The events are not recorded as received
// (the checkpoint's watermark) until a subscriber took them; after the window, new subscribers get only
// new events. It failed before: the reconnecting subscriber got nothing of the gap.
func TestReplayForReconnects(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1")
	// h.sub is a subscriber that stays (a client of the core's own socket); the front's subscription
	// is gone with it.
	h.p.ReplayForReconnects()
	gap := summary(h.startPod("s2", "c2"))
	if len(gap) == 0 {
		t.Fatal("no event in the gap")
	}
	if got, before := h.p.fan.delivered(), h.p.fan.seq; got >= before {
		t.Errorf("delivery watermark %d with the gap's events kept for a reconnection, want below %d", got, before)
	}
	again := h.p.Subscribe()
	if d := cmp.Diff(gap, summary(pending(again))); d != "" {
		t.Errorf("the reconnecting subscriber's first events (-want +got):\n%s", d)
	}
	if got, want := h.p.fan.delivered(), h.p.fan.seq; got != want {
		t.Errorf("delivery watermark %d once a subscriber took the gap's events, want %d", got, want)
	}
	h.clock.Advance(ReconnectReplay + time.Second)
	h.p.drain(h.ctx)
	if h.p.fan.replay.open.Load() {
		t.Fatal("the reconnection replay is kept after its window")
	}
	if evs := pending(h.p.Subscribe()); len(evs) != 0 {
		t.Errorf("a subscriber after the window got %v", summary(evs))
	}
	again.Close()
}

package pleg

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestRefreshStopped: a refresh of a stopped container, or of a stopped sandbox, sends its STOPPED
// again with a newer created_at and the statuses containerd gives; a refresh of a running object, of
// an unknown or removed one, or while the pod has an event pending, sends nothing.
func TestRefreshStopped(t *testing.T) {
	h := newHarness(t)
	h.startPod("s1", "c1", "c2")

	h.p.RefreshStopped("c1") // running
	h.p.RefreshStopped("nope")
	h.settle()
	if evs := h.events(); len(evs) != 0 {
		t.Fatalf("refresh of a running or unknown object sent %v", summary(evs))
	}

	h.clock.Advance(time.Second)
	h.cri.exitContainer("c1", 0, h.clock.Now())
	h.observe(taskExit("c1", 0, h.clock.Now()))
	h.settle()
	stopped := h.events()
	if d := cmp.Diff([]string{"STOPPED c1"}, summary(stopped)); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}

	h.clock.Advance(50 * time.Millisecond)
	h.p.RefreshStopped("c1")
	h.settle()
	evs := h.events()
	if d := cmp.Diff([]string{"STOPPED c1"}, summary(evs)); d != "" {
		t.Fatalf("refresh (-want +got):\n%s", d)
	}
	if got, prev := evs[0].Response.CreatedAt, stopped[0].Response.CreatedAt; got <= prev {
		t.Errorf("refresh created_at %d, not after the STOPPED's %d", got, prev)
	}
	if d := diffProto(h.cri.container("c1"), statusOf(evs[0], "c1")); d != "" {
		t.Errorf("refreshed status (-cri +event):\n%s", d)
	}
	if d := diffProto(h.cri.container("c2"), statusOf(evs[0], "c2")); d != "" {
		t.Errorf("other container's status (-cri +event):\n%s", d)
	}
	if d := diffProto(h.cri.sandbox("s1"), evs[0].Response.PodSandboxStatus); d != "" {
		t.Errorf("sandbox status (-cri +event):\n%s", d)
	}
	if evs[0].Source != SourceRefresh {
		t.Errorf("source %v, want %v", evs[0].Source, SourceRefresh)
	}

	// Asked for while another container's exit is on its way: in order, after it.
	h.clock.Advance(time.Second)
	h.cri.exitContainer("c2", 1, h.clock.Now())
	h.p.Observe(taskExit("c2", 1, h.clock.Now()))
	h.p.RefreshStopped("c1")
	h.settle()
	evs = h.events()
	if d := cmp.Diff([]string{"STOPPED c2", "STOPPED c1"}, summary(evs)); d != "" {
		t.Fatalf("refresh after another exit (-want +got):\n%s", d)
	}
	if evs[1].Response.CreatedAt <= evs[0].Response.CreatedAt {
		t.Errorf("created_at not increasing: %d then %d", evs[0].Response.CreatedAt, evs[1].Response.CreatedAt)
	}
	if d := diffProto(h.cri.container("c2"), statusOf(evs[1], "c2")); d != "" {
		t.Errorf("refresh's status of c2 (-cri +event):\n%s", d)
	}

	// The sandbox, once stopped.
	h.clock.Advance(time.Second)
	h.cri.stopSandbox("s1")
	h.observe(nriSandbox("s1", PhaseExited, h.clock.Now()))
	h.settle()
	if d := cmp.Diff([]string{"STOPPED s1"}, summary(h.events())); d != "" {
		t.Fatalf("sandbox stop (-want +got):\n%s", d)
	}
	h.p.RefreshStopped("s1")
	h.settle()
	evs = h.events()
	if d := cmp.Diff([]string{"STOPPED s1"}, summary(evs)); d != "" {
		t.Fatalf("sandbox refresh (-want +got):\n%s", d)
	}
	if d := diffProto(h.cri.sandbox("s1"), evs[0].Response.PodSandboxStatus); d != "" {
		t.Errorf("refreshed sandbox status (-cri +event):\n%s", d)
	}

	// Removed: nothing.
	h.cri.removeSandbox("s1")
	if _, err := h.p.Relist(h.ctx); err != nil {
		t.Fatal(err)
	}
	h.settle()
	h.events()
	h.p.RefreshStopped("s1")
	h.p.RefreshStopped("c1")
	h.settle()
	if evs := h.events(); len(evs) != 0 {
		t.Fatalf("refresh of removed objects sent %v", summary(evs))
	}
}

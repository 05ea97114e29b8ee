package pleg

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Restart worlds (mode bit 4): pleg-nri writes its checkpoint at random points, its subscriber takes
// events at random points, and it is killed (up to twice) at random points: the events still queued
// for the subscriber are lost with it, so are the observations in flight and the status answers; a new
// pleg-nri starts from the checkpoint, NRI synchronizes it, and the world goes on. The checks: no
// process emits again what the checkpoint it started from says was received; within one process,
// every transition once; over all processes, every transition the runtime made (as its final state
// tells) at least once.

// restartSegment is what one pleg-nri process did.
type restartSegment struct {
	// baseline is the checkpoint the process started from: phase by id.
	baseline map[string]Phase
	// live is, per pod, the containers the process started with in its containers_statuses.
	live map[string]map[string]bool
	// events are the events its subscriber received.
	events []Event
}

const maxKills = 2

func newWorldHarness(t testing.TB, mode int) *harness {
	if mode&4 == 0 {
		return newHarness(t)
	}
	path := filepath.Join(t.TempDir(), "checkpoint")
	h := newHarness(t, func(c *Config) {
		c.CheckpointPath = path
		c.CheckpointScope = testScope
		c.SubscriberQueue = 4096
	})
	return h
}

// keepCheckpoint makes the current process's checkpoint writes go to memory: the worlds write
// thousands; the last one reaches the file when the process is killed.
func (w *world) keepCheckpoint() {
	w.h.p.ckpt.write = func(_ string, data []byte) error {
		w.ckptData = slices.Clone(data)
		return nil
	}
}

// crashStep is one random step of a restart world: receive events, write the checkpoint, or kill.
func (w *world) crashStep() {
	if len(w.segments) == 0 {
		w.segments = []*restartSegment{{baseline: map[string]Phase{}, live: map[string]map[string]bool{}}}
		w.keepCheckpoint()
	}
	seg := w.segments[len(w.segments)-1]
	switch w.c.intn(24) {
	case 0, 1, 2, 3, 4, 5:
		for range 1 + w.c.intn(3) {
			if ev, ok := next(w.h.sub); ok {
				seg.events = append(seg.events, ev)
			}
		}
	case 6, 7:
		w.h.p.writeCheckpoint(w.h.ctx)
		w.checkCheckpoint(seg)
	case 8:
		if w.kills < maxKills {
			w.kill()
		}
	}
}

// next takes one queued event, if any.
func next(s *Subscription) (Event, bool) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ev, err := s.Next(ctx)
	return ev, err == nil
}

// checkCheckpoint checks that the checkpoint just written records, for every object, at least what the
// subscriber received (so that an object missing from the next process's baseline really was received
// after the last write), and nothing deleted whose DELETED was received.
func (w *world) checkCheckpoint(seg *restartSegment) {
	t := w.h.t
	t.Helper()
	if w.ckptData == nil {
		return
	}
	c, err := decodeCheckpoint(w.ckptData)
	if err != nil {
		t.Fatalf("checkpoint written: %v", err)
	}
	got := map[string]Phase{}
	for _, p := range c.pods {
		got[p.id] = p.sandbox.phase
		for _, ct := range p.containers {
			got[ct.id] = ct.phase
		}
	}
	want := maps.Clone(seg.baseline)
	for _, ev := range seg.events {
		want[ev.Response.ContainerId] = max(want[ev.Response.ContainerId], eventPhase(ev.Response.ContainerEventType))
	}
	for id, ph := range want {
		switch {
		case ph == PhaseRemoved:
			if _, ok := got[id]; ok {
				t.Fatalf("checkpoint holds %s, whose DELETED was received", id)
			}
		case got[id] == PhaseRunning && ph == PhaseExited && w.object(id) != nil && w.object(id).corrected:
			// Its corrected STOPPED (a late OOMKilled) was not received: the next process emits
			// STOPPED again, with the corrected status.
		case got[id] < ph:
			t.Fatalf("checkpoint says %s %s, the subscriber received %s", id, got[id], ph)
		}
	}
}

// object returns the current process's object id, deleted ones whose DELETED is unreceived included.
func (w *world) object(id string) *object {
	if o := w.h.p.st.objects[id]; o != nil {
		return o
	}
	for _, o := range w.h.p.st.unacked {
		if o.id == id {
			return o
		}
	}
	return nil
}

// kill ends the current pleg-nri (what its subscriber had not taken is lost, as are the inputs in
// flight) and starts a new one from the checkpoint on disk.
func (w *world) kill() {
	w.kills++
	old := w.h
	path := old.p.cfg.CheckpointPath
	// A restart takes time: the new process's clock is past every created_at the old one emitted, which
	// run ahead of its clock by 1 ns per event emitted at one reading. (Without it, the fuzzer found a
	// new process emitting at the very reading its predecessor had emitted after its last checkpoint.)
	old.clock.Advance(time.Millisecond)
	old.sub.Close()
	w.nri, w.task, w.flight = nil, nil, nil
	if w.ckptData != nil {
		if err := os.WriteFile(path, w.ckptData, 0o600); err != nil {
			old.t.Fatal(err)
		}
	}
	seg := &restartSegment{}
	seg.baseline, seg.live = checkpointBaseline(path)
	w.segments = append(w.segments, seg)
	h, _ := newProcess(old.t, old.cri, old.clock, path, func(c *Config) { c.SubscriberQueue = 4096 })
	w.h = h
	w.keepCheckpoint()
	h.nriSync()
}

// checkpointBaseline returns what the checkpoint at path says was received: the phase by id, and by pod
// the containers in its containers_statuses. Both are empty when there is no usable checkpoint.
func checkpointBaseline(path string) (map[string]Phase, map[string]map[string]bool) {
	baseline, live := map[string]Phase{}, map[string]map[string]bool{}
	c, err := ReadCheckpoint(path)
	if err != nil {
		return baseline, live
	}
	for _, o := range c.Objects {
		baseline[o.ID] = o.Phase
		if o.Kind == KindContainer {
			if live[o.SandboxID] == nil {
				live[o.SandboxID] = map[string]bool{}
			}
			live[o.SandboxID][o.ID] = true
		}
	}
	return baseline, live
}

// endSegments takes what the last process's subscriber has left.
func (w *world) endSegments() {
	seg := w.segments[len(w.segments)-1]
	seg.events = append(seg.events, w.h.events()...)
}

// checkRestarts checks a restart world's segments: each process's stream keeps the contract
// (eventChecker, from the checkpoint it started from), and over all of them every transition the runtime
// made was emitted at least once.
func checkRestarts(t testing.TB, w *world) {
	t.Helper()
	union := map[string]map[runtimeapi.ContainerEventType]bool{}
	var all []string
	for k, seg := range w.segments {
		for _, s := range summary(seg.events) {
			all = append(all, fmt.Sprintf("%d:%s", k, s))
		}
	}
	chk := newEventChecker(w.sandbox)
	for k, seg := range w.segments {
		chk.restart(seg.baseline, seg.live)
		for i, ev := range seg.events {
			if msg := chk.check(ev); msg != "" {
				t.Fatalf("process %d (of %d, %d kills), event %d (%s): %s\nits baseline: %v\nall: %v", k, len(w.segments), w.kills, i,
					summary(seg.events[i : i+1])[0], msg, seg.baseline, all)
			}
			id, typ := ev.Response.ContainerId, ev.Response.ContainerEventType
			if union[id] == nil {
				union[id] = map[runtimeapi.ContainerEventType]bool{}
			}
			if union[id][typ] && chk.objects[id].count[typ] == 1 {
				w.redelivered++ // received from an earlier process after its last checkpoint write
			}
			union[id][typ] = true
		}
	}
	// Every transition the runtime made, at least once over all the processes.
	cri := w.h.cri
	check := func(id string, want ...runtimeapi.ContainerEventType) {
		t.Helper()
		for _, typ := range want {
			if !union[id][typ] {
				t.Errorf("%s: %s never emitted (%d kills): %v", id, typ, w.kills, all)
			}
		}
	}
	sbs, _ := cri.ListPodSandbox(w.h.ctx)
	ctrs, _ := cri.ListContainers(w.h.ctx)
	present := map[string]bool{}
	for _, sb := range sbs {
		present[sb.Id] = true
		if sb.State == runtimeapi.PodSandboxState_SANDBOX_READY {
			check(sb.Id, evCreated, evStarted)
		} else {
			check(sb.Id, evCreated, evStopped)
		}
	}
	for _, c := range ctrs {
		present[c.Id] = true
		switch c.State {
		case runtimeapi.ContainerState_CONTAINER_CREATED:
			check(c.Id, evCreated)
		case runtimeapi.ContainerState_CONTAINER_RUNNING:
			check(c.Id, evCreated, evStarted)
		case runtimeapi.ContainerState_CONTAINER_EXITED:
			check(c.Id, evCreated, evStopped)
		}
	}
	for id, u := range union {
		if present[id] {
			if u[evDeleted] {
				t.Errorf("%s: DELETED while it is still in the runtime: %v", id, all)
			}
			continue
		}
		if !u[evDeleted] && unknownToNext(w, id) {
			// Known limit: its events were received after the last checkpoint write before a kill, and
			// it was gone before the next pleg-nri had its status: that one never knew of it.
			w.unseenEnds++
			continue
		}
		// Removed: it was seen, so its removal must be told.
		check(id, evDeleted)
		if u[evStarted] {
			check(id, evStopped)
		}
	}
}

// unknownToNext says whether the process after the last one that emitted an event of id started
// without id in its checkpoint, and never emitted anything of it.
func unknownToNext(w *world, id string) bool {
	last := -1
	for k, seg := range w.segments {
		for _, ev := range seg.events {
			if ev.Response.ContainerId == id {
				last = k
			}
		}
	}
	if last < 0 || last+1 >= len(w.segments) {
		return false
	}
	_, known := w.segments[last+1].baseline[id]
	return !known
}

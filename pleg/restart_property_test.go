package pleg

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

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
	old.sub.Close()
	w.nri, w.task, w.flight = nil, nil, nil
	if w.ckptData != nil {
		if err := os.WriteFile(path, w.ckptData, 0o600); err != nil {
			old.t.Fatal(err)
		}
	}
	seg := &restartSegment{baseline: map[string]Phase{}, live: map[string]map[string]bool{}}
	if c, err := ReadCheckpoint(path); err == nil {
		for _, o := range c.Objects {
			seg.baseline[o.ID] = o.Phase
			if o.Kind == KindContainer {
				if seg.live[o.SandboxID] == nil {
					seg.live[o.SandboxID] = map[string]bool{}
				}
				seg.live[o.SandboxID][o.ID] = true
			}
		}
	}
	w.segments = append(w.segments, seg)
	h, _ := newProcess(old.t, old.cri, old.clock, path, func(c *Config) { c.SubscriberQueue = 4096 })
	w.h = h
	w.keepCheckpoint()
	h.nriSync()
}

// endSegments takes what the last process's subscriber has left.
func (w *world) endSegments() {
	seg := w.segments[len(w.segments)-1]
	seg.events = append(seg.events, w.h.events()...)
}

// checkRestarts checks a restart world's segments.
func checkRestarts(t testing.TB, w *world) {
	t.Helper()
	const (
		created = runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
		started = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
		stopped = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
		deleted = runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT
	)
	union := map[string]map[runtimeapi.ContainerEventType]bool{}
	lastAt := map[string]int64{}
	var all []string
	for k, seg := range w.segments {
		for _, s := range summary(seg.events) {
			all = append(all, fmt.Sprintf("%d:%s", k, s))
		}
	}
	for k, seg := range w.segments {
		fail := func(i int, format string, args ...any) {
			t.Helper()
			t.Fatalf("process %d (of %d, %d kills), event %d (%s): %s\nits baseline: %v\nall: %v", k, len(w.segments), w.kills, i,
				summary(seg.events[i : i+1])[0], fmt.Sprintf(format, args...), seg.baseline, all)
		}
		live := map[string]map[string]bool{}
		for pod, ctrs := range seg.live {
			live[pod] = map[string]bool{}
			for c := range ctrs {
				live[pod][c] = true
			}
		}
		seen := map[string]map[runtimeapi.ContainerEventType]int{}
		reasons := map[string][]string{}
		for i, ev := range seg.events {
			r := ev.Response
			ps := r.PodSandboxStatus
			if ps == nil || ps.Metadata == nil || ps.Metadata.Uid == "" {
				fail(i, "no sandbox status or metadata")
			}
			podID := ps.Id
			if r.CreatedAt <= lastAt[podID] {
				fail(i, "created_at %d not after %d", r.CreatedAt, lastAt[podID])
			}
			lastAt[podID] = r.CreatedAt
			id, typ := r.ContainerId, r.ContainerEventType
			isSandbox := id == podID
			if !isSandbox && w.sandbox[id] != podID {
				fail(i, "container of sandbox %s carries sandbox %s", w.sandbox[id], podID)
			}
			if eventPhase(typ) <= seg.baseline[id] {
				fail(i, "emitted again: the checkpoint it started from says %s was received", seg.baseline[id])
			}
			if seen[id] == nil {
				seen[id] = map[runtimeapi.ContainerEventType]int{}
			}
			seen[id][typ]++
			if seen[id][typ] > 1 && typ != stopped {
				fail(i, "duplicate within one process")
			}
			if typ == stopped {
				reason := ""
				if !isSandbox {
					st := statusOf(ev, id)
					if st == nil || st.State != runtimeapi.ContainerState_CONTAINER_EXITED {
						fail(i, "STOPPED with status %v", st)
					}
					reason = st.Reason
				}
				prev := reasons[id]
				if len(prev) == 1 && (prev[0] == reasonOOMKilled || reason != reasonOOMKilled) || len(prev) == 2 {
					fail(i, "second STOPPED is not an OOM correction (%v then %s)", prev, reason)
				}
				reasons[id] = append(prev, reason)
			}
			if seen[id][deleted] > 0 && typ != deleted {
				fail(i, "after DELETED")
			}
			if live[podID] == nil {
				live[podID] = map[string]bool{}
			}
			if !isSandbox {
				switch typ {
				case created:
					live[podID][id] = true
				case deleted:
					delete(live[podID], id)
				}
			}
			if isSandbox && typ == deleted && len(live[podID]) > 0 {
				fail(i, "sandbox DELETED with live containers %v", live[podID])
			}
			got := map[string]bool{}
			for _, st := range r.ContainersStatuses {
				if got[st.Id] {
					fail(i, "container %s listed twice", st.Id)
				}
				got[st.Id] = true
			}
			if len(got) != len(live[podID]) {
				fail(i, "statuses of %v, live containers %v", got, live[podID])
			}
			for c := range live[podID] {
				if !got[c] {
					fail(i, "live container %s missing from the statuses %v", c, got)
				}
			}
			if union[id] == nil {
				union[id] = map[runtimeapi.ContainerEventType]bool{}
			}
			if union[id][typ] && seen[id][typ] == 1 {
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
			check(sb.Id, created, started)
		} else {
			check(sb.Id, created, stopped)
		}
	}
	for _, c := range ctrs {
		present[c.Id] = true
		switch c.State {
		case runtimeapi.ContainerState_CONTAINER_CREATED:
			check(c.Id, created)
		case runtimeapi.ContainerState_CONTAINER_RUNNING:
			check(c.Id, created, started)
		case runtimeapi.ContainerState_CONTAINER_EXITED:
			check(c.Id, created, stopped)
		}
	}
	for id, u := range union {
		if present[id] {
			if u[deleted] {
				t.Errorf("%s: DELETED while it is still in the runtime: %v", id, all)
			}
			continue
		}
		if !u[deleted] && unknownToNext(w, id) {
			// Known limit: its events were received after the last checkpoint write before a kill, and
			// it was gone before the next pleg-nri had its status: that one never knew of it.
			w.unseenEnds++
			continue
		}
		// Removed: it was seen, so its removal must be told.
		check(id, deleted)
		if u[started] {
			check(id, stopped)
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

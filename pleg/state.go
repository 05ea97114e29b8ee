package pleg

// The state machine of one object (sandbox or container), and the events each transition emits:
//
//	  observation of an unknown id without kind or sandbox (task events): held until the object
//	  appears (bounded, TTL heldTTL); for a tombstoned (deleted) id: ignored
//
//	  NO STATUS: the first CRI status answer is needed before any event of the object's pod;
//	  NotFound is retried (2ms, 4ms, ... 100ms) for 5s.  Removed first, or NotFound for 5s:
//	  dropped, no event (it never became visible to the CRI).
//	      |
//	      | status answer: emits CREATED (arrows: the observed phase, then the event emitted)
//	      v
//	  +---------+  Running   +---------+  Exited    +--------+  Removed   +---------+
//	  | CREATED |----------->| RUNNING |----------->| EXITED |----------->| REMOVED |
//	  +---------+  STARTED   +---------+  STOPPED   +--------+  DELETED   +---------+
//	               sandbox:     |         sandbox: NOTREADY  |   ^         sandbox: after the
//	      |        READY        |         container: exit    +---+         DELETED of each of
//	      |                     |         code, finished_at,  OOM learnt   its containers
//	      |                     |         reason              later, or containerd's
//	      |                     |                             verified exit differs: a
//	      |                     |                             corrected STOPPED
//	      |                     +-- Removed (vanished while running): STOPPED (exit 255,
//	      |                         reason Unknown, as containerd for an unseen exit), DELETED
//	      +-- Removed, never started: DELETED only
//
// Phases only move forward; an observation of an earlier phase is stale and ignored. Observing phase X
// emits every missing event up to X, in order: STARTED only if the process ever started, STOPPED only if
// it exited or ever started (created-then-removed gives CREATED, DELETED). A removed sandbox takes its
// remaining containers with it (their DELETED first). A deleted id is tombstoned for tombTTL: later
// observations of it are ignored.
//
// A STOPPED built from the fast inputs is verified against containerd's ContainerStatus, asked again
// with backoff until containerd's answer shows the exit. A container whose status changed without a
// phase (NRI's PostUpdateContainer: new resources) is asked again, and its pod's events wait for that
// answer, so no event carries the old status.
//
// Per pod, events leave in the order their transitions were observed (a FIFO of objects with pending
// transitions); an object that waits for its first CRI status holds back the events of its pod behind
// it, never those of other pods. created_at is strictly increasing per pod. Every event carries the
// sandbox's status and the statuses of the containers whose CREATED was emitted and DELETED was not,
// ordered by created_at then id.
//
// This file holds the objects, the pods and the transitions (apply, update, advance, recompute); emit.go
// builds and emits the events; calls.go asks for the CRI calls and applies their answers; verify.go
// verifies an exit built from the fast inputs; holds.go keeps held observations and tombstones.

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/containerd/log"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// cause is the input that moved an object into a phase, for the event's Source and SourceTime.
type cause struct {
	src Source
	at  time.Time
}

// object is one sandbox or container as the state knows it.
type object struct {
	id   string
	kind Kind
	pod  *pod

	phase   Phase    // the furthest phase observed
	emitted Phase    // the furthest phase whose events were emitted
	causes  [5]cause // per phase: the input that first reported it
	started bool     // the process ever started (Running seen, or a start time known)
	exited  bool     // an input reported the exit itself (not only the removal)
	lastSeq uint64   // state sequence of the last observation applied (relist safety)
	created int64    // ns, ordering key of containers_statuses (status created_at)
	order   int      // position in the sandbox's list, for a stable sort among equal created
	facts   facts    // container facts from the fast inputs
	queued  bool     // in pod.queue
	dropped bool     // forgotten without events
	// repaired has bit 1<<phase set for each phase whose event a relist emitted (a repair), until an
	// event input reports that phase: the input was then late, not missing (Metrics.RelistRepairLate).
	repaired uint8

	// ctrAnswer and sbAnswer are the last CRI answer (immutable); ctrSent and sbSent the status events
	// carry (the answer with phase and facts applied; the same pointer as the answer when nothing had to
	// change). Only one of each pair is used, by kind (container or sandbox).
	ctrAnswer, ctrSent *runtimeapi.ContainerStatus
	sbAnswer, sbSent   *runtimeapi.PodSandboxStatus
	complete           bool // ctrSent is complete enough for the pending event (an exit needs its exit code)

	fetching     bool      // a status call (not a verification) is outstanding
	fetchAttempt int       // attempts of the current fetch
	fetchStart   time.Time // when the current fetch started
	fetchGaveUp  bool      // the CRI never gave a status that caught up: synthesize what is missing
	verifying    bool      // a verification call is outstanding
	// verifyExit says the outstanding verification checks an exit: it is asked again (verifyAttempt,
	// with backoff, bounded) until containerd's answer shows the exit.
	verifyExit    bool
	verifyAttempt int

	// oomChecking says an OOM check of an exit with status 137 is outstanding: the STOPPED waits for it;
	// oomChecked that it was made (once per container).
	oomChecking bool
	oomChecked  bool
	cgroup      string // the container's cgroupsPath (from NRI), for the OOM check

	// stale says containerd's status changed in a way no phase tells (a resource update, NRI's
	// PostUpdateContainer): the pod's events wait until a recheck call answered (or failed).
	stale        bool
	rechecking   bool // a recheck call is outstanding
	recheckAgain bool // the status changed again while it was: ask once more after its answer

	stoppedReason  string // reason carried by the STOPPED event
	corrected      bool   // a corrected STOPPED was emitted
	needCorrection bool   // a corrected STOPPED is due
	oomCause       cause  // the input that reported the OOM
	// stoppedSt is the container status the last STOPPED carried: a later status that differs from it
	// in a field the kubelet reads from an exited container (exitDiffers) gives a corrected STOPPED.
	stoppedSt *runtimeapi.ContainerStatus
	// statusCause is the input of the last status answer (the cause of a correction it brings).
	statusCause cause

	// emitSeq is, per phase, the fan-out sequence number of the event emitted for it (0: none, or
	// restored from the checkpoint): the checkpoint records a phase only once its events were received.
	emitSeq [5]uint64
}

func (o *object) hasStatus() bool { return o.ctrAnswer != nil || o.sbAnswer != nil }

// pod is a sandbox and its containers: the unit of ordering and of pod status.
type pod struct {
	id         string
	sandbox    *object            // never nil: a placeholder (PhaseNone) until the sandbox is observed
	containers map[string]*object // every container not yet DELETED
	listed     []*object          // containers whose CREATED was emitted and DELETED not: containers_statuses
	queue      []*object          // objects with pending events, in observation order
	lastEvent  int64              // created_at of the last event, ns
	dropped    bool
	nextOrder  int
}

// state is every sandbox and container the inputs reported. It is only used under PLEG.mu.
type state struct {
	clock       Clock
	metrics     Metrics
	fetch       *fetcher
	fan         *fanout
	verifyDelay time.Duration
	backoff     backoff
	oomCheck    bool            // Config.OOM is set: an exit with status 137 is checked for an OOM kill
	oomFast     OOMCgroupReader // Config.OOM's inline cgroup read, when it has one

	seq       uint64              // incremented by every input applied
	objects   map[string]*object  // by id, sandboxes and containers
	pods      map[string]*pod     // by sandbox id
	held      map[string]*heldObs // observations of unknown ids
	heldN     int                 // total observations held
	tombs     map[string]time.Time
	tombQ     []tomb // tombstones in insertion order, for expiry
	lastSweep time.Time

	// The checkpoint's view (checkpoint_writer.go), kept only when checkpointing (ckptWake != nil).
	ckptWake chan struct{} // capacity 1: an event was emitted, the checkpoint is behind
	ckptGen  uint64        // incremented by every event emitted
	unacked  []*object     // deleted objects whose DELETED some subscriber has not received yet
	// ckptUrgent asks the writer not to wait for CheckpointInterval (set by the fan-out, any goroutine).
	ckptUrgent atomic.Bool
}

func newState(c Clock, m Metrics, f *fetcher, fan *fanout, verifyDelay time.Duration) *state {
	return &state{
		clock: c, metrics: m, fetch: f, fan: fan, verifyDelay: verifyDelay, backoff: defaultBackoff,
		objects: map[string]*object{}, pods: map[string]*pod{}, held: map[string]*heldObs{},
		tombs: map[string]time.Time{},
	}
}

// apply applies one input: an observation or a status answer.
func (s *state) apply(ctx context.Context, in input) {
	s.seq++
	switch {
	case in.res != nil:
		s.applyFetch(ctx, in.res)
	case in.refresh != nil:
		s.refreshStopped(ctx, in.refresh)
	default:
		s.applyObs(ctx, in.obs)
	}
}

func (s *state) applyObs(ctx context.Context, ob Observation) {
	o := s.objects[ob.ID]
	if o == nil {
		if o = s.create(ctx, ob); o == nil {
			return
		}
		s.update(ctx, o, ob)
		if h := s.held[ob.ID]; h != nil {
			delete(s.held, ob.ID)
			s.heldN -= len(h.obs)
			for _, hob := range h.obs {
				if !o.dropped {
					s.update(ctx, o, hob)
				}
			}
		}
	} else {
		if ob.Kind != KindUnknown && ob.Kind != o.kind {
			s.metrics.ObservationSuppressed(ob.Source, SuppressKindMismatch)
			log.G(ctx).WithField("id", ob.ID).WithField("kind", o.kind).
				Warnf("ignoring %s observation of a %s", ob.Kind, o.kind)
			return
		}
		if o.kind == KindContainer && ob.SandboxID != "" && ob.SandboxID != o.pod.id {
			s.metrics.ObservationSuppressed(ob.Source, SuppressKindMismatch)
			log.G(ctx).WithField("id", ob.ID).Warnf("ignoring observation naming sandbox %s for a container of sandbox %s", ob.SandboxID, o.pod.id)
			return
		}
		s.update(ctx, o, ob)
	}
	s.flush(ctx, o.pod)
}

// create makes the object an observation is about, or holds the observation until the object appears;
// it returns nil when the observation is held or ignored.
func (s *state) create(ctx context.Context, ob Observation) *object {
	if _, dead := s.tombs[ob.ID]; dead {
		s.metrics.ObservationSuppressed(ob.Source, SuppressDeleted)
		return nil
	}
	// An observation that says what the object is (and, for a container, its sandbox) makes it, even
	// without a phase (an NRI Synchronize of a NotReady sandbox): its status answer tells the phase.
	switch {
	case ob.Kind == KindSandbox:
	case ob.Kind == KindContainer && ob.SandboxID != "":
		if _, dead := s.tombs[ob.SandboxID]; dead {
			// A container of a deleted sandbox is deleted too: tombstone it so its later task events
			// are not held.
			s.metrics.ObservationSuppressed(ob.Source, SuppressDeleted)
			s.forget(ob.ID)
			return nil
		}
	default:
		s.hold(ctx, ob)
		return nil
	}
	if ob.Phase == PhaseRemoved {
		// First seen removed: it never had a status here, there is nothing to tell.
		s.metrics.ObjectDropped(ob.Kind, DropRemovedBeforeStatus)
		s.forget(ob.ID)
		return nil
	}
	var p *pod
	if ob.Kind == KindSandbox {
		p = s.pods[ob.ID] // a placeholder made by one of its containers has the sandbox object already
		if p == nil {
			p = s.newPod(ob.ID)
			return p.sandbox
		}
		return p.sandbox
	}
	p = s.pods[ob.SandboxID]
	if p == nil {
		p = s.newPod(ob.SandboxID)
		p.sandbox.lastSeq = s.seq
		s.ensureFetch(p.sandbox)
	}
	o := &object{id: ob.ID, kind: KindContainer, pod: p, order: p.nextOrder}
	p.nextOrder++
	if !ob.CreatedAt.IsZero() {
		o.created = ob.CreatedAt.UnixNano()
	}
	p.containers[ob.ID] = o
	s.objects[ob.ID] = o
	return o
}

func (s *state) newPod(id string) *pod {
	p := &pod{id: id, containers: map[string]*object{}}
	p.sandbox = &object{id: id, kind: KindSandbox, pod: p}
	s.pods[id] = p
	s.objects[id] = p.sandbox
	return p
}

// update applies an observation to a known object.
func (s *state) update(ctx context.Context, o *object, ob Observation) {
	o.lastSeq = s.seq
	if o.kind == KindContainer {
		if ob.CgroupsPath != "" {
			o.cgroup = ob.CgroupsPath
		}
		wasOOM := o.facts.oom
		o.facts.merge(ob)
		if o.facts.oom && !wasOOM {
			o.oomCause = cause{ob.Source, ob.SourceTime}
		}
		if !ob.StartedAt.IsZero() {
			o.started = true
		}
		if !ob.CreatedAt.IsZero() && o.created == 0 {
			o.created = ob.CreatedAt.UnixNano()
		}
	}
	derived := PhaseNone
	if ob.StatusChanged && o.kind == KindContainer && o.phase < PhaseRemoved {
		s.startRecheck(o)
	}
	if o.kind == KindContainer && ob.Phase == PhaseRemoved && o.phase < PhaseRemoved {
		// containerd builds each event's sandbox status when it sends it: once StopPodSandbox tore
		// the network down, the IPs are gone. A container removed from a stopped sandbox whose status
		// still has them: ask again before its DELETED.
		if sb := o.pod.sandbox; sb.phase >= PhaseExited && sb.phase < PhaseRemoved && hasIPs(sb.sbSent) {
			s.startRecheck(sb)
		}
	}
	if ob.ContainerStatus != nil && o.kind == KindContainer {
		o.statusCause = cause{ob.Source, ob.SourceTime}
		derived = s.setContainerBase(o, ob.ContainerStatus, ob.Source)
		if ob.ContainerStatus.Reason == reasonOOMKilled && o.oomCause.at.IsZero() {
			o.oomCause = cause{ob.Source, ob.SourceTime}
		}
	}
	if ob.SandboxStatus != nil && o.kind == KindSandbox {
		derived = s.setSandboxBase(o, ob.SandboxStatus, ob.Source)
	}
	if ob.Phase != PhaseNone {
		switch {
		case ob.Phase < o.phase:
			s.metrics.ObservationSuppressed(ob.Source, SuppressStale)
		case ob.Phase == o.phase:
			s.metrics.ObservationSuppressed(ob.Source, SuppressDuplicate)
		}
		if bit := uint8(1) << ob.Phase; o.repaired&bit != 0 && (ob.Source == SourceNRI || ob.Source == SourceTaskEvent) {
			o.repaired &^= bit
			s.metrics.RelistRepairLate(o.kind, phaseEvent(ob.Phase))
		}
	}
	target := max(ob.Phase, derived)
	if ob.Phase == PhaseExited {
		o.exited = true
	}
	if target > o.phase {
		s.advance(ctx, o, target, cause{ob.Source, ob.SourceTime})
	}
	s.recompute(ctx, o)
}

// setContainerBase caches a container status answer unless it is behind the cached one; it returns the
// phase the answer implies.
func (s *state) setContainerBase(o *object, st *runtimeapi.ContainerStatus, src Source) Phase {
	if o.ctrAnswer != nil && containerStateRank(st.State) < containerStateRank(o.ctrAnswer.State) {
		s.metrics.ObservationSuppressed(src, SuppressStaleStatus)
		return PhaseNone
	}
	o.ctrAnswer = st
	if o.created == 0 || st.CreatedAt != 0 {
		o.created = st.CreatedAt
	}
	if st.StartedAt != 0 {
		o.started = true
	}
	ph := containerStatePhase(st.State)
	if ph == PhaseExited {
		o.exited = true
	}
	return ph
}

// setSandboxBase caches a sandbox status answer unless it is behind the cached one; it returns the phase
// the answer implies.
func (s *state) setSandboxBase(o *object, st *runtimeapi.PodSandboxStatus, src Source) Phase {
	if o.sbAnswer != nil && st.State == runtimeapi.PodSandboxState_SANDBOX_READY && o.sbAnswer.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		s.metrics.ObservationSuppressed(src, SuppressStaleStatus)
		return PhaseNone
	}
	o.sbAnswer = st
	// A sandbox the CRI has a status for has run its pause process (containerd rolls a failed
	// RunPodSandbox back), even when this answer lands after its removal was observed: its end then
	// gives STOPPED before DELETED, as for any sandbox that started.
	o.started = true
	return sandboxStatePhase(st.State)
}

// advance moves an object forward to target; a removed sandbox takes its containers with it.
func (s *state) advance(ctx context.Context, o *object, target Phase, c cause) {
	for ph := o.phase + 1; ph <= target; ph++ {
		o.causes[ph] = c
	}
	o.phase = target
	if target == PhaseRunning || (o.kind == KindSandbox && target >= PhaseRunning && target < PhaseRemoved) {
		o.started = true
	}
	if o.kind == KindSandbox && target == PhaseRemoved {
		for _, ct := range s.sortedContainers(o.pod) {
			if ct.phase < PhaseRemoved {
				s.advance(ctx, ct, PhaseRemoved, c)
				s.recompute(ctx, ct)
			}
		}
	}
}

// recompute recomputes what events carry for o after a change, starts the status calls it needs and
// queues its pending events.
func (s *state) recompute(ctx context.Context, o *object) {
	if o.dropped {
		return
	}
	switch o.kind {
	case KindSandbox:
		o.sbSent = sandboxEffective(o.sbAnswer, o.phase)
		o.complete = o.sbSent != nil
	case KindContainer:
		wantExit := o.phase == PhaseExited || (o.phase == PhaseRemoved && (o.started || o.exited))
		synth := o.fetchGaveUp || (o.phase == PhaseRemoved && !o.fetching)
		at := o.causes[max(o.phase, PhaseCreated)].at
		if at.IsZero() {
			at = s.clock()
		}
		o.ctrSent, o.complete = containerEffective(o.ctrAnswer, o.phase, wantExit, o.facts, synth, at.UnixNano())
		if o.complete && s.needOOMCheck(o) && s.startOOMCheck(o) {
			o.ctrSent, o.complete = containerEffective(o.ctrAnswer, o.phase, wantExit, o.facts, synth, at.UnixNano())
		}
		if o.oomChecking && !o.facts.oom {
			o.complete = false // the STOPPED waits for the OOM check (bounded by its timeout)
		}
		if o.emitted >= PhaseExited && o.emitted < PhaseRemoved && o.complete && exitDiffers(o.stoppedSt, o.ctrSent) {
			o.needCorrection = true
		}
	}
	s.ensureFetch(o)
	if (o.emitted < o.phase || o.needCorrection) && !o.queued {
		o.queued = true
		o.pod.queue = append(o.pod.queue, o)
	}
}

// drop forgets an object that never had a status, without any event; a dropped sandbox takes its pod.
func (s *state) drop(ctx context.Context, o *object, reason string) {
	s.metrics.ObjectDropped(o.kind, reason)
	if log.GetLevel() >= log.DebugLevel {
		log.G(ctx).WithField(o.kind.String(), o.id).WithField("reason", reason).Debug("dropped without events")
	}
	o.dropped = true
	delete(s.objects, o.id)
	if o.phase == PhaseRemoved {
		s.tombstone(o.id)
	}
	p := o.pod
	if o.kind == KindContainer {
		delete(p.containers, o.id)
		if i := slices.Index(p.listed, o); i >= 0 {
			p.listed = slices.Delete(p.listed, i, i+1)
		}
		return
	}
	for _, c := range p.containers {
		if !c.dropped {
			s.drop(ctx, c, DropSandboxGone)
		}
	}
	p.dropped = true
	delete(s.pods, p.id)
}

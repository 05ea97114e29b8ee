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

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/log"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	heldTTL       = time.Minute     // how long an observation of an unknown id waits for its object
	maxHeldIDs    = 4096            // bound on the unknown ids held
	maxHeldPerID  = 16              // bound on the observations held per unknown id
	tombTTL       = 5 * time.Minute // how long a deleted id is remembered
	maxTombstones = 65536           // bound on the deleted ids remembered
	sweepPeriod   = time.Second     // how often holds and tombstones are expired
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

	// The last CRI answer (immutable) and the status events carry (base with phase and facts applied;
	// the same pointer as base when nothing had to change). Only one of each pair is used, by kind.
	cbase, ceff *runtimeapi.ContainerStatus
	sbase, seff *runtimeapi.PodSandboxStatus
	complete    bool // ceff is complete enough for the pending event (an exit needs its exit code)

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
	// PostUpdateContainer): the pod's events wait until a refresh call answered (or failed).
	stale        bool
	refreshing   bool // a refresh call is outstanding
	refreshAgain bool // the status changed again while it was: ask once more after its answer

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

func (o *object) hasStatus() bool { return o.cbase != nil || o.sbase != nil }

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

type heldObs struct {
	since time.Time
	obs   []Observation
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

type tomb struct {
	id string
	at time.Time
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
	if in.res != nil {
		s.applyFetch(ctx, in.res)
	} else {
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

// hold keeps an observation of an unknown id until the object appears (bounded, with a TTL).
func (s *state) hold(ctx context.Context, ob Observation) {
	h := s.held[ob.ID]
	if s.heldN >= maxHeldIDs*maxHeldPerID || (h == nil && len(s.held) >= maxHeldIDs) || (h != nil && len(h.obs) >= maxHeldPerID) {
		s.metrics.ObservationSuppressed(ob.Source, SuppressHeldOverflow)
		log.G(ctx).WithField("id", ob.ID).Warnf("dropping %s observation of an unknown id: hold buffer full", ob.Source)
		return
	}
	if h == nil {
		h = &heldObs{since: s.clock.Now()}
		s.held[ob.ID] = h
	}
	h.obs = append(h.obs, ob)
	s.heldN++
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
		s.startRefresh(o)
	}
	if o.kind == KindContainer && ob.Phase == PhaseRemoved && o.phase < PhaseRemoved {
		// containerd builds each event's sandbox status when it sends it: once StopPodSandbox tore
		// the network down, the IPs are gone. A container removed from a stopped sandbox whose status
		// still has them: ask again before its DELETED.
		if sb := o.pod.sandbox; sb.phase >= PhaseExited && sb.phase < PhaseRemoved && hasIPs(sb.seff) {
			s.startRefresh(sb)
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
	}
	target := max(ob.Phase, derived)
	if ob.Phase == PhaseExited {
		o.exited = true
	}
	if target > o.phase {
		s.advance(ctx, o, target, cause{ob.Source, ob.SourceTime})
	}
	s.refresh(ctx, o)
}

// setContainerBase caches a container status answer unless it is behind the cached one; it returns the
// phase the answer implies.
func (s *state) setContainerBase(o *object, st *runtimeapi.ContainerStatus, src Source) Phase {
	if o.cbase != nil && containerStateRank(st.State) < containerStateRank(o.cbase.State) {
		s.metrics.ObservationSuppressed(src, SuppressStaleStatus)
		return PhaseNone
	}
	o.cbase = st
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
	if o.sbase != nil && st.State == runtimeapi.PodSandboxState_SANDBOX_READY && o.sbase.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		s.metrics.ObservationSuppressed(src, SuppressStaleStatus)
		return PhaseNone
	}
	o.sbase = st
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
				s.refresh(ctx, ct)
			}
		}
	}
}

// refresh recomputes what events carry for o after a change, starts the status calls it needs and
// queues its pending events.
func (s *state) refresh(ctx context.Context, o *object) {
	if o.dropped {
		return
	}
	switch o.kind {
	case KindSandbox:
		o.seff = sandboxEffective(o.sbase, o.phase)
		o.complete = o.seff != nil
	case KindContainer:
		wantExit := o.phase == PhaseExited || (o.phase == PhaseRemoved && (o.started || o.exited))
		synth := o.fetchGaveUp || (o.phase == PhaseRemoved && !o.fetching)
		at := o.causes[max(o.phase, PhaseCreated)].at
		if at.IsZero() {
			at = s.clock.Now()
		}
		o.ceff, o.complete = containerEffective(o.cbase, o.phase, wantExit, o.facts, synth, at.UnixNano())
		if o.complete && s.needOOMCheck(o) && s.startOOMCheck(o) {
			o.ceff, o.complete = containerEffective(o.cbase, o.phase, wantExit, o.facts, synth, at.UnixNano())
		}
		if o.oomChecking && !o.facts.oom {
			o.complete = false // the STOPPED waits for the OOM check (bounded by its timeout)
		}
		if o.emitted >= PhaseExited && o.emitted < PhaseRemoved && o.complete && exitDiffers(o.stoppedSt, o.ceff) {
			o.needCorrection = true
		}
	}
	s.ensureFetch(o)
	if (o.emitted < o.phase || o.needCorrection) && !o.queued {
		o.queued = true
		o.pod.queue = append(o.pod.queue, o)
	}
}

// ensureFetch starts the status call an object needs before its next event, if any.
func (s *state) ensureFetch(o *object) {
	if o.fetching || o.dropped || o.phase == PhaseRemoved {
		return
	}
	need := !o.hasStatus() || (o.kind == KindContainer && o.phase >= PhaseRunning && !o.complete && !o.fetchGaveUp)
	if !need {
		return
	}
	now := s.clock.Now()
	o.fetching = true
	o.fetchAttempt = 1
	o.fetchStart = now
	s.fetch.push(fetchReq{id: o.id, kind: o.kind, due: now})
}

// needOOMCheck says whether the STOPPED of o must wait for an OOM check: like containerd's
// handleContainerExit, an exit with status 137 whose OOM kill no input reported yet, before containerd's
// status shows the exit (its answer then has containerd's own verdict).
func (s *state) needOOMCheck(o *object) bool {
	return s.oomCheck && !o.oomChecked && !o.oomChecking && o.emitted < PhaseExited && o.phase >= PhaseExited &&
		o.facts.hasExit && o.facts.exitCode == oomExitCode && !o.facts.oom &&
		o.ceff.GetReason() != reasonOOMKilled && o.cbase.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED
}

// startOOMCheck asks whether o's cgroup recorded an OOM kill: inline when the checker can read the
// cgroup itself (it then returns whether it learnt an OOM kill), else by a queued call whose answer the
// STOPPED waits for.
func (s *state) startOOMCheck(o *object) bool {
	if s.oomFast != nil && o.cgroup != "" {
		start := time.Now()
		killed, ok := s.oomFast.CgroupOOMKilled(o.cgroup)
		if m, mok := s.metrics.(OOMCheckMetrics); mok && ok {
			m.OOMCheckCall(StatusResultOK, time.Since(start))
		}
		if ok {
			o.oomChecked = true
			if killed {
				o.facts.oom = true
				o.oomCause = cause{SourceStatus, s.clock.Now()}
			}
			return killed
		}
	}
	o.oomChecking = true
	s.fetch.push(fetchReq{id: o.id, kind: o.kind, oom: true, cgroup: o.cgroup, due: s.clock.Now()})
	return false
}

// startRefresh asks containerd again for a container's status after a change no phase tells; the pod's
// events wait for the answer (ready).
func (s *state) startRefresh(o *object) {
	o.stale = true
	if o.refreshing {
		o.refreshAgain = true
		return
	}
	o.refreshing = true
	s.fetch.push(fetchReq{id: o.id, kind: o.kind, refresh: true, due: s.clock.Now()})
}

// retryFetch schedules the next attempt of an object's status call.
func (s *state) retryFetch(o *object, limit time.Duration) {
	o.fetching = true
	o.fetchAttempt++
	s.fetch.push(fetchReq{id: o.id, kind: o.kind, due: s.clock.Now().Add(s.backoff.delay(o.fetchAttempt-1, limit))})
}

// applyFetch applies the answer (or failure) of a call the fetcher made for an object still known: an
// OOM check, a refresh, a verification or a status call.
func (s *state) applyFetch(ctx context.Context, r *fetchResult) {
	o := s.objects[r.req.id]
	if o == nil || o.dropped || o.kind != r.req.kind {
		return
	}
	switch {
	case r.req.oom:
		s.applyOOMCheck(ctx, o, r)
	case r.req.refresh:
		s.applyRefresh(ctx, o, r)
	case r.req.verify:
		s.applyVerify(ctx, o, r)
	default:
		s.applyStatus(ctx, o, r)
	}
}

// applyOOMCheck applies the answer of an OOM check: the STOPPED that waited for it can go out.
func (s *state) applyOOMCheck(ctx context.Context, o *object, r *fetchResult) {
	o.oomChecking = false
	o.oomChecked = true
	switch {
	case r.err == nil && r.oomKilled:
		if !o.facts.oom {
			o.facts.oom = true
			o.oomCause = cause{SourceStatus, r.at}
		}
	case r.err == nil:
	case isNotFound(r.err):
		// containerd's exit handler deleted the task: it made its own check first, and its status
		// has the verdict.
		s.startRefresh(o)
	default:
		// The STOPPED goes out without it; the exit verification corrects it if needed.
		log.G(ctx).WithField(o.kind.String(), o.id).WithError(r.err).Warn("OOM check failed")
	}
	s.refresh(ctx, o)
	s.flush(ctx, o.pod)
}

// applyRefresh applies the answer of a refresh call (startRefresh): the pod's events that waited for
// it can go out, unless the status changed again meanwhile.
func (s *state) applyRefresh(ctx context.Context, o *object, r *fetchResult) {
	o.refreshing = false
	if o.refreshAgain {
		o.refreshAgain = false
		s.startRefresh(o)
	} else {
		o.stale = false
	}
	if r.err != nil {
		// Nothing better to tell: the pod's events go on with the status known.
		log.G(ctx).WithField(o.kind.String(), o.id).WithError(r.err).Debug("refresh status call failed")
	} else {
		s.update(ctx, o, statusObs(o, r))
	}
	s.flush(ctx, o.pod)
}

// applyVerify applies the answer of a verification call (verify): the status known is replaced by
// containerd's, and an exit containerd does not show yet is asked again (reverify).
func (s *state) applyVerify(ctx context.Context, o *object, r *fetchResult) {
	o.verifying = false
	logger := log.G(ctx).WithField(o.kind.String(), o.id)
	if r.err != nil {
		if !isNotFound(r.err) {
			logger.WithError(r.err).Debug("verification status call failed")
			if o.verifyExit {
				s.reverify(ctx, o)
			}
		}
		return
	}
	oldC, oldS := o.ceff, o.seff
	s.update(ctx, o, statusObs(o, r))
	if (o.kind == KindContainer && !proto.Equal(oldC, o.ceff)) || (o.kind == KindSandbox && !proto.Equal(oldS, o.seff)) {
		s.metrics.StatusMismatch(o.kind)
		if log.GetLevel() >= log.DebugLevel {
			logger.Debug("verified status differs from the one emitted: cache updated")
		}
	}
	if o.verifyExit && o.kind == KindContainer && o.cbase.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
		s.reverify(ctx, o) // containerd has not finished its exit handling yet: ask again
	}
	s.flush(ctx, o.pod)
}

// applyStatus applies the answer (or failure) of o's status call (ensureFetch, retryFetch), and decides
// whether to call again: until the status caught up with what the inputs reported, within the backoff's
// window; a NotFound past it, or an error about a removed object, drops an object that never had a
// status and synthesizes what is missing of one that had.
//
// The call is outstanding (o.fetching) until its answer has been applied: while update applies a status,
// its refresh must not start a second call (every incomplete answer would add a chain of retries and
// restart the window), nor build a removed container's end without this answer. o.fetching is cleared
// once the answer is in, before what follows decides whether to call again.
func (s *state) applyStatus(ctx context.Context, o *object, r *fetchResult) {
	windowOver := s.clock.Now().Sub(o.fetchStart) >= s.backoff.window || o.fetchAttempt >= s.backoff.maxAttempts
	if r.err != nil {
		o.fetching = false
		s.statusFailed(ctx, o, r, windowOver)
		s.flush(ctx, o.pod)
		return
	}
	// NOTE: o.fetching is set already, unless the call was made for an earlier object of this id that
	// was dropped while the call was out: its answer is applied as this object's own call's.
	o.fetching = true
	s.update(ctx, o, statusObs(o, r))
	o.fetching = false
	if o.kind == KindContainer && o.phase >= PhaseRunning && o.phase < PhaseRemoved && !o.complete {
		// The CRI has not caught up with the start or the exit an input reported (containerd's
		// start time, an exit code).
		if windowOver {
			s.giveUpFetch(ctx, o)
		} else {
			s.retryFetch(o, s.backoff.max)
		}
	} else {
		s.refresh(ctx, o) // now that no call is outstanding (a removed object's end can be built)
	}
	s.flush(ctx, o.pod)
}

// statusFailed handles a failed status call of o: NotFound is retried within the window, another error
// until the object is removed; then an object that never had a status is dropped, and one that had
// gets what is missing synthesized.
func (s *state) statusFailed(ctx context.Context, o *object, r *fetchResult, windowOver bool) {
	logger := log.G(ctx).WithField(o.kind.String(), o.id)
	switch {
	case isNotFound(r.err):
		if o.phase == PhaseRemoved || windowOver {
			if !o.hasStatus() {
				reason := DropStatusNotFound
				if o.phase == PhaseRemoved {
					reason = DropRemovedBeforeStatus
				} else {
					logger.WithError(r.err).Warn("object never became visible to the CRI: forgotten")
				}
				s.drop(ctx, o, reason)
			} else {
				s.giveUpFetch(ctx, o)
			}
		} else {
			s.retryFetch(o, s.backoff.max)
		}
	default:
		logger.WithError(r.err).Warn("status call failed, retrying")
		if o.phase == PhaseRemoved {
			if !o.hasStatus() {
				s.drop(ctx, o, DropRemovedBeforeStatus)
			} else {
				s.giveUpFetch(ctx, o)
			}
		} else {
			s.retryFetch(o, s.backoff.errMax)
		}
	}
}

// giveUpFetch stops asking for o's status: what the CRI never told is synthesized (an exit code 255,
// reason Unknown; a start time).
func (s *state) giveUpFetch(ctx context.Context, o *object) {
	o.fetchGaveUp = true
	s.refresh(ctx, o)
}

func statusObs(o *object, r *fetchResult) Observation {
	return Observation{Source: SourceStatus, Kind: o.kind, ID: o.id, SandboxStatus: r.sandbox, ContainerStatus: r.container, SourceTime: r.at}
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

// flush emits the pending events of a pod, in order, until one needs a status not yet known.
func (s *state) flush(ctx context.Context, p *pod) {
	for len(p.queue) > 0 && !p.dropped {
		o := p.queue[0]
		if !o.dropped && (o.emitted < o.phase || o.needCorrection) {
			if !s.ready(o) {
				break
			}
			s.emitPending(ctx, o)
		}
		o.queued = false
		p.queue[0] = nil
		p.queue = p.queue[1:]
	}
	if len(p.queue) == 0 {
		p.queue = nil
	}
	if !p.dropped && p.sandbox.emitted == PhaseRemoved {
		delete(s.pods, p.id)
		delete(s.objects, p.id)
		s.tombstone(p.id)
	}
}

// ready says whether o's pending events can be built now.
func (s *state) ready(o *object) bool {
	sb := o.pod.sandbox
	if sb.seff == nil {
		return false // every event carries the sandbox status
	}
	if sb.stale {
		return false
	}
	for _, c := range o.pod.containers {
		if c.stale {
			return false // every event carries the containers' statuses: wait for containerd's new one
		}
	}
	if o.kind == KindContainer {
		return o.complete
	}
	if o.phase == PhaseRemoved {
		for _, c := range o.pod.containers {
			if c.emitted < PhaseRemoved && ((c.cbase == nil && c.fetching) || (c.cbase != nil && !c.complete)) {
				return false
			}
		}
	}
	return true
}

// emitPending emits every pending event of o (and what must precede them: the sandbox's CREATED and
// STARTED before any container event, every container's DELETED before the sandbox's).
func (s *state) emitPending(ctx context.Context, o *object) {
	sb := o.pod.sandbox
	if want := min(sb.phase, PhaseRunning); sb.emitted < want {
		s.emitUpTo(ctx, sb, want)
	}
	if o.kind == KindContainer {
		s.emitContainer(ctx, o, o.phase)
		return
	}
	if o.phase == PhaseRemoved {
		for _, c := range s.sortedContainers(o.pod) {
			if c.dropped || c.emitted == PhaseRemoved {
				continue
			}
			if c.cbase == nil {
				s.drop(ctx, c, DropRemovedBeforeStatus)
				continue
			}
			s.emitContainer(ctx, c, PhaseRemoved)
		}
	}
	s.emitUpTo(ctx, o, o.phase)
}

// emitContainer emits a due corrected STOPPED of a container, then its events up to target.
func (s *state) emitContainer(ctx context.Context, o *object, target Phase) {
	if o.needCorrection {
		o.needCorrection = false
		if o.emitted >= PhaseExited && o.emitted < PhaseRemoved && exitDiffers(o.stoppedSt, o.ceff) {
			c := o.statusCause
			if o.ceff.GetReason() == reasonOOMKilled && o.stoppedSt.GetReason() != reasonOOMKilled {
				if c = o.oomCause; c.at.IsZero() {
					c = o.causes[PhaseExited]
				}
			}
			o.corrected = true
			o.stoppedReason = o.ceff.GetReason()
			o.stoppedSt = o.ceff
			s.metrics.EventCorrected(o.kind, c.src)
			s.emit(ctx, o, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, c)
		}
	}
	s.emitUpTo(ctx, o, target)
}

// emitUpTo emits o's events from its last emitted phase up to target.
func (s *state) emitUpTo(ctx context.Context, o *object, target Phase) {
	p := o.pod
	for o.emitted < target {
		ph := o.emitted + 1
		o.emitted = ph
		c := o.causes[ph]
		switch ph {
		case PhaseCreated:
			if o.kind == KindContainer {
				s.list(p, o)
			}
			s.emit(ctx, o, runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT, c)
		case PhaseRunning:
			if !o.started {
				continue
			}
			s.emit(ctx, o, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT, c)
			if o.kind == KindContainer && target == PhaseRunning && o.cbase.State == runtimeapi.ContainerState_CONTAINER_CREATED &&
				!o.facts.startExact {
				// The start time is not containerd's own (none was known): the verification brings it.
				// NRI's start time is containerd's, and nothing else in the status changes at a start,
				// so that STARTED needs no second status call.
				s.verify(o, false)
			}
		case PhaseExited:
			if !o.exited && !o.started {
				continue
			}
			if o.kind == KindContainer {
				o.stoppedReason = o.ceff.GetReason()
				o.stoppedSt = o.ceff
				o.needCorrection = false
			}
			s.emit(ctx, o, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, c)
			if o.kind == KindContainer && o.cbase.State != runtimeapi.ContainerState_CONTAINER_EXITED && target == PhaseExited {
				s.verify(o, true) // the exit came from fast inputs: check it (and a late OOM) against the CRI
			}
		case PhaseRemoved:
			if o.kind == KindContainer {
				if i := slices.Index(p.listed, o); i >= 0 {
					p.listed = slices.Delete(p.listed, i, i+1)
				}
				delete(p.containers, o.id)
				delete(s.objects, o.id)
				s.tombstone(o.id)
			}
			s.emit(ctx, o, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT, c)
		}
	}
}

// Bounds of the exit verification: containerd's exit handling (task.Delete) can take seconds under IO
// pressure, and a containerd that was down answers only once it is back.
const (
	maxVerifyDelay    = 30 * time.Second // cap of the doubling delay between two verification calls
	maxVerifyAttempts = 12               // about 3 minutes with the default first delay
)

// verify schedules the delayed verification status call of o. exit says it checks an exit: it is then
// asked again until containerd's answer shows the exit (reverify).
func (s *state) verify(o *object, exit bool) {
	if o.verifying || s.verifyDelay < 0 {
		return
	}
	o.verifying = true
	o.verifyExit = exit
	o.verifyAttempt = 1
	s.fetch.push(fetchReq{id: o.id, kind: o.kind, verify: true, due: s.clock.Now().Add(s.verifyDelay)})
}

// reverify schedules the next exit verification call of o, with a doubling delay, unless the attempts
// are used up or the container is gone.
func (s *state) reverify(ctx context.Context, o *object) {
	if o.verifying || o.dropped || o.phase == PhaseRemoved || o.emitted == PhaseRemoved {
		return
	}
	if o.verifyAttempt >= maxVerifyAttempts {
		log.G(ctx).WithField("container", o.id).WithField("attempts", o.verifyAttempt).
			Warn("containerd's status never showed the exit that was reported: the STOPPED is not verified")
		return
	}
	d := s.verifyDelay
	for range o.verifyAttempt {
		d = min(2*d, maxVerifyDelay)
	}
	o.verifyAttempt++
	o.verifying = true
	s.fetch.push(fetchReq{id: o.id, kind: o.kind, verify: true, due: s.clock.Now().Add(d)})
}

// exitDiffers reports whether the status of an exited container differs from the one its last STOPPED
// carried (sent) in a field the kubelet reads from an exited container: exit code, reason, message,
// finished_at (and started_at). A nil sent (none emitted, or restored without it) never differs.
func exitDiffers(sent, now *runtimeapi.ContainerStatus) bool {
	if sent == nil || now == nil || now.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		return false
	}
	return sent.ExitCode != now.ExitCode || sent.Reason != now.Reason || sent.Message != now.Message ||
		sent.FinishedAt != now.FinishedAt || sent.StartedAt != now.StartedAt
}

// list inserts a container into its pod's containers_statuses, ordered by created_at then id.
func (s *state) list(p *pod, o *object) {
	i, _ := slices.BinarySearchFunc(p.listed, o, compareContainers)
	p.listed = slices.Insert(p.listed, i, o)
}

func compareContainers(a, b *object) int { return containerOrder(a.created, b.created, a.id, b.id) }

// containerOrder is the order of a pod's containers in containers_statuses and in the checkpoint: by
// creation time, then by id.
func containerOrder(aCreated, bCreated int64, aID, bID string) int {
	if c := cmp.Compare(aCreated, bCreated); c != 0 {
		return c
	}
	return strings.Compare(aID, bID)
}

// sortedContainers returns a pod's containers in containers_statuses order.
func (s *state) sortedContainers(p *pod) []*object {
	out := make([]*object, 0, len(p.containers))
	for _, c := range p.containers {
		out = append(out, c)
	}
	slices.SortFunc(out, compareContainers)
	return out
}

// emit builds one event and hands it to the fan-out.
func (s *state) emit(ctx context.Context, o *object, t runtimeapi.ContainerEventType, c cause) {
	p := o.pod
	now := s.clock.Now()
	ts := now.UnixNano()
	if ts <= p.lastEvent {
		ts = p.lastEvent + 1
	}
	p.lastEvent = ts
	statuses := make([]*runtimeapi.ContainerStatus, len(p.listed))
	for i, ct := range p.listed {
		statuses[i] = ct.ceff
	}
	ev := Event{
		Response: &runtimeapi.ContainerEventResponse{
			ContainerId:        o.id,
			ContainerEventType: t,
			CreatedAt:          ts,
			PodSandboxStatus:   p.sandbox.seff,
			ContainersStatuses: statuses,
		},
		Source:     c.src,
		SourceTime: c.at,
		wire:       &wireCache{},
	}
	if o.kind == KindSandbox && t == runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT && s.fan.replay.open.Load() {
		ev.notReplayed = s.hasNewerLiveSandbox(p)
	}
	var latency time.Duration
	if !c.at.IsZero() {
		latency = now.Sub(c.at)
	}
	s.metrics.EventEmitted(t, o.kind, c.src, latency)
	if c.src == SourceRelist {
		s.metrics.RelistRepair(o.kind, t)
	}
	if log.GetLevel() >= log.DebugLevel {
		log.G(ctx).WithField(o.kind.String(), o.id).WithField("source", c.src).Debugf("emit %s", t)
	}
	s.fan.publish(ctx, ev)
	if s.ckptWake != nil {
		s.checkpointEmitted(o, t)
	}
}

// hasNewerLiveSandbox reports whether p's pod (uid) has another sandbox, created after p's, that is not
// removed. It scans every pod: only the startup replay asks.
func (s *state) hasNewerLiveSandbox(p *pod) bool {
	uid := p.sandbox.sbase.GetMetadata().GetUid()
	if uid == "" {
		return false
	}
	for _, q := range s.pods {
		if q != p && q.sandbox.phase < PhaseRemoved && q.sandbox.sbase.GetMetadata().GetUid() == uid &&
			q.sandbox.sbase.GetCreatedAt() >= p.sandbox.sbase.GetCreatedAt() {
			return true
		}
	}
	return false
}

// forget tombstones an id the state never tracked and discards what was held for it.
func (s *state) forget(id string) {
	s.tombstone(id)
	if h := s.held[id]; h != nil {
		delete(s.held, id)
		s.heldN -= len(h.obs)
		for _, ob := range h.obs {
			s.metrics.ObservationSuppressed(ob.Source, SuppressDeleted)
		}
	}
}

// tombstone remembers a deleted id so late observations of it are ignored.
func (s *state) tombstone(id string) {
	if _, ok := s.tombs[id]; ok {
		return
	}
	now := s.clock.Now()
	s.tombs[id] = now
	s.tombQ = append(s.tombQ, tomb{id, now})
	for len(s.tombQ) > maxTombstones {
		s.untomb()
	}
}

func (s *state) untomb() {
	t := s.tombQ[0]
	s.tombQ[0] = tomb{}
	s.tombQ = s.tombQ[1:]
	if at, ok := s.tombs[t.id]; ok && at.Equal(t.at) {
		delete(s.tombs, t.id)
	}
}

// sweep expires held observations and tombstones, at most once per sweepPeriod.
func (s *state) sweep(ctx context.Context) {
	now := s.clock.Now()
	if now.Sub(s.lastSweep) < sweepPeriod {
		return
	}
	s.lastSweep = now
	for id, h := range s.held {
		if now.Sub(h.since) < heldTTL {
			continue
		}
		delete(s.held, id)
		s.heldN -= len(h.obs)
		for _, ob := range h.obs {
			s.metrics.ObservationSuppressed(ob.Source, SuppressHeldExpired)
		}
		if log.GetLevel() >= log.DebugLevel {
			log.G(ctx).WithField("id", id).Debugf("dropped %d observations of an id that never appeared", len(h.obs))
		}
	}
	for len(s.tombQ) > 0 && now.Sub(s.tombQ[0].at) >= tombTTL {
		s.untomb()
	}
	s.fan.expireReplay(ctx)
}

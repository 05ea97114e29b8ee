package pleg

// The CRI calls the state machine asks the fetcher for (a first status and its retries, a recheck, an
// OOM check; the verification is in verify.go), and how it applies their answers.

import (
	"context"
	"time"

	"github.com/containerd/log"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ensureFetch starts the status call an object needs before its next event, if any.
func (s *state) ensureFetch(o *object) {
	if o.fetching || o.dropped || o.phase == PhaseRemoved {
		return
	}
	need := !o.hasStatus() || (o.kind == KindContainer && o.phase >= PhaseRunning && !o.complete && !o.fetchGaveUp)
	if !need {
		return
	}
	now := s.clock()
	o.fetching = true
	o.fetchAttempt = 1
	o.fetchStart = now
	s.fetch.push(fetchReq{id: o.id, kind: o.kind, due: now})
}

// retryFetch schedules the next attempt of an object's status call.
func (s *state) retryFetch(o *object, limit time.Duration) {
	o.fetching = true
	o.fetchAttempt++
	s.fetch.push(fetchReq{id: o.id, kind: o.kind, due: s.clock().Add(s.backoff.delay(o.fetchAttempt-1, limit))})
}

// giveUpFetch stops asking for o's status: what the CRI never told is synthesized (an exit code 255,
// reason Unknown; a start time).
func (s *state) giveUpFetch(ctx context.Context, o *object) {
	o.fetchGaveUp = true
	s.recompute(ctx, o)
}

// startRecheck asks containerd again for a container's status after a change no phase tells; the pod's
// events wait for the answer (ready).
func (s *state) startRecheck(o *object) {
	o.stale = true
	if o.rechecking {
		o.recheckAgain = true
		return
	}
	o.rechecking = true
	s.fetch.push(fetchReq{id: o.id, kind: o.kind, recheck: true, due: s.clock()})
}

// needOOMCheck says whether the STOPPED of o must wait for an OOM check: like containerd's
// handleContainerExit, an exit with status 137 whose OOM kill no input reported yet, before containerd's
// status shows the exit (its answer then has containerd's own verdict).
func (s *state) needOOMCheck(o *object) bool {
	return s.oomCheck && !o.oomChecked && !o.oomChecking && o.emitted < PhaseExited && o.phase >= PhaseExited &&
		o.facts.hasExit && o.facts.exitCode == oomExitCode && !o.facts.oom &&
		o.ctrSent.GetReason() != reasonOOMKilled && o.ctrAnswer.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED
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
				o.oomCause = cause{SourceStatus, s.clock()}
			}
			return killed
		}
	}
	o.oomChecking = true
	s.fetch.push(fetchReq{id: o.id, kind: o.kind, oom: true, cgroup: o.cgroup, due: s.clock()})
	return false
}

// applyFetch applies the answer (or failure) of a call the fetcher made for an object still known: an
// OOM check, a recheck, a verification or a status call.
func (s *state) applyFetch(ctx context.Context, r *fetchResult) {
	o := s.objects[r.req.id]
	if o == nil || o.dropped || o.kind != r.req.kind {
		return
	}
	switch {
	case r.req.oom:
		s.applyOOMCheck(ctx, o, r)
	case r.req.recheck:
		s.applyRecheck(ctx, o, r)
	case r.req.verify:
		s.applyVerify(ctx, o, r)
	default:
		s.applyStatus(ctx, o, r)
	}
}

// applyStatus applies the answer (or failure) of o's status call (ensureFetch, retryFetch), and decides
// whether to call again: until the status caught up with what the inputs reported, within the backoff's
// window; a NotFound past it, or an error about a removed object, drops an object that never had a
// status and synthesizes what is missing of one that had.
//
// The call is outstanding (o.fetching) until its answer has been applied: while update applies a status,
// its recheck must not start a second call (every incomplete answer would add a chain of retries and
// restart the window), nor build a removed container's end without this answer. o.fetching is cleared
// once the answer is in, before what follows decides whether to call again.
func (s *state) applyStatus(ctx context.Context, o *object, r *fetchResult) {
	windowOver := s.clock().Sub(o.fetchStart) >= s.backoff.window || o.fetchAttempt >= s.backoff.maxAttempts
	if r.err != nil {
		o.fetching = false
		s.statusFailed(ctx, o, r, windowOver)
		s.flush(ctx, o.pod)
		return
	}
	if !o.fetching {
		// NOTE: the call was made for an earlier object of this id, dropped while the call was out, and
		// this object's own call has been answered already: the answer is one more observation of it,
		// and decides nothing about calling again.
		s.update(ctx, o, statusObs(o, r))
		s.flush(ctx, o.pod)
		return
	}
	s.update(ctx, o, statusObs(o, r))
	o.fetching = false // the call is over
	if o.kind == KindContainer && o.phase >= PhaseRunning && o.phase < PhaseRemoved && !o.complete {
		// The CRI has not caught up with the start or the exit an input reported (containerd's
		// start time, an exit code).
		if windowOver {
			s.giveUpFetch(ctx, o)
		} else {
			s.retryFetch(o, s.backoff.max)
		}
	} else {
		s.recompute(ctx, o) // now that no call is outstanding (a removed object's end can be built)
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

// applyRecheck applies the answer of a recheck call (startRecheck): the pod's events that waited for
// it can go out, unless the status changed again meanwhile.
func (s *state) applyRecheck(ctx context.Context, o *object, r *fetchResult) {
	o.rechecking = false
	if o.recheckAgain {
		o.recheckAgain = false
		s.startRecheck(o)
	} else {
		o.stale = false
	}
	if r.err != nil {
		// Nothing better to tell: the pod's events go on with the status known.
		log.G(ctx).WithField(o.kind.String(), o.id).WithError(r.err).Debug("recheck status call failed")
	} else {
		s.update(ctx, o, statusObs(o, r))
	}
	s.flush(ctx, o.pod)
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
		s.startRecheck(o)
	default:
		// The STOPPED goes out without it; the exit verification corrects it if needed.
		log.G(ctx).WithField(o.kind.String(), o.id).WithError(r.err).Warn("OOM check failed")
	}
	s.recompute(ctx, o)
	s.flush(ctx, o.pod)
}

func statusObs(o *object, r *fetchResult) Observation {
	return Observation{Source: SourceStatus, Kind: o.kind, ID: o.id, SandboxStatus: r.sandbox, ContainerStatus: r.container, SourceTime: r.at}
}

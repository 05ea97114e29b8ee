package pleg

// Emitting events: a pod's pending events in order (flush), once what they carry is known (ready), each
// built with the pod's statuses (emit) and handed to the fan-out.

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/containerd/log"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

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
	if sb.sbSent == nil {
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
			if c.emitted < PhaseRemoved && ((c.ctrAnswer == nil && c.fetching) || (c.ctrAnswer != nil && !c.complete)) {
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
			if c.ctrAnswer == nil {
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
		if o.emitted >= PhaseExited && o.emitted < PhaseRemoved && exitDiffers(o.stoppedSt, o.ctrSent) {
			c := o.statusCause
			if o.ctrSent.GetReason() == reasonOOMKilled && o.stoppedSt.GetReason() != reasonOOMKilled {
				if c = o.oomCause; c.at.IsZero() {
					c = o.causes[PhaseExited]
				}
			}
			o.corrected = true
			o.stoppedReason = o.ctrSent.GetReason()
			o.stoppedSt = o.ctrSent
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
			if o.kind == KindContainer && target == PhaseRunning && o.ctrAnswer.State == runtimeapi.ContainerState_CONTAINER_CREATED &&
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
				o.stoppedReason = o.ctrSent.GetReason()
				o.stoppedSt = o.ctrSent
				o.needCorrection = false
			}
			s.emit(ctx, o, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, c)
			if o.kind == KindContainer && o.ctrAnswer.State != runtimeapi.ContainerState_CONTAINER_EXITED && target == PhaseExited {
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

// emit builds one event and hands it to the fan-out.
func (s *state) emit(ctx context.Context, o *object, t runtimeapi.ContainerEventType, c cause) {
	now, ev := s.event(o, t, c)
	if o.kind == KindSandbox && t == runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT && s.fan.replay.open.Load() {
		ev.notReplayed = s.hasNewerLiveSandbox(o.pod)
	}
	var latency time.Duration
	if !c.at.IsZero() {
		latency = now.Sub(c.at)
	}
	s.metrics.EventEmitted(t, o.kind, c.src, latency)
	if c.src == SourceRelist {
		s.metrics.RelistRepair(o.kind, t)
		o.repaired |= 1 << eventPhase(t)
	}
	if log.GetLevel() >= log.DebugLevel {
		log.G(ctx).WithField(o.kind.String(), o.id).WithField("source", c.src).Debugf("emit %s", t)
	}
	s.fan.publish(ctx, ev)
	if s.ckptWake != nil {
		s.checkpointEmitted(o, t)
	}
}

// event builds an event of type t about o, with the pod's statuses as they stand and a created_at after
// every earlier event of the pod; it returns the time it was built.
func (s *state) event(o *object, t runtimeapi.ContainerEventType, c cause) (time.Time, Event) {
	p := o.pod
	now := s.clock()
	ts := now.UnixNano()
	if ts <= p.lastEvent {
		ts = p.lastEvent + 1
	}
	p.lastEvent = ts
	statuses := make([]*runtimeapi.ContainerStatus, len(p.listed))
	for i, ct := range p.listed {
		statuses[i] = ct.ctrSent
	}
	return now, Event{
		Response: &runtimeapi.ContainerEventResponse{
			ContainerId:        o.id,
			ContainerEventType: t,
			CreatedAt:          ts,
			PodSandboxStatus:   p.sandbox.sbSent,
			ContainersStatuses: statuses,
		},
		Source:     c.src,
		SourceTime: c.at,
		wire:       &wireCache{},
	}
}

// hasNewerLiveSandbox reports whether p's pod (uid) has another sandbox, created after p's, that is not
// removed. It scans every pod: only the startup replay asks.
func (s *state) hasNewerLiveSandbox(p *pod) bool {
	uid := p.sandbox.sbAnswer.GetMetadata().GetUid()
	if uid == "" {
		return false
	}
	for _, q := range s.pods {
		if q != p && q.sandbox.phase < PhaseRemoved && q.sandbox.sbAnswer.GetMetadata().GetUid() == uid &&
			q.sandbox.sbAnswer.GetCreatedAt() >= p.sandbox.sbAnswer.GetCreatedAt() {
			return true
		}
	}
	return false
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

// refreshReq is a refresh of an object's STOPPED asked for by RefreshStopped.
type refreshReq struct {
	id string
	at time.Time
}

// refreshStopped sends o's STOPPED again, as RefreshStopped describes, when the pod's events are all
// out and o's last one is its STOPPED; otherwise it does nothing (the pod's next event is newer anyway,
// or o is no longer stopped).
func (s *state) refreshStopped(ctx context.Context, r *refreshReq) {
	o := s.objects[r.id]
	if o == nil || o.dropped || o.pod.dropped {
		return
	}
	if o.phase != PhaseExited || o.emitted != PhaseExited || o.needCorrection || len(o.pod.queue) > 0 || !s.ready(o) {
		log.G(ctx).WithField(o.kind.String(), o.id).Debug("no refresh: the object is not stopped, or its pod has an event pending")
		return
	}
	s.emit(ctx, o, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, cause{src: SourceRefresh, at: r.at})
}

package pleg

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/containerd/log"
)

// startupReplay keeps every event emitted since the PLEG was made, for the subscribers that subscribe
// soon after it started (Config.StartupReplay). After a restart of pleg-nri, the startup reconciliation
// emits what changed while it was down before any client had time to reconnect: without the replay
// those events would reach nobody, and the checkpoint would already count them as received.
//
// A subscriber that subscribes while the replay is kept gets it first (every event emitted since the
// start, in order), then every event from then on; a subscriber that subscribes later gets only the
// events from then on. The replay is kept until StartupReplay after the startup reconciliation (the
// first successful relist) and is bounded like a subscriber's queue: when full, it is coalesced like a
// subscriber's queue (supersedes in fanout.go); when still full, the replay is dropped, with a log line
// and a metric, and later subscribers get only the events from then on.
//
// The replay leaves out the DELETED of a sandbox whose pod (uid) had a newer live sandbox when it was
// emitted (issue 11): kubelet 1.35/1.36 apply a sandbox's DELETED with cache.Delete(uid), whatever its
// time, so an old sandbox removed while pleg-nri was down would wipe the live sandbox's status from the
// cache until the kubelet's next relist. A subscriber connected when it is emitted gets it, as from
// containerd's stream, where the kubelet's own garbage collection orders it.
//
// While the replay is kept, publish and subscribe serialize on fanout.mu, so an event is either in the
// replay handed to a new subscriber or pushed to it, never both and never neither. Once it is dropped
// publish is lock-free again.
type startupReplay struct {
	// open says the replay is kept.
	open atomic.Bool

	// The rest is guarded by fanout.mu.
	clock Clock
	hold  time.Duration
	// until is when the replay is dropped; zero until the startup reconciliation is done.
	until  time.Time
	events []Event
	// taken says a subscriber got the replay: from then on its queue, not the replay, holds back the
	// delivery watermark.
	taken bool
	// onTaken, when set, is called (under fanout.mu, must not block) when the replay is first taken:
	// the checkpoint can record what it holds.
	onTaken func()
}

// startReplay keeps a replay of the events for hold after the startup reconciliation.
func (f *fanout) startReplay(c Clock, hold time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.replay.clock, f.replay.hold = c, hold
	f.replay.open.Store(true)
}

// startupDone starts the countdown of the replay: the startup reconciliation is done.
func (f *fanout) startupDone() {
	if !f.replay.open.Load() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.replay.until.IsZero() {
		f.replay.until = f.replay.clock().Add(f.replay.hold)
	}
}

// expireReplay drops the replay once its time is over. The processing loop calls it every sweep.
func (f *fanout) expireReplay(ctx context.Context) {
	if !f.replay.open.Load() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expireReplayLocked(ctx)
}

func (f *fanout) expireReplayLocked(ctx context.Context) {
	r := &f.replay
	if !r.open.Load() || r.until.IsZero() || r.clock().Before(r.until) {
		return
	}
	if log.GetLevel() >= log.DebugLevel {
		log.G(ctx).WithField("events", len(r.events)).WithField("taken", r.taken).Debug("startup replay dropped: its time is over")
	}
	f.dropReplayLocked()
}

func (f *fanout) dropReplayLocked() {
	f.replay.open.Store(false)
	f.replay.events = nil
}

// replayPublish keeps ev in the replay and returns the subscribers to push it to, both under f.mu.
func (f *fanout) replayPublish(ctx context.Context, ev Event) []*Subscription {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expireReplayLocked(ctx)
	r := &f.replay
	if r.open.Load() {
		if len(r.events) == f.limit {
			r.events = coalesce(r.events, ev)
		}
		if len(r.events) == f.limit {
			f.dropReplayLocked()
			f.metrics.StartupReplayDropped()
			log.G(ctx).WithField("queue", f.limit).
				Warn("startup replay full of distinct pods: dropped, subscribers from now on get only new events")
		} else {
			r.events = append(r.events, ev)
		}
	}
	return *f.subs.Load()
}

// replaySubscribe hands the replay to a new subscriber; it runs under f.mu, before s is published.
func (f *fanout) replaySubscribe(ctx context.Context, s *Subscription) {
	f.expireReplayLocked(ctx)
	r := &f.replay
	if !r.open.Load() {
		return
	}
	if !r.taken && r.onTaken != nil {
		r.onTaken()
	}
	r.taken = true
	for _, ev := range r.events {
		if ev.notReplayed {
			continue
		}
		s.push(ev) // cannot evict: the replay is no longer than the queue
	}
	if len(r.events) > 0 && log.GetLevel() >= log.DebugLevel {
		log.G(ctx).WithField("subscriber", s.id).WithField("events", len(r.events)).Debug("startup replay handed to a new subscriber")
	}
}

// delivered returns the delivery watermark: the sequence number up to which every published event has
// been received: taken by the Next of every subscriber (or coalesced away, or dropped with a subscriber
// that is gone, but not once pleg-nri is stopping: see holdUndelivered) and, while the startup replay is
// kept and no subscriber has taken it yet, by the replay's first one. It runs under PLEG.mu, so no
// publish runs meanwhile.
func (f *fanout) delivered() uint64 {
	w := f.seq
	for _, s := range *f.subs.Load() {
		s.mu.Lock()
		if s.n > 0 && s.err == nil && !s.closed {
			w = min(w, s.buf[s.head].seq-1)
		}
		s.mu.Unlock()
	}
	if f.replay.open.Load() {
		f.mu.Lock()
		if f.replay.open.Load() && !f.replay.taken && len(f.replay.events) > 0 {
			w = min(w, f.replay.events[0].seq-1)
		}
		f.mu.Unlock()
	}
	if f.stopping.Load() {
		f.mu.Lock()
		if f.undelivered > 0 {
			w = min(w, f.undelivered-1)
		}
		f.mu.Unlock()
	}
	return w
}

// ReconnectReplay is how long after ReplayForReconnects the events are kept for subscribers that
// subscribe again: the kubelet does within a second of its stream's end; a loaded node, within a few.
const ReconnectReplay = 10 * time.Second

// ReplayForReconnects keeps every event emitted from now on for ReconnectReplay, for the subscribers
// that subscribe in that time: call it when subscribers lost their streams through no fault of theirs
// (the front that relayed them went away: front.SupervisorHooks). A 1.35/1.36 kubelet relists at its
// stream's end, before its new subscription reaches the core through the new front; an exit in between
// would otherwise reach it only at its next relist, 300 s later with EventedPLEG. A replay already kept
// (the startup replay, which holds every event since the start) is kept at least as long instead.
// Duplicates are harmless: each event carries the whole pod status, and the kubelet keeps the newest.
func (p *PLEG) ReplayForReconnects() { p.fan.reopenReplay(p.cfg.Clock, ReconnectReplay) }

// reopenReplay keeps a replay of the events from now on for hold (see ReplayForReconnects). Like the
// startup replay, it holds back the delivery watermark until a subscriber took it, is handed to every
// subscriber that subscribes while it is kept, and is bounded by the subscribers' queue.
func (f *fanout) reopenReplay(c Clock, hold time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := &f.replay
	until := c().Add(hold)
	if r.open.Load() {
		// The startup replay: its countdown starts at the startup reconciliation (until zero), or is
		// made at least as long as this one.
		if !r.until.IsZero() && r.until.Before(until) {
			r.until = until
		}
		return
	}
	r.clock, r.hold, r.until, r.events, r.taken = c, hold, until, nil, false
	r.open.Store(true)
}

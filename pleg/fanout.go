package pleg

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/log"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fanout hands every emitted event to every subscriber. Publishing never blocks: each subscriber has a
// bounded ring; a full ring is first coalesced (an event is dropped when a newer event of its pod
// supersedes it, see supersedes), and a subscriber whose ring is still full is evicted: its Next returns
// RESOURCE_EXHAUSTED.
//
// A subscriber that stops taking events (a client suspended, a stream whose client stopped reading)
// while it has events queued is evicted the same way once it has made no progress for the stall
// timeout (evictStalled, from the sweep): coalescing keeps its queue from filling as long as the node
// has fewer pods than its queue has room for, and until it goes its oldest queued event holds back the
// delivery watermark (replay.go), so the checkpoint and the deleted objects kept until every subscriber
// received their DELETED (state.unacked) with it.
//
// publish and evictStalled are called by one goroutine at a time (under PLEG.mu); Subscribe and Close
// may run at any time.
type fanout struct {
	metrics Metrics
	limit   int // per-subscriber queue bound
	// stall is the stall timeout (evictStalled); 0 disables it. lastStallCheck is evictStalled's last
	// now; only evictStalled (under PLEG.mu) uses it.
	stall          time.Duration
	lastStallCheck time.Time

	// subs is the current subscriber list, replaced (copy on write) under mu so publish reads it
	// without a lock.
	subs atomic.Pointer[[]*Subscription]
	// mu guards the writes of subs and nextID.
	mu     sync.Mutex
	nextID uint64

	// seq numbers the events published; only publish (under PLEG.mu) writes it.
	seq uint64
	// stopping is set by holdUndelivered, when pleg-nri stops: from then on an event that no
	// subscriber takes is not received (see delivered).
	stopping atomic.Bool
	// undelivered is, once stopping, the first event published that no subscriber took: published
	// with none to queue it, or still queued when its subscriber closed; 0 while there is none. It is
	// guarded by mu.
	undelivered uint64
	// replay keeps the events since the start for subscribers that come soon after (replay.go).
	replay startupReplay
}

func newFanout(limit int, m Metrics) *fanout {
	f := &fanout{metrics: m, limit: limit}
	f.subs.Store(&[]*Subscription{})
	return f
}

// evictAfterStall makes evictStalled evict a subscriber that takes no event for d while it has events
// queued; d <= 0 disables it. Call it before the first subscription.
func (f *fanout) evictAfterStall(d time.Duration) { f.stall = max(d, 0) }

// Subscription is one subscriber's view of the event stream: every event emitted after Subscribe, in
// order, unless its queue overflowed (see Next).
type Subscription struct {
	id uint64
	f  *fanout

	// mu guards buf, head, n, waiting, seen, err, closed and stats.
	mu   sync.Mutex
	buf  []Event // ring of len == limit
	head int     // index of the oldest queued event
	n    int     // number of queued events
	// waiting is, as evictStalled saw it, since when the subscriber has had events queued and taken
	// none (zero: it has none queued, or no sweep saw them yet); seen is its stats.Delivered then.
	// Only evictStalled sets them: the event path reads no clock.
	waiting time.Time
	seen    uint64
	err     error // set on eviction
	closed  bool
	// stats counts what became of every event offered to the subscription (Queued is n).
	stats SubscriptionStats

	notify chan struct{} // capacity 1: wakes Next after a push, an eviction or Close
	// waitHook, when set (by a test, before the first Next), is called by Next each time it is about to
	// wait for a wake-up.
	waitHook func()
}

// SubscriptionStats accounts for every event offered to one subscription, exactly:
//
//	Offered == Delivered + Coalesced + Dropped + Queued
//
// An event is offered when it is published while the subscription is open and not evicted; after an
// eviction or Close nothing more is offered.
type SubscriptionStats struct {
	// Offered is the number of events published to the subscription.
	Offered uint64
	// Delivered is the number of events Next returned (to a stream server, that is events handed to
	// its transport, which a client that stopped reading may not have received yet).
	Delivered uint64
	// Coalesced is the number of queued events a newer event of the same pod superseded in a full queue
	// (the newer one carries the whole pod status; see supersedes).
	Coalesced uint64
	// Dropped is the number of events discarded undelivered: at eviction, the queue and the event that
	// did not fit; at Close, the queue.
	Dropped uint64
	// Queued is the number of events waiting for Next.
	Queued int
	// Evicted is set once the subscription was evicted with RESOURCE_EXHAUSTED.
	Evicted bool
}

// Stats returns the subscription's counters.
func (s *Subscription) Stats() SubscriptionStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Queued = s.n
	st.Evicted = s.err != nil
	return st
}

func (f *fanout) subscribe() *Subscription {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	s := &Subscription{id: f.nextID, f: f, buf: make([]Event, f.limit), notify: make(chan struct{}, 1)}
	// The queue's depth exists from the subscription on, not from its first event: a subscriber of
	// a quiet node (or one that just reconnected to a restarted core) shows an empty queue.
	f.metrics.SubscriberQueueDepth(s.id, 0)
	if f.replay.open.Load() {
		f.replaySubscribe(context.Background(), s)
	}
	old := *f.subs.Load()
	subs := make([]*Subscription, len(old), len(old)+1)
	copy(subs, old)
	subs = append(subs, s)
	f.subs.Store(&subs)
	f.metrics.Subscribers(len(subs))
	return s
}

// remove drops s from the subscriber list; it is a no-op when s is already gone.
func (f *fanout) remove(s *Subscription) {
	f.mu.Lock()
	defer f.mu.Unlock()
	old := *f.subs.Load()
	subs := make([]*Subscription, 0, len(old))
	found := false
	for _, x := range old {
		if x == s {
			found = true
			continue
		}
		subs = append(subs, x)
	}
	if !found {
		return
	}
	f.subs.Store(&subs)
	f.metrics.Subscribers(len(subs))
	f.metrics.SubscriberRemoved(s.id)
}

// count returns the number of subscribers.
func (f *fanout) count() int { return len(*f.subs.Load()) }

// publish queues ev for every subscriber; it never blocks.
func (f *fanout) publish(ctx context.Context, ev Event) {
	f.seq++
	ev.seq = f.seq
	subs := *f.subs.Load()
	if f.replay.open.Load() {
		subs = f.replayPublish(ctx, ev)
	}
	// Only a stopping pleg-nri asks whether a subscriber queued the event (a lock per subscriber).
	stopping, queued := f.stopping.Load(), false
	for _, s := range subs {
		evicted := s.push(ev)
		if stopping && !queued {
			queued = s.live()
		}
		if evicted {
			f.evicted(ctx, s, EvictedQueueFull, 0)
		}
	}
	if stopping && !queued {
		f.noteUndelivered(ev.seq)
	}
}

// Why a subscriber was evicted: the reason label of SubscriberEvicted.
const (
	// EvictedQueueFull: its queue was full of events of distinct pods, none superseded.
	EvictedQueueFull = "queue_full"
	// EvictedStalled: it took no event for the stall timeout while it had events queued.
	EvictedStalled = "stalled"
)

// evicted tells of the eviction of s, which push or evictStalled made (s.err is set), and removes it:
// its metric, its log line. stalled is how long it had taken no event, for EvictedStalled.
func (f *fanout) evicted(ctx context.Context, s *Subscription, reason string, stalled time.Duration) {
	f.metrics.SubscriberEvicted(s.id, reason)
	st := s.Stats()
	entry := log.G(ctx).WithField("subscriber", s.id).WithField("reason", reason).WithField("queue", f.limit).
		WithField("offered", st.Offered).WithField("delivered", st.Delivered).
		WithField("coalesced", st.Coalesced).WithField("dropped", st.Dropped)
	if reason == EvictedStalled {
		entry = entry.WithField("stalled", stalled).WithField("stall-timeout", f.stall)
	}
	entry.Warn("event subscriber cannot keep up: evicted with RESOURCE_EXHAUSTED")
	f.remove(s)
}

// evictStalled evicts every subscriber that has had events queued and taken none for the stall
// timeout, as of now. The sweep calls it, about once a sweepPeriod, under PLEG.mu as publish. It tells
// progress by sampling: an event taken counts at the first call after it, and events queued count from
// the first call that sees them; so a subscriber goes at least the timeout after its last progress, and
// at most about two sweepPeriods more. The event path pays nothing for it: no clock read per event.
//
// A call more than stallGap after the one before means the core itself did not run (SIGSTOP, a frozen
// cgroup, a paused VM): its subscribers could not take events either, so their waits start again.
func (f *fanout) evictStalled(ctx context.Context, now time.Time) {
	if f.stall <= 0 {
		return
	}
	restart := !f.lastStallCheck.IsZero() && now.Sub(f.lastStallCheck) > stallGap
	f.lastStallCheck = now
	for _, s := range *f.subs.Load() {
		if stalled, ok := s.evictIfStalled(now, f.stall, restart); ok {
			f.evicted(ctx, s, EvictedStalled, stalled)
		}
	}
}

// stallGap is the longest time between two evictStalled calls of a core that runs: they come every
// sweepPeriod.
const stallGap = 5 * sweepPeriod

// evictIfStalled evicts s if, since evictStalled last saw it take an event or saw its queue empty, it
// has had events queued and taken none for at least timeout as of now; it returns for how long.
// restart starts its wait again from now.
func (s *Subscription) evictIfStalled(now time.Time, timeout time.Duration, restart bool) (time.Duration, bool) {
	s.mu.Lock()
	switch {
	case s.err != nil || s.closed:
		s.mu.Unlock()
		return 0, false
	case s.n == 0:
		s.waiting = time.Time{}
		s.mu.Unlock()
		return 0, false
	case restart || s.waiting.IsZero() || s.stats.Delivered != s.seen:
		// Queued since the last look, or progress since: the wait counts from now.
		s.waiting, s.seen = now, s.stats.Delivered
		s.mu.Unlock()
		return 0, false
	}
	stalled := now.Sub(s.waiting)
	if stalled < timeout {
		s.mu.Unlock()
		return 0, false
	}
	n := s.n
	s.evictLocked(0, status.Errorf(codes.ResourceExhausted,
		"event subscriber %d evicted: it took no event for at least %s with %d events queued (stall timeout %s)",
		s.id, stalled.Round(time.Millisecond), n, timeout))
	s.mu.Unlock()
	s.wake()
	return stalled, true
}

// evictLocked ends s with err (RESOURCE_EXHAUSTED): its queue and extra more events (the one that did
// not fit) are dropped.
func (s *Subscription) evictLocked(extra int, err error) {
	s.stats.Dropped += uint64(s.n + extra)
	s.err = err
	s.clearLocked()
}

// holdUndelivered is called when pleg-nri stops, before its event streams end: from then on an event
// that no subscriber takes (one published after the streams ended, by an NRI callback or a task event
// still in flight, or one still queued when its stream ended) does not count as received, so the last
// checkpoint does not record it and the next pleg-nri emits it. Without it, such an event counted as
// received (no subscriber holds it back) and was lost across a SIGTERM or an upgrade.
func (f *fanout) holdUndelivered() { f.stopping.Store(true) }

// noteUndelivered records, once stopping, that the event seq was not taken by any subscriber.
func (f *fanout) noteUndelivered(seq uint64) {
	f.mu.Lock()
	if f.undelivered == 0 || seq < f.undelivered {
		f.undelivered = seq
	}
	f.mu.Unlock()
}

// live reports whether s still takes events: not closed, not evicted.
func (s *Subscription) live() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err == nil && !s.closed
}

// push queues ev; it returns true when it evicted the subscriber.
func (s *Subscription) push(ev Event) bool {
	s.mu.Lock()
	if s.err != nil || s.closed {
		s.mu.Unlock()
		return false
	}
	s.stats.Offered++
	if s.n == len(s.buf) {
		if removed := s.coalesceLocked(ev); removed > 0 {
			s.stats.Coalesced += uint64(removed)
			s.f.metrics.EventsCoalesced(removed)
		}
		if s.n == len(s.buf) {
			s.evictLocked(1, status.Errorf(codes.ResourceExhausted,
				"event subscriber %d evicted: its queue of %d events is full of distinct pods", s.id, len(s.buf)))
			s.mu.Unlock()
			s.wake()
			return true
		}
	}
	s.buf[(s.head+s.n)%len(s.buf)] = ev
	s.n++
	depth := s.n
	s.mu.Unlock()
	s.f.metrics.SubscriberQueueDepth(s.id, depth)
	s.wake()
	return false
}

// coalesceLocked drops the queued events that a newer event of their pod supersedes (a queued one, or
// next, the event about to be queued). It returns how many events it removed.
func (s *Subscription) coalesceLocked(next Event) int {
	s.linearizeLocked()
	kept := coalesce(s.buf[:s.n], next)
	removed := s.n - len(kept)
	s.n = len(kept)
	return removed
}

// linearizeLocked rotates the ring so that its oldest event is at index 0: buf[:n] is then the queue,
// in order.
func (s *Subscription) linearizeLocked() {
	if s.head == 0 {
		return
	}
	slices.Reverse(s.buf[:s.head])
	slices.Reverse(s.buf[s.head:])
	slices.Reverse(s.buf)
	s.head = 0
}

// coalesce drops from evs (queued events, the oldest first) the events that a newer event of their pod
// supersedes: a later one in evs, or next, the event about to be queued after them. It works in place:
// it returns the events kept, in order, and clears the rest of evs. A subscriber's full queue and a full
// startup replay (replay.go) are coalesced by it.
func coalesce(evs []Event, next Event) []Event {
	newer := make(map[string]uint8, len(evs)) // pod key -> the types of the pod's newer events
	newer[podKey(next)] = typeBit(next)
	keep := make([]bool, len(evs))
	for i := len(evs) - 1; i >= 0; i-- {
		k := podKey(evs[i])
		keep[i] = !supersedes(newer[k], evs[i].Response.GetContainerEventType())
		newer[k] |= typeBit(evs[i])
	}
	out := evs[:0]
	for i, ev := range evs {
		if keep[i] {
			out = append(out, ev)
		}
	}
	clear(evs[len(out):])
	return out
}

func typeBit(ev Event) uint8 { return 1 << uint(ev.Response.GetContainerEventType()&7) }

// supersedes reports whether newer events of a pod, of the types in the set newer (typeBit), make an unread
// event of type t of the same pod redundant for the kubelet, so a full queue may drop it (issue 11). Every
// event carries the whole pod status; kubelet 1.35/1.36 write the status of a STARTED or STOPPED into the
// pod cache, write nothing for a CREATED and delete the pod's entry on its sandbox's DELETED; kubelet 1.37
// relists the pod on a STOPPED. So:
//   - a CREATED is superseded by any newer event;
//   - a STARTED by a newer STARTED or STOPPED (a newer status written);
//   - a STOPPED only by a newer STOPPED (a STARTED would lose 1.37's relist);
//   - a DELETED by a newer STARTED, STOPPED or DELETED (a newer sandbox of the pod writes its status over
//     it, a later DELETED deletes as much).
//
// Never a STARTED or STOPPED by a CREATED or DELETED. The relation is transitive, so dropping an event
// that a dropped newer one superseded is safe.
func supersedes(newer uint8, t runtimeapi.ContainerEventType) bool {
	const (
		created = 1 << runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
		started = 1 << runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
		stopped = 1 << runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
		deleted = 1 << runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT
	)
	switch t {
	case runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT:
		return newer&(created|started|stopped|deleted) != 0
	case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
		return newer&(started|stopped) != 0
	case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
		return newer&stopped != 0
	case runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
		return newer&(started|stopped|deleted) != 0
	}
	return false
}

func (s *Subscription) clearLocked() {
	clear(s.buf)
	s.head, s.n = 0, 0
}

func (s *Subscription) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// podKey is the coalescing key of an event: the pod uid, else the sandbox id, else the container id.
func podKey(ev Event) string {
	r := ev.Response
	if r == nil {
		return ""
	}
	if ps := r.GetPodSandboxStatus(); ps != nil {
		if uid := ps.GetMetadata().GetUid(); uid != "" {
			return uid
		}
		if ps.GetId() != "" {
			return ps.GetId()
		}
	}
	return r.GetContainerId()
}

// Next returns the next event, blocking until there is one or ctx is done. After the subscriber was
// evicted it returns a gRPC status error with codes.ResourceExhausted (queued events are dropped: the
// consumer must relist); after Close, one with codes.Canceled.
func (s *Subscription) Next(ctx context.Context) (Event, error) {
	for {
		s.mu.Lock()
		switch {
		case s.err != nil:
			err := s.err
			s.mu.Unlock()
			return Event{}, err
		case s.n > 0:
			ev := s.buf[s.head]
			s.buf[s.head] = Event{}
			s.head = (s.head + 1) % len(s.buf)
			s.n--
			s.stats.Delivered++
			depth := s.n
			s.mu.Unlock()
			s.f.metrics.SubscriberQueueDepth(s.id, depth)
			return ev, nil
		case s.closed:
			s.mu.Unlock()
			return Event{}, status.Error(codes.Canceled, "event subscription closed")
		}
		s.mu.Unlock()
		if s.waitHook != nil {
			s.waitHook()
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// Len returns the number of queued events.
func (s *Subscription) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// Close ends the subscription: it stops receiving events and a pending Next returns. Close is
// idempotent.
func (s *Subscription) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.stats.Dropped += uint64(s.n) // none after an eviction: the queue was cleared then
	var first uint64
	if s.n > 0 {
		first = s.buf[s.head].seq
	}
	s.clearLocked()
	s.mu.Unlock()
	if first > 0 && s.f.stopping.Load() {
		s.f.noteUndelivered(first)
	}
	s.f.remove(s)
	s.wake()
}

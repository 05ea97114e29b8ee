package pleg

import (
	"sync"
	"sync/atomic"
	"time"
)

// aheadTTL bounds how long an object stays "stopped ahead" when the CRI never catches up (containerd
// stuck, or the object went away without an answer saying so).
const aheadTTL = 10 * time.Second

// aheadSet holds the objects whose STOPPED was emitted while containerd's CRI status still said they
// were running (containerd updates a container's status only after its exit handler deleted the task,
// which takes from milliseconds to seconds after the exit that NRI and the task events report).
//
// A reader that got the STOPPED must not then read an older state through pleg-nri's CRI endpoint: the
// kubelet caches a status it reads with its own, newer timestamp, and would keep a running container
// that pleg-nri reported stopped. The endpoint asks this set on every status read (see
// eventbridge.Freshness). It is safe for concurrent use; the state machine updates it under PLEG.mu.
type aheadSet struct {
	n   atomic.Int64 // len(ids), read without the lock
	mu  sync.Mutex
	ids map[string]time.Time // id -> when its STOPPED was emitted
}

func newAheadSet() *aheadSet { return &aheadSet{ids: map[string]time.Time{}} }

func (a *aheadSet) add(id string, at time.Time) {
	a.mu.Lock()
	if _, ok := a.ids[id]; !ok {
		a.ids[id] = at
		a.n.Add(1)
	}
	a.mu.Unlock()
}

func (a *aheadSet) remove(id string) {
	if a.n.Load() == 0 {
		return
	}
	a.mu.Lock()
	if _, ok := a.ids[id]; ok {
		delete(a.ids, id)
		a.n.Add(-1)
	}
	a.mu.Unlock()
}

func (a *aheadSet) has(id string) bool {
	if a.n.Load() == 0 {
		return false
	}
	a.mu.Lock()
	_, ok := a.ids[id]
	a.mu.Unlock()
	return ok
}

// expire forgets the entries older than aheadTTL.
func (a *aheadSet) expire(now time.Time) {
	if a.n.Load() == 0 {
		return
	}
	a.mu.Lock()
	for id, at := range a.ids {
		if now.Sub(at) >= aheadTTL {
			delete(a.ids, id)
			a.n.Add(-1)
		}
	}
	a.mu.Unlock()
}

// AnyStoppedAhead reports whether some object's STOPPED was emitted while containerd's CRI status did
// not say so yet. It is a single atomic load: the CRI endpoint calls it on every status read.
func (p *PLEG) AnyStoppedAhead() bool { return p.st.ahead.n.Load() > 0 }

// StoppedAhead reports whether id's STOPPED was emitted while containerd's CRI status did not say so
// yet (and no status answer has said so since).
func (p *PLEG) StoppedAhead(id string) bool { return p.st.ahead.has(id) }

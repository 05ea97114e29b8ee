package pleg

// Held observations and tombstones: an observation of an unknown id waits for its object, a deleted id
// is remembered so its late observations are ignored; both bounded, both expired by sweep.

import (
	"context"
	"time"

	"github.com/containerd/log"
)

const (
	heldTTL       = time.Minute     // how long an observation of an unknown id waits for its object
	maxHeldIDs    = 4096            // bound on the unknown ids held
	maxHeldPerID  = 16              // bound on the observations held per unknown id
	tombTTL       = 5 * time.Minute // how long a deleted id is remembered
	maxTombstones = 65536           // bound on the deleted ids remembered
	sweepPeriod   = time.Second     // how often holds and tombstones are expired
)

type heldObs struct {
	since time.Time
	obs   []Observation
}

type tomb struct {
	id string
	at time.Time
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
		h = &heldObs{since: s.clock()}
		s.held[ob.ID] = h
	}
	h.obs = append(h.obs, ob)
	s.heldN++
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
	now := s.clock()
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

// sweep expires held observations, tombstones and the startup replay, and evicts the stalled
// subscribers, at most once per sweepPeriod.
func (s *state) sweep(ctx context.Context) {
	now := s.clock()
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
	s.fan.evictStalled(ctx, now)
}

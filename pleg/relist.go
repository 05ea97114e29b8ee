package pleg

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/containerd/log"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RelistResult says what one relist found.
type RelistResult struct {
	// Sandboxes and Containers are the numbers listed.
	Sandboxes, Containers int
	// Repairs counts the events the diff found missing, by "<kind>_<type>" (container_created,
	// container_started, container_stopped, container_deleted, sandbox_...). STARTED is counted only when
	// the state knows the process started; the Metrics.RelistRepair counts are exact (counted at
	// emission).
	Repairs map[string]int
	// Duration is how long the relist took, listing included.
	Duration time.Duration
}

// Relist lists every sandbox and container through the Lister, diffs the lists against the state and
// applies what the events missed, as SourceRelist observations: the events that need no status call
// are emitted before Relist returns. Objects new to the state, and exits the list reports without an
// exit code, get a status call first; their events are emitted when it answers, which needs Run (or,
// in this package's tests, the synchronous fetch helper). A quiet relist emits nothing and makes no
// status call.
//
// Relist never declares vanished, nor moves, an object some input reported after the relist took its
// snapshot of the state, and never moves an object backwards. Concurrent calls are serialized.
func (p *PLEG) Relist(ctx context.Context) (RelistResult, error) {
	start := p.clock()
	res, err := p.relist(ctx)
	res.Duration = p.clock().Sub(start)
	p.metrics.RelistCompleted(res.Duration, err)
	return res, err
}

func (p *PLEG) relist(ctx context.Context) (RelistResult, error) {
	if p.cfg.Lister == nil {
		return RelistResult{}, errors.New("pleg: relist needs Config.Lister")
	}
	p.relistMu.Lock()
	defer p.relistMu.Unlock()

	p.mu.Lock()
	p.drainLocked(ctx)
	snap := p.st.seq
	p.mu.Unlock()
	sandboxes, err := p.cfg.Lister.ListPodSandbox(ctx)
	if err != nil {
		return RelistResult{}, err // the Lister says what failed
	}
	containers, err := p.cfg.Lister.ListContainers(ctx)
	if err != nil {
		return RelistResult{}, err
	}
	res := RelistResult{Sandboxes: len(sandboxes), Containers: len(containers)}

	p.mu.Lock()
	defer p.mu.Unlock()
	p.drainLocked(ctx)
	repairs := diffRelist(p.st.objects, p.st.tombs, snap, sandboxes, containers, p.clock())
	// The first successful relist is the startup reconciliation: what it finds changed while pleg-nri
	// was not running (against the checkpoint's state, or everything on a first start).
	startup := !p.startupDone.Load()
	if startup {
		p.startupDone.Store(true)
		p.fan.startupDone()
		for i := range repairs {
			repairs[i].Source = SourceStartup
		}
	}
	if len(repairs) == 0 {
		return res, nil
	}
	res.Repairs = map[string]int{}
	for _, ob := range repairs {
		countRepairs(res.Repairs, p.st.objects[ob.ID], ob)
	}
	if startup {
		log.G(ctx).WithField("changes", res.Repairs).Info("startup reconciliation: what changed while pleg-nri was not running")
	} else {
		log.G(ctx).WithField("repairs", res.Repairs).Info("relist found changes the events missed")
	}
	for _, ob := range repairs {
		p.metrics.ObservationReceived(ob.Source, ob.Kind)
		p.st.apply(ctx, input{obs: ob})
	}
	return res, nil
}

// countRepairs adds to m the events applying ob to o (nil: unknown object) implies.
func countRepairs(m map[string]int, o *object, ob Observation) {
	from, started := PhaseNone, false
	if o != nil {
		from, started = o.phase, o.started
	}
	for ph := from + 1; ph <= ob.Phase; ph++ {
		var name string
		switch ph {
		case PhaseCreated:
			name = "created"
		case PhaseRunning:
			if !started && ob.Phase != PhaseRunning && ob.Kind != KindSandbox {
				continue
			}
			started = true
			name = "started"
		case PhaseExited:
			if !started && ob.Phase != PhaseExited {
				continue
			}
			name = "stopped"
		case PhaseRemoved:
			name = "deleted"
		}
		m[ob.Kind.String()+"_"+name]++
	}
}

// diffRelist compares fresh lists with the state and returns the observations that bring the state up to
// date: new and changed sandboxes, new and changed containers, then vanished containers and vanished
// sandboxes. It is a pure function: objects and tombs are only read.
//
//   - An object some input reported after the snapshot sequence after is left alone.
//   - An object only moves forward: a list entry behind the state is ignored.
//   - An object the CRI never answered a status for is not declared vanished: its pending status call
//     decides (containerd calls NRI RunPodSandbox/CreateContainer before the object is in its store).
//   - A tombstoned id in the list is ignored (its removal was observed after the list was taken).
//   - A container in the UNKNOWN state (containerd still loading it) is neither changed nor vanished.
func diffRelist(objects map[string]*object, tombs map[string]time.Time, after uint64,
	sandboxes []*runtimeapi.PodSandbox, containers []*runtimeapi.Container, now time.Time) []Observation {
	listed := make(map[string]struct{}, len(sandboxes)+len(containers))
	dead := func(id string) bool { _, ok := tombs[id]; return ok }
	var out []Observation
	for _, sb := range sandboxes {
		id := sb.GetId()
		if id == "" {
			continue
		}
		listed[id] = struct{}{}
		ph := sandboxStatePhase(sb.GetState())
		if !relistNews(objects[id], KindSandbox, ph, after, dead(id)) {
			continue
		}
		out = append(out, Observation{
			Source: SourceRelist, Kind: KindSandbox, ID: id, SandboxID: id, Phase: ph,
			CreatedAt: unixNano(sb.GetCreatedAt()), SourceTime: now,
		})
	}
	for _, c := range containers {
		id := c.GetId()
		if id == "" {
			continue
		}
		listed[id] = struct{}{}
		ph := containerStatePhase(c.GetState())
		if ph == PhaseNone {
			continue
		}
		if !relistNews(objects[id], KindContainer, ph, after, dead(id) || dead(c.GetPodSandboxId())) {
			continue
		}
		out = append(out, Observation{
			Source: SourceRelist, Kind: KindContainer, ID: id, SandboxID: c.GetPodSandboxId(), Phase: ph,
			CreatedAt: unixNano(c.GetCreatedAt()), SourceTime: now,
		})
	}
	var gone []*object
	for id, o := range objects {
		if _, ok := listed[id]; ok {
			continue
		}
		if o.phase == PhaseRemoved || o.lastSeq > after || !o.hasStatus() || o.dropped {
			continue
		}
		gone = append(gone, o)
	}
	slices.SortFunc(gone, func(a, b *object) int {
		if a.kind != b.kind {
			if a.kind == KindContainer {
				return -1
			}
			return 1
		}
		return strings.Compare(a.id, b.id)
	})
	for _, o := range gone {
		out = append(out, Observation{
			Source: SourceRelist, Kind: o.kind, ID: o.id, SandboxID: o.pod.id, Phase: PhaseRemoved, SourceTime: now,
		})
	}
	return out
}

// relistNews says whether a listed object of kind in phase ph tells the state something: an id the
// state does not know (unless tombstoned: dead), or an object of that kind behind ph that no input
// reported after the snapshot sequence after.
func relistNews(o *object, kind Kind, ph Phase, after uint64, dead bool) bool {
	if o == nil {
		return !dead
	}
	return o.kind == kind && o.lastSeq <= after && ph > o.phase
}

func unixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// relistLoop relists at start, every RelistPeriod and on TriggerRelist until ctx is done. A failed
// relist is logged and retried at the next tick.
func (p *PLEG) relistLoop(ctx context.Context) {
	t := time.NewTicker(p.cfg.RelistPeriod)
	defer t.Stop()
	timeout := max(p.cfg.RelistPeriod, 4*p.cfg.StatusTimeout)
	for {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		_, err := p.Relist(rctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.G(ctx).WithError(err).Warn("relist failed, retrying next period")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.relistNow:
		}
	}
}

package pleg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/log"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Defaults of Config.
const (
	DefaultSubscriberQueue = 1024
	// DefaultSubscriberStallTimeout is how long a subscriber may take no event while it has events
	// queued before it is evicted: far longer than a kubelet ever goes without reading its stream (its
	// reader goroutine only copies each event into a channel of 1000), short enough that the
	// checkpoint and the deleted objects it holds back stay bounded.
	DefaultSubscriberStallTimeout = time.Minute
	DefaultRelistPeriod           = 10 * time.Second
	DefaultStatusTimeout          = 2 * time.Second
	DefaultVerifyDelay            = 250 * time.Millisecond
	DefaultStatusWorkers          = 4
	// DefaultOOMCheckTimeout bounds the OOM check of an exit with status 137.
	DefaultOOMCheckTimeout = 100 * time.Millisecond
	// DefaultCheckpointInterval is the least time between two checkpoint writes.
	DefaultCheckpointInterval = time.Second
)

// Config is everything a PLEG is built from: its settings (a zero field takes its default) and the
// collaborators the daemon or a test hands it (status source, lister, OOM checker, clock, metrics). As
// every component of pleg-nri (plugin.Config, containerd.TaskEventsConfig, ProxyConfig, RelayConfig),
// it takes one Config struct and no functional options.
type Config struct {
	// Status answers the CRI status calls. Required.
	Status StatusSource
	// Lister lists sandboxes and containers for Relist. Required for Relist and for Run.
	Lister Lister
	// OOM, when set, tells whether a container's cgroup recorded an OOM kill, as containerd's exit
	// handler asks before its STOPPED of an exit with status 137: pleg-nri's first STOPPED of such an
	// exit waits for the answer (at most OOMCheckTimeout) unless /tasks/oom said it already.
	OOM OOMChecker
	// OOMCheckTimeout bounds an OOM check; default DefaultOOMCheckTimeout.
	OOMCheckTimeout time.Duration
	// Clock is the time source of the state machine (event created_at, TTLs, retry schedule); nil is the
	// real clock.
	Clock Clock
	// Metrics receives every count and measurement; nil is NopMetrics.
	Metrics Metrics
	// SubscriberQueue bounds each subscriber's queue; default DefaultSubscriberQueue.
	SubscriberQueue int
	// SubscriberStallTimeout evicts, with RESOURCE_EXHAUSTED, a subscriber that takes no event for
	// this long while it has events queued (fanout.go; checked by the sweep, once a second, so within
	// about 2 s more); default
	// DefaultSubscriberStallTimeout, negative disables. A subscriber that reads, however slowly, or
	// that has nothing queued, is never evicted by it.
	SubscriberStallTimeout time.Duration
	// RelistPeriod is the period of the relist loop; default DefaultRelistPeriod.
	RelistPeriod time.Duration
	// ResyncDelays are the relists Resync schedules after the one at once; nil is DefaultResyncDelays.
	ResyncDelays []time.Duration
	// Reconnect, when set, is called before each relist of Resync: it makes the status source's
	// connection retry at once, since after an outage of containerd its backoff can hold calls failing
	// for seconds after containerd answers again.
	Reconnect func()
	// StatusTimeout bounds each status call; default DefaultStatusTimeout.
	StatusTimeout time.Duration
	// VerifyDelay is how long after a STARTED or STOPPED built from fast facts the container's CRI status
	// is fetched to verify it (and catch a late OOMKilled); default DefaultVerifyDelay, negative disables.
	// An exit is asked again, with a doubling delay (at most maxVerifyAttempts calls), until containerd's
	// answer shows it; an answer that differs in a field the kubelet reads gives a corrected STOPPED.
	VerifyDelay time.Duration
	// StatusWorkers is the number of concurrent status calls; default DefaultStatusWorkers.
	StatusWorkers int
	// CheckpointPath is the file that keeps, across restarts, what every subscriber has received
	// (checkpoint.go); its directory is created if needed. New restores the state from it, so a restart
	// emits only what changed meanwhile. Empty disables the checkpoint: every object found at startup
	// is new.
	CheckpointPath string
	// CheckpointScope names the runtime the state belongs to (the daemon uses its CRI endpoint): a
	// checkpoint written with another scope is ignored.
	CheckpointScope string
	// CheckpointInterval is the least time between two checkpoint writes; default
	// DefaultCheckpointInterval.
	CheckpointInterval time.Duration
	// CacheTick, when positive, sends every CacheTick each pod's statuses as they stand, in a CREATED
	// event about its sandbox (cachetick.go): a kubelet 1.35 or 1.36 writes it into its pod cache and
	// acts on nothing, and its pod workers, which wait for a status newer than their pod's last sync,
	// wait at most CacheTick instead of their evented PLEG's 5 s tick. Zero disables it.
	CacheTick time.Duration
	// StartupReplay, when positive, keeps the events emitted since New for the subscribers that
	// subscribe until StartupReplay after the startup reconciliation (replay.go): after a restart, a
	// client that reconnects gets what changed while pleg-nri was down. Zero disables it.
	StartupReplay time.Duration
}

// Event is one CRI container event with where it came from.
type Event struct {
	// Response is the event; shared between subscribers and never modified: do not modify it.
	Response *runtimeapi.ContainerEventResponse
	// Source is the input whose observation caused the event.
	Source Source
	// SourceTime is when that input saw it: the send latency metric measures from it.
	SourceTime time.Time

	// seq is the event's fan-out sequence number (the checkpoint's delivery watermark counts them).
	seq uint64
	// wire caches Response's encoding for every copy of the event (nil: not cached).
	wire *wireCache
	// notReplayed leaves the event out of the startup replay (replay.go): the DELETED of a sandbox whose
	// pod has a newer live sandbox.
	notReplayed bool
}

type wireCache struct {
	once sync.Once
	b    []byte
	err  error
}

// Marshaled returns the protobuf encoding of Response, computed once per event and shared by every
// subscriber that asks (a CRI endpoint sends these bytes as they are): do not modify it.
func (e Event) Marshaled() ([]byte, error) {
	if e.wire == nil {
		return proto.Marshal(e.Response)
	}
	e.wire.once.Do(func() { e.wire.b, e.wire.err = proto.Marshal(e.Response) })
	return e.wire.b, e.wire.err
}

// input is one entry of the inbox: an observation, a status answer, or a refresh asked for.
type input struct {
	obs     Observation
	res     *fetchResult
	refresh *refreshReq
}

// PLEG turns observations into CRI container events and fans them out to subscribers.
type PLEG struct {
	cfg     Config
	clock   Clock
	metrics Metrics
	fetch   *fetcher
	fan     *fanout
	// resync is Resync's schedule of relists.
	resync *resyncer

	// inboxMu guards inbox. It is held only to append or swap: Observe never waits on the state.
	inboxMu sync.Mutex
	inbox   []input
	wake    chan struct{} // capacity 1: the inbox is not empty

	// mu guards st and spare, and serializes every change of the state (drain, Relist).
	//
	// Lock order: relistMu, then mu, then fanout.mu, then Subscription.mu; the fetcher's mu is taken
	// under mu (the state machine pushes status requests) and never the other way round; inboxMu is a
	// leaf, held only to append to or swap the inbox.
	mu    sync.Mutex
	st    *state
	spare []input // the inbox's previous backing array, reused

	relistMu  sync.Mutex    // serializes Relist calls
	relistNow chan struct{} // capacity 1: TriggerRelist
	running   atomic.Bool
	// startupDone is set after the first successful relist: the startup reconciliation.
	startupDone atomic.Bool

	ckpt ckptWriter // the checkpoint writer's state (checkpoint_writer.go)
}

// New returns a PLEG; Run must be running for status calls and the relist loop to happen.
func New(cfg Config) (*PLEG, error) {
	if cfg.Status == nil {
		return nil, errors.New("pleg: Config.Status is required")
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NopMetrics{}
	}
	if cfg.SubscriberQueue <= 0 {
		cfg.SubscriberQueue = DefaultSubscriberQueue
	}
	if cfg.SubscriberStallTimeout == 0 {
		cfg.SubscriberStallTimeout = DefaultSubscriberStallTimeout
	}
	if cfg.RelistPeriod <= 0 {
		cfg.RelistPeriod = DefaultRelistPeriod
	}
	if cfg.StatusTimeout <= 0 {
		cfg.StatusTimeout = DefaultStatusTimeout
	}
	if cfg.VerifyDelay == 0 {
		cfg.VerifyDelay = DefaultVerifyDelay
	}
	if cfg.OOMCheckTimeout <= 0 {
		cfg.OOMCheckTimeout = DefaultOOMCheckTimeout
	}
	if cfg.StatusWorkers <= 0 {
		cfg.StatusWorkers = DefaultStatusWorkers
	}
	if cfg.CheckpointInterval <= 0 {
		cfg.CheckpointInterval = DefaultCheckpointInterval
	}
	p := &PLEG{
		cfg:       cfg,
		clock:     cfg.Clock,
		metrics:   cfg.Metrics,
		fetch:     newFetcher(cfg.Clock),
		fan:       newFanout(cfg.SubscriberQueue, cfg.Metrics),
		wake:      make(chan struct{}, 1),
		relistNow: make(chan struct{}, 1),
	}
	p.fan.evictAfterStall(cfg.SubscriberStallTimeout)
	delays := cfg.ResyncDelays
	if delays == nil {
		delays = DefaultResyncDelays
	}
	p.resync = newResyncer(func() {
		if cfg.Reconnect != nil {
			cfg.Reconnect()
		}
		p.TriggerRelist()
	}, delays)
	p.st = newState(cfg.Clock, cfg.Metrics, p.fetch, p.fan, cfg.VerifyDelay)
	p.st.oomCheck = cfg.OOM != nil
	p.st.oomFast, _ = cfg.OOM.(OOMCgroupReader)
	if cfg.StartupReplay > 0 {
		p.fan.startReplay(cfg.Clock, cfg.StartupReplay)
	}
	if cfg.CheckpointPath != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.CheckpointPath), 0o700); err != nil {
			return nil, fmt.Errorf("pleg: checkpoint directory: %w", err)
		}
		p.st.ckptWake = make(chan struct{}, 1)
		p.fan.replay.onTaken = p.st.urgentCheckpoint // the replay's events are received: record them
		p.loadCheckpoint(context.Background())
	}
	return p, nil
}

// Observe hands one observation to the state machine. It never blocks (the inbox is unbounded), is safe
// from any goroutine, and costs a mutex and an append: NRI hooks call it. The observation is applied by
// Run's processing goroutine (or by the next Relist).
func (p *PLEG) Observe(o Observation) {
	p.metrics.ObservationReceived(o.Source, o.Kind)
	p.enqueue(input{obs: o})
}

func (p *PLEG) enqueue(in input) {
	p.inboxMu.Lock()
	p.inbox = append(p.inbox, in)
	p.inboxMu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// drain applies everything in the inbox. Tests call it directly with a fake clock.
func (p *PLEG) drain(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drainLocked(ctx)
}

func (p *PLEG) drainLocked(ctx context.Context) {
	for {
		p.inboxMu.Lock()
		batch := p.inbox
		p.inbox = p.spare[:0]
		p.inboxMu.Unlock()
		if len(batch) == 0 {
			p.spare = batch
			p.st.sweep(ctx)
			return
		}
		for i := range batch {
			p.st.apply(ctx, batch[i])
		}
		clear(batch)
		p.spare = batch
	}
}

// Subscribe returns a subscription that receives every event emitted from now on.
func (p *PLEG) Subscribe() *Subscription { return p.fan.subscribe() }

// Stopping is called when pleg-nri stops, before the event streams end and before Run's context is
// done: from then on, an event that no subscriber takes (emitted after the streams ended, by an NRI
// callback or a task event still in flight, or still queued when its stream ended) is not recorded in
// the checkpoint as received, so the next pleg-nri emits it.
func (p *PLEG) Stopping() { p.fan.holdUndelivered() }

// RefreshStopped asks for the STOPPED event of the object id (a container or a sandbox) to be sent
// again, with a new created_at and the pod's statuses as the state holds them now, in order with the
// pod's other events. It never blocks; the refresh is applied by Run's processing goroutine. Nothing
// is sent unless the object's last event is its STOPPED and the pod has no event pending (a pending
// event is itself newer). The CRI endpoint asks for it after a stop its client made (see
// docs/internals.md, "Refresh after a stop"): a kubelet 1.35 or 1.36 waits for a pod status newer
// than the end of its pod's sync, and the stop's own STOPPED is older.
func (p *PLEG) RefreshStopped(id string) {
	p.enqueue(input{refresh: &refreshReq{id: id, at: p.clock()}})
}

// Resync relists at once and again at ResyncDelays: call it after a (re)synchronization with containerd
// (NRI's Synchronize, a new task events subscription), which settles what happened while one of them was
// down a little later than it answers. A Resync during the schedule starts it over. It never blocks.
func (p *PLEG) Resync() { p.resync.Kick() }

// TriggerRelist asks the relist loop of Run to relist at once (after a reconnect); it never blocks.
func (p *PLEG) TriggerRelist() {
	select {
	case p.relistNow <- struct{}{}:
	default:
	}
}

// Run processes observations, runs the status workers and the relist loop (a relist at start, every
// RelistPeriod and on TriggerRelist) until ctx is done. It returns nil on cancellation, after every
// goroutine it started has returned. Run may be called once at a time.
func (p *PLEG) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("pleg: Run is already running")
	}
	defer p.running.Store(false)
	var wg sync.WaitGroup
	p.runFetchers(ctx, &wg)
	wg.Go(func() { p.processLoop(ctx) })
	if p.cfg.Lister != nil {
		wg.Go(func() { p.relistLoop(ctx) })
	} else {
		log.G(ctx).Warn("pleg: no Lister configured: relist disabled")
	}
	if p.cfg.CheckpointPath != "" {
		wg.Go(func() { p.checkpointLoop(ctx) })
	}
	wg.Go(func() { _ = p.resync.run(ctx) })
	<-ctx.Done()
	wg.Wait()
	if p.cfg.CheckpointPath != "" {
		// The last word of a clean shutdown: what the subscribers received up to now.
		p.writeCheckpoint(context.WithoutCancel(ctx))
	}
	return nil
}

func (p *PLEG) processLoop(ctx context.Context) {
	// The ticker expires held observations and tombstones on a quiet node.
	t := time.NewTicker(sweepPeriod)
	defer t.Stop()
	var tick <-chan time.Time // nil: no cache tick
	if p.cfg.CacheTick > 0 {
		ct := time.NewTicker(p.cfg.CacheTick)
		defer ct.Stop()
		tick = ct.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-t.C:
		case <-tick:
			p.mu.Lock()
			p.drainLocked(ctx)
			p.st.cacheTick(ctx)
			p.mu.Unlock()
			continue
		}
		p.drain(ctx)
	}
}

package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/log"
	"google.golang.org/grpc"

	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/retry"
	"github.com/pleg-nri/pleg-nri/pleg"
)

// DefaultNamespace is the containerd namespace of the CRI plugin.
const DefaultNamespace = "k8s.io"

// Backoff bounds of the resubscription loop: the first retry comes after minBackoff, each further one
// doubles the delay up to maxBackoff.
const (
	defaultMinBackoff = 100 * time.Millisecond
	defaultMaxBackoff = 5 * time.Second
	// stableAfter is how long a subscription must last before the backoff starts over: a containerd
	// that accepts the subscription and drops it at once must not be hammered every minBackoff.
	stableAfter = time.Second
	// socketPollMax is the longest wait between two looks for a missing containerd socket.
	socketPollMax = 500 * time.Millisecond
)

// Observer receives the observations made from containerd's task events. Observe is called from the one
// goroutine that owns the subscription and must never block: a blocked Observe stalls the
// subscription, and containerd's event exchange drops events for a subscriber that does not read.
type Observer = pleg.Observer

var _ TaskEventsHooks = NopTaskEventsHooks{}

// TaskEventsHooks are told about the state of the subscription.
type TaskEventsHooks interface {
	// OnReconnect is called each time a subscription is established, the first one included: whatever
	// happened before it (while containerd was down, or before pleg-nri started) is only known from a
	// relist, which the daemon runs then.
	OnReconnect()
	// OnConnectionState is called when the subscription goes up or down, for metrics and readiness.
	OnConnectionState(up bool)
}

// NopTaskEventsHooks is a TaskEventsHooks that does nothing.
type NopTaskEventsHooks struct{}

// OnReconnect does nothing.
func (NopTaskEventsHooks) OnReconnect() {}

// OnConnectionState does nothing.
func (NopTaskEventsHooks) OnConnectionState(bool) {}

// SubscribeFunc opens one subscription to containerd's events. It follows the contract of containerd's
// client: events arrive on the first channel; the second one delivers at most one error and is then
// closed; canceling ctx ends the subscription (the error channel is closed, possibly after a context
// error). An error already waiting when SubscribeFunc returns means the subscription was never
// established.
type SubscribeFunc func(ctx context.Context) (<-chan *events.Envelope, <-chan error)

// TaskEventStats are the counters of a TaskEvents.
type TaskEventStats struct {
	// Observed is the number of observations handed to the Observer.
	Observed uint64
	// ExecExits is the number of /tasks/exit events of exec processes, ignored.
	ExecExits uint64
	// Ignored is the number of events of other topics, ignored.
	Ignored uint64
	// DecodeErrors is the number of events that could not be decoded.
	DecodeErrors uint64
	// Subscriptions is the number of subscriptions established, the first included.
	Subscriptions uint64
}

// TaskEvents turns containerd's task events (/tasks/exit, /tasks/oom, /tasks/start) of one namespace into
// observations. Run owns the subscription: it resubscribes with backoff whenever containerd goes away and
// returns only when its context is canceled.
type TaskEvents struct {
	// address is containerd's socket path ("unix://" stripped); empty when a SubscribeFunc is injected.
	address string
	// namespace is the containerd namespace whose events are observed.
	namespace string
	observer  Observer
	hooks     TaskEventsHooks
	// ownConn is the connection TaskEvents dialed itself (Config.Conn unset), closed by Close.
	ownConn   *grpc.ClientConn
	subscribe SubscribeFunc
	// socketExists reports whether containerd's socket is there; nil when there is nothing to wait for.
	socketExists func() bool
	minBackoff   time.Duration
	maxBackoff   time.Duration
	// sleep waits for d or until ctx is done; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error
	// now is the clock that decides whether a subscription was stable; tests replace it.
	now func() time.Time

	observed, execExits, ignored, decodeErrors, subscriptions atomic.Uint64
}

// TaskEventsConfig is everything a TaskEvents is built from: its settings (a zero field takes its
// default) and what the daemon or a test wires in. As every component of pleg-nri, TaskEvents takes one
// Config struct and no functional options.
type TaskEventsConfig struct {
	// Address is containerd's socket (a path, with or without "unix://"). Required unless Subscribe is
	// set.
	Address string
	// Conn is the connection to containerd at Address (see dial.CRI), shared with the process's other
	// clients of that socket and closed by its owner. Unset, TaskEvents dials Address itself.
	Conn *grpc.ClientConn
	// Namespace is the containerd namespace to observe; default DefaultNamespace.
	Namespace string
	// Observer receives the observations. Required.
	Observer Observer
	// Hooks are told about the subscription's state; nil is NopTaskEventsHooks.
	Hooks TaskEventsHooks
	// MinBackoff and MaxBackoff bound the delay between two subscriptions (default 100ms..5s): the first
	// retry comes after MinBackoff, each further one doubles the delay up to MaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Subscribe, when set, replaces the containerd client: no socket is dialed or waited for. For tests
	// and for callers that already hold an events subscriber.
	Subscribe SubscribeFunc
}

// withDefaults returns c with its zero fields set to their defaults.
func (c TaskEventsConfig) withDefaults() TaskEventsConfig {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.Hooks == nil {
		c.Hooks = NopTaskEventsHooks{}
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = defaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = defaultMaxBackoff
	}
	return c
}

// Validate checks c once the defaults are applied.
func (c TaskEventsConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Observer == nil:
		return errors.New("no observer")
	case c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff:
		return fmt.Errorf("invalid backoff bounds %s..%s: want 0 < min <= max", c.MinBackoff, c.MaxBackoff)
	}
	return nil
}

// NewTaskEvents returns a TaskEvents that subscribes to the containerd at cfg.Address and hands
// observations to cfg.Observer. The connection is made lazily by Run; Close releases it.
func NewTaskEvents(cfg TaskEventsConfig) (*TaskEvents, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("task events: %w", err)
	}
	cfg = cfg.withDefaults()
	t := &TaskEvents{
		namespace:  cfg.Namespace,
		observer:   cfg.Observer,
		hooks:      cfg.Hooks,
		subscribe:  cfg.Subscribe,
		minBackoff: cfg.MinBackoff,
		maxBackoff: cfg.MaxBackoff,
		sleep:      sleepCtx,
		now:        time.Now,
	}
	if t.subscribe != nil {
		return t, nil
	}

	path, err := dial.UnixSocketPath(cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("task events: %w", err)
	}
	t.address = path
	conn := cfg.Conn
	if conn == nil {
		if conn, err = dial.CRI(cfg.Address); err != nil {
			return nil, fmt.Errorf("task events: %w", err)
		}
		t.ownConn = conn
	}
	c, err := client.NewWithConn(conn, client.WithDefaultNamespace(t.namespace))
	if err != nil {
		return nil, fmt.Errorf("task events: failed to create containerd client for %s: %w", path, err)
	}
	filter := taskEventsFilter(t.namespace)
	t.subscribe = func(ctx context.Context) (<-chan *events.Envelope, <-chan error) {
		return c.Subscribe(ctx, filter)
	}
	t.socketExists = func() bool {
		_, err := os.Stat(path)
		return err == nil
	}
	return t, nil
}

// taskEventsFilter is the containerd events filter of every /tasks/ topic in namespace ns.
func taskEventsFilter(ns string) string {
	return fmt.Sprintf(`namespace==%q,topic~="^/tasks/"`, ns)
}

// Close releases the containerd connection. Call it after Run has returned.
func (t *TaskEvents) Close() error {
	if t.ownConn == nil {
		return nil
	}
	if err := t.ownConn.Close(); err != nil {
		return fmt.Errorf("failed to close containerd client: %w", err)
	}
	return nil
}

// Stats returns the counters.
func (t *TaskEvents) Stats() TaskEventStats {
	return TaskEventStats{
		Observed:      t.observed.Load(),
		ExecExits:     t.execExits.Load(),
		Ignored:       t.ignored.Load(),
		DecodeErrors:  t.decodeErrors.Load(),
		Subscriptions: t.subscriptions.Load(),
	}
}

// Run subscribes to containerd's task events and hands observations to the Observer until ctx is
// canceled; it then returns nil. When the subscription fails or ends (containerd restarts, its socket
// is missing), Run logs it once per outage, resubscribes with exponential backoff, and calls
// OnReconnect once the subscription is back. Run must not be called twice at the same time.
func (t *TaskEvents) Run(ctx context.Context) error {
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("component", "task-events").WithField("namespace", t.namespace))
	var (
		bo = retry.Doubling(t.minBackoff, t.maxBackoff)
		// up is the connection state last reported; nil until the first report.
		up *bool
		// outage is set while containerd is unreachable, so that one outage is logged once.
		outage bool
	)
	report := func(state bool) {
		if up == nil || *up != state {
			up = &state
			t.hooks.OnConnectionState(state)
		}
	}
	for {
		if err := t.waitSocket(ctx); err != nil {
			return nil // only ctx ends the wait, and Run returns nil then
		}

		var since time.Time
		err := t.runOnce(ctx, func() {
			if outage {
				log.G(ctx).Info("containerd events subscription restored")
			} else {
				log.G(ctx).Info("subscribed to containerd task events")
			}
			outage = false
			since = t.now()
			report(true)
			t.subscriptions.Add(1)
			t.hooks.OnReconnect()
		})
		if ctx.Err() != nil {
			return nil
		}
		if !since.IsZero() && t.now().Sub(since) >= stableAfter {
			bo.Reset()
		}
		delay := bo.NextBackOff()
		report(false)
		if !outage {
			outage = true
			log.G(ctx).WithError(err).Warnf("containerd events subscription lost, resubscribing with backoff up to %s", t.maxBackoff)
		} else {
			log.G(ctx).WithError(err).WithField("retry_in", delay).Debug("containerd events subscription failed")
		}
		if err := t.sleep(ctx, delay); err != nil {
			return nil // canceled
		}
	}
}

// runOnce runs one subscription: it returns when the subscription fails or ends (with the reason) or
// when ctx is done. established is called once the subscription is up.
func (t *TaskEvents) runOnce(ctx context.Context, established func()) error {
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	evCh, errCh := t.subscribe(subCtx)

	// The containerd client opens the stream before it returns: an error already there means the
	// subscription never started.
	select {
	case err := <-errCh:
		return subscriptionError(err)
	default:
	}
	established()

	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err, ok := <-errCh:
			if !ok {
				return io.EOF
			}
			return subscriptionError(err)
		case env := <-evCh:
			t.handle(ctx, env)
		}
	}
}

// subscriptionError names a subscription's end: an error, or nil for a stream that simply ended.
func subscriptionError(err error) error {
	if err == nil {
		return io.EOF
	}
	return err
}

// handle decodes one envelope and hands the observation on.
func (t *TaskEvents) handle(ctx context.Context, env *events.Envelope) {
	obs, v, err := decodeEnvelope(env)
	switch v {
	case verdictObserved:
		t.observed.Add(1)
		if log.GetLevel() >= log.DebugLevel {
			log.G(ctx).WithField("topic", env.Topic).WithField("id", obs.ID).WithField("phase", obs.Phase).Debug("task event")
		}
		t.observer.Observe(obs)
	case verdictExecExit:
		t.execExits.Add(1)
	case verdictIgnoredTopic:
		t.ignored.Add(1)
	case verdictError:
		t.decodeErrors.Add(1)
		entry := log.G(ctx).WithError(err)
		if env != nil {
			entry = entry.WithField("topic", env.Topic).WithField("timestamp", envelopeTime(env))
		}
		entry.Warn("failed to decode containerd event")
	}
}

// waitSocket returns once containerd's socket exists, logging once if it has to wait; it returns an
// error only when ctx is done.
func (t *TaskEvents) waitSocket(ctx context.Context) error {
	if t.socketExists == nil || t.socketExists() {
		return nil
	}
	log.G(ctx).WithField("address", t.address).Info("waiting for containerd socket")
	// A stat is cheap: poll at most every socketPollMax, so that the subscription (and the relist after
	// it) follows a restarted containerd within that time, however long it was gone.
	bo := retry.Doubling(t.minBackoff, min(t.maxBackoff, socketPollMax))
	for !t.socketExists() {
		if err := t.sleep(ctx, bo.NextBackOff()); err != nil {
			return err
		}
	}
	log.G(ctx).WithField("address", t.address).Info("containerd socket appeared")
	return nil
}

// sleepCtx waits for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// Package plugin is pleg-nri's NRI plugin: an observer that turns the runtime's NRI callbacks (Synchronize and
// the pod and container lifecycle) into pleg.Observations.
//
// The plugin never adjusts a container and never fails a lifecycle callback: each handler converts its
// arguments, hands the observations to the Observer and returns nil, in a few microseconds (NRI calls the plugins one after the
// other under one lock, and disconnects one that takes longer than its request timeout). The mapping from
// callbacks to observations, with the containerd code it is based on, is at the top of convert.go. Only a
// refusal to start fails: a configuration the daemon's check refuses, or the daemon's own (Plugin.Refuse),
// answered to Configure or, for a pre-registered plugin, to the first Synchronize (Plugin.Configure).
//
// Run keeps the plugin connected: it dials the runtime's NRI socket (or, when the runtime launched the plugin,
// uses the pre-connected socket it was given), registers, and when the connection closes (a runtime restart, a
// disconnect after a request timeout) builds a new stub and connects again, with backoff, until its context is
// cancelled.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/log"
	"github.com/containerd/nri/pkg/api"
	nrinet "github.com/containerd/nri/pkg/net"
	"github.com/containerd/nri/pkg/stub"

	"github.com/pleg-nri/pleg-nri/internal/retry"
	"github.com/pleg-nri/pleg-nri/pleg"
)

// Observer receives the observations the plugin makes (pleg.Observer). Observe is called from the NRI
// callbacks and must not block; *pleg.PLEG satisfies it.
type Observer = pleg.Observer

// Plugin is the NRI plugin. Its exported methods other than Run are the NRI handlers the stub calls.
type Plugin struct {
	cfg Config // with its defaults

	// released is closed by Release (at once without Config.Hold); releaseOnce guards it.
	released    chan struct{}
	releaseOnce sync.Once
	// configured receives the first configuration (Config.Hold), once: handedConfig is set when it
	// was.
	configured   chan Configuration
	handedConfig atomic.Bool
	// refusal (Config.Hold) holds the error the first Synchronize answers the runtime with: the first
	// configuration's refusal, or Refuse's. refuseOnce guards refusing, closed by Refuse to wake the
	// held Configure; refusalSent is closed once Synchronize answered with the refusal.
	refusal     chan error
	refuseOnce  sync.Once
	refusing    chan struct{}
	refusalSent chan struct{}
	sentOnce    sync.Once

	// startTimeout bounds a stub's Start: registration plus the runtime's Configure request.
	startTimeout time.Duration
	// dialTimeout bounds one dial of the NRI socket.
	dialTimeout time.Duration
	// socketPoll caps the delay between two dials while the NRI socket is missing or refuses
	// connections (see Run).
	socketPoll time.Duration
	// wait waits between connection attempts (sleep; tests record the delays).
	wait func(context.Context, time.Duration)

	// running is set by Run, which may be called once.
	running atomic.Bool
	// connects counts the registrations, to tell reconnects from the first connect. Only Run's goroutine
	// touches it.
	connects int
}

// New returns a plugin built from cfg. It checks cfg and fills in the defaults.
func New(cfg Config) (*Plugin, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid NRI plugin configuration: %w", err)
	}
	p := &Plugin{
		cfg:         cfg.withDefaults(),
		released:    make(chan struct{}),
		configured:  make(chan Configuration, 1),
		refusal:     make(chan error, 1),
		refusing:    make(chan struct{}),
		refusalSent: make(chan struct{}),
		// containerd waits plugin_registration_timeout (5s) for the registration, then sends Configure
		// with plugin_request_timeout (2s).
		startTimeout: 10 * time.Second,
		dialTimeout:  5 * time.Second,
		socketPoll:   defaultSocketPoll,
		wait:         sleep,
	}
	if !cfg.Hold {
		p.Release()
	} else {
		observer, synced := p.cfg.Observer, p.cfg.OnSynchronized
		p.cfg.Observer = heldObserver{p.released, observer}
		if synced != nil {
			p.cfg.OnSynchronized = func() {
				<-p.released
				synced()
			}
		}
	}
	return p, nil
}

// Release lets the callbacks held by Config.Hold go on. It may be called more than once.
func (p *Plugin) Release() { p.releaseOnce.Do(func() { close(p.released) }) }

// Configuration is the first configuration a runtime sent a plugin with Config.Hold.
type Configuration struct {
	// Data is the configuration ("" when the runtime has none for the plugin).
	Data []byte
	// Err is why Config.Configure refused it; the runtime got the same answer.
	Err error
}

// Configured delivers the first configuration the runtime sent, with Config.Hold (the channel is never
// written to without it).
func (p *Plugin) Configured() <-chan Configuration { return p.configured }

// Refuse makes the plugin refuse to start (Config.Hold, before Release): the runtime's first Synchronize
// is answered with err, so that the runtime logs why this process will not serve (containerd: "failed to
// synchronize pre-installed NRI plugin ..."; it then stops the plugin). A held Configure answers at once.
// It waits up to wait for that answer and says whether Synchronize answered with the refusal (err, or a
// refused configuration's error if that came first): the caller should then give the answer time to
// reach the runtime before it exits.
//
// NOTE: a refusal goes in the answer to Synchronize, not to Configure: the NRI stub (v0.12.5,
// stub.Start) closes the connection as soon as the Configure handler returned an error, racing with the
// stub's server writing that error to the runtime, which then often logs only "ttrpc: closed"
// (TestPreRegisteredTakeover under -race saw it). A Synchronize error is written as any answer.
func (p *Plugin) Refuse(err error, wait time.Duration) bool {
	p.refuse(err)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-p.refusalSent:
		return true
	case <-t.C:
		return false
	}
}

// refuse records err as the refusal (the first one stays) and wakes a held Configure.
func (p *Plugin) refuse(err error) {
	select {
	case p.refusal <- err:
	default:
	}
	p.refuseOnce.Do(func() { close(p.refusing) })
}

// heldObserver hands observations on once released is closed.
type heldObserver struct {
	released <-chan struct{}
	Observer
}

func (h heldObserver) Observe(o pleg.Observation) {
	<-h.released
	h.Observer.Observe(o)
}

// Run connects the plugin to the runtime and keeps it connected until ctx is cancelled, then disconnects and
// returns nil. A missing socket, a refused connection, a failed registration or a closed connection are logged
// and retried with backoff; Run returns an error only when it is called a second time. While the socket is
// missing or refuses connections it is dialed again at least every defaultSocketPoll, however long the
// runtime was away: containerd opens its NRI socket once its CRI state is recovered, so the plugin's
// resynchronization (and the relist after it) follows a restarted containerd within that time.
func (p *Plugin) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("plugin: Run called twice")
	}
	bo := retry.Doubling(p.cfg.MinBackoff, p.cfg.MaxBackoff)
	preconnected := p.takePreconnected(ctx)
	waiting := false // a "waiting for the socket" line was logged for the current outage
	for ctx.Err() == nil {
		conn := preconnected
		preconnected = nil
		if conn == nil {
			var err error
			conn, err = p.dial(ctx)
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				if !waiting {
					waiting = true
					log.G(ctx).WithError(err).WithField("socket", p.cfg.SocketPath).
						Info("NRI socket not available, waiting for the runtime")
				} else {
					log.G(ctx).WithError(err).Debug("NRI socket still not available")
				}
				p.wait(ctx, min(bo.NextBackOff(), p.socketPoll))
				continue
			}
		}
		waiting = false
		registered, err := p.session(ctx, conn)
		if ctx.Err() != nil {
			break
		}
		if registered {
			bo.Reset()
			log.G(ctx).WithError(err).Warn("NRI connection closed, reconnecting")
		} else {
			log.G(ctx).WithError(err).Warn("NRI registration failed, retrying")
		}
		p.wait(ctx, bo.NextBackOff())
	}
	return nil
}

// takePreconnected returns the connection a runtime that launched the plugin passed in NRI_PLUGIN_SOCKET, or
// nil. The file descriptor is consumed: later connections dial SocketPath.
func (p *Plugin) takePreconnected(ctx context.Context) net.Conn {
	env := os.Getenv(api.PluginSocketEnvVar)
	if env == "" {
		return nil
	}
	// The descriptor is consumed below (or unusable): its number must not be used again, by this plugin
	// or another one in the process.
	os.Unsetenv(api.PluginSocketEnvVar)
	fd, err := strconv.Atoi(env)
	if err == nil {
		var conn net.Conn
		if conn, err = nrinet.NewFdConn(fd); err == nil {
			log.G(ctx).WithField("fd", fd).Info("using the NRI connection passed by the runtime")
			return conn
		}
	}
	log.G(ctx).WithError(err).WithField(api.PluginSocketEnvVar, env).
		Error("unusable pre-connected NRI socket, dialing the NRI socket instead")
	return nil
}

// dial connects to the runtime's NRI socket.
func (p *Plugin) dial(ctx context.Context) (net.Conn, error) {
	d := net.Dialer{Timeout: p.dialTimeout}
	conn, err := d.DialContext(ctx, "unix", p.cfg.SocketPath)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("NRI socket %s not there or not listening: %w", p.cfg.SocketPath, err)
		}
		return nil, fmt.Errorf("failed to connect to NRI socket %s: %w", p.cfg.SocketPath, err)
	}
	return conn, nil
}

// session runs one stub over conn: it registers, then waits for the connection to close or ctx to be
// cancelled, and tears the stub down. registered says whether the registration went through; err says why
// the session ended, when known.
func (p *Plugin) session(ctx context.Context, conn net.Conn) (registered bool, err error) {
	wc := newWatchedConn(conn)
	closed := make(chan struct{})
	var closeOnce sync.Once
	onClose := func() { closeOnce.Do(func() { close(closed) }) }

	// This connection's Synchronize answer (Metrics.Synchronized): set by the stub's Synchronize
	// through sessionHandlers, unset when the session ends, whichever way.
	synced := &connSync{metrics: p.cfg.Metrics}
	defer synced.end()

	st, err := stub.New(sessionHandlers{p, synced}, p.stubOptions(wc, onClose)...)
	if err != nil {
		conn.Close()
		return false, fmt.Errorf("failed to create NRI stub: %w", err)
	}

	startErr := make(chan error, 1)
	go func() { startErr <- st.Start(ctx) }()
	timeout := time.NewTimer(p.startTimeout)
	defer timeout.Stop()
	select {
	case err = <-startErr:
	case <-wc.dead:
		err = p.unstick(ctx, conn, st, startErr, "connection closed before the runtime configured the plugin")
	case <-ctx.Done():
		err = p.unstick(ctx, conn, st, startErr, "shutting down")
	case <-timeout.C:
		err = p.unstick(ctx, conn, st, startErr, "the runtime did not configure the plugin in time")
	}
	if err != nil {
		conn.Close()
		return false, err
	}

	p.connects++
	if p.connects > 1 {
		p.cfg.Metrics.Reconnected()
	}
	p.setConnected(true)
	log.G(ctx).WithField("plugin", p.cfg.PluginIdx+"-"+p.cfg.PluginName).Info("NRI plugin registered")

	select {
	case <-closed:
		err = errors.New("connection closed by the runtime")
	case <-wc.dead:
		err = fmt.Errorf("connection lost: %w", wc.err())
	case <-ctx.Done():
	}
	st.Stop()
	// The stub calls onClose once its client is down: wait for it so nothing outlives the session.
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		log.G(ctx).Warn("NRI stub did not report its connection closed")
	}
	synced.end()
	p.setConnected(false)
	return true, err
}

// unstick ends a stub Start that has not returned: it closes the connection, which fails a registration in
// progress at once. A Start that is past the registration waits for the runtime's Configure request with no
// timeout (stub.Start reads its configuration channel holding the stub's lock), so a runtime that goes away
// between the two leaves it blocked for good: that stub is abandoned (one goroutine and the stub's memory) and
// the next attempt uses a new one.
func (p *Plugin) unstick(ctx context.Context, conn net.Conn, st stub.Stub, startErr <-chan error, why string) error {
	conn.Close()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case err := <-startErr:
		if err == nil {
			st.Stop()
		}
	case <-t.C:
		log.G(ctx).WithField("reason", why).Warn("NRI stub stuck waiting for the runtime's Configure, abandoning it")
	}
	return errors.New(why)
}

// stubOptions are the options of a new stub over conn.
func (p *Plugin) stubOptions(conn net.Conn, onClose func()) []stub.Option {
	opts := []stub.Option{
		stub.WithConnection(conn),
		stub.WithOnClose(onClose),
		stub.WithLogger(stubLogger{}),
	}
	// A runtime that launched the plugin named it in the environment, which the stub reads; the stub refuses
	// a second index.
	if os.Getenv(api.PluginIdxEnvVar) == "" {
		opts = append(opts, stub.WithPluginIdx(p.cfg.PluginIdx))
	}
	if os.Getenv(api.PluginNameEnvVar) == "" {
		opts = append(opts, stub.WithPluginName(p.cfg.PluginName))
	}
	return opts
}

// The order of a connection's events, from NRI v0.12.5's pkg/stub/stub.go and pkg/adaptation
// (adaptation.go, acceptPluginConnections; plugin.go, plugin.start):
//
//  1. stub.Start dials nothing (session hands it the connection), starts its ttrpc server and calls the
//     runtime's RegisterPlugin (stub.register).
//  2. The runtime answers, then sends Configure (plugin.start -> plugin.configure). The stub's Configure
//     calls Plugin.Configure (held until Release with Config.Hold) and, in a deferred send on cfgErrC,
//     lets stub.Start return: before the Configure answer is even written back.
//  3. session sees Start return and reports ConnectionState(true) ("registered").
//  4. Once it has the Configure answer, the runtime (acceptPluginConnections: requestPluginSync, then
//     syncFn(ctx, p.synchronize)) sends Synchronize with every pod and container, possibly split in
//     several requests (More); the stub collects them and calls the handler once (deliverSync).
//     containerd's syncFn holds the node's RunPodSandbox, CreateContainer, StartContainer... (NRI's
//     BlockPluginSync) until the runtime has the plugin's answer (finishedPluginSync).
//  5. When the connection closes, the stub's ttrpc client calls connClosed, then our onClose; session
//     then reports ConnectionState(false).
//
// So ConnectionState(true) (3) usually comes before Synchronize (4), but nothing orders them: 3 runs on
// session's goroutine once Start returned, 4 on the stub's server as soon as the runtime has the Configure
// answer, and the Synchronize handler can return before 3 ran. Hence the connection's Synchronize answer
// is its own state (connSync), set whatever ConnectionState said, and unset only at the session's end.

// sessionHandlers are the NRI handlers of one connection: the Plugin's, with a Synchronize that records
// its answer on that connection's connSync.
type sessionHandlers struct {
	*Plugin
	synced *connSync
}

// Synchronize is Plugin.Synchronize; once it has done its work (observations, OnSynchronized, which
// with Hold waits for Release), a successful answer marks the connection synchronized. That is the last
// point the stub lets the plugin see: the stub's deliverSync returns the answer to its ttrpc server, which
// writes it to the runtime, and containerd releases the pod starts it held for the sync when it receives
// it. A refusal (an error) leaves the connection unsynchronized: the runtime drops the plugin.
func (h sessionHandlers) Synchronize(ctx context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	update, err := h.Plugin.Synchronize(ctx, pods, ctrs)
	if err == nil {
		h.synced.done()
	}
	return update, err
}

// connSync is whether the plugin answered one connection's Synchronize, reported to Metrics.Synchronized.
// A Synchronize that returns after the session ended (its handler outlived the stub's server) reports
// nothing.
type connSync struct {
	metrics Metrics
	mu      sync.Mutex // guards the fields below
	synced  bool
	ended   bool
}

// done marks the connection synchronized, unless it ended.
func (s *connSync) done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended && !s.synced {
		s.synced = true
		s.metrics.Synchronized(true)
	}
}

// end marks the connection gone: no longer synchronized. It may be called more than once.
func (s *connSync) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	if s.synced {
		s.synced = false
		s.metrics.Synchronized(false)
	}
}

// setConnected reports a connection state change.
func (p *Plugin) setConnected(up bool) {
	p.cfg.Metrics.ConnectionState(up)
	if p.cfg.OnConnectionState != nil {
		p.cfg.OnConnectionState(up)
	}
}

// sleep waits for d or ctx, whichever ends first.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// watchedConn is a net.Conn that reports its first read error: the runtime's end closing.
type watchedConn struct {
	net.Conn
	dead    chan struct{}
	once    sync.Once
	mu      sync.Mutex // guards readErr
	readErr error
}

func newWatchedConn(c net.Conn) *watchedConn {
	return &watchedConn{Conn: c, dead: make(chan struct{})}
}

// Read reads from the connection and closes dead on the first error.
func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.once.Do(func() {
			c.mu.Lock()
			c.readErr = err
			c.mu.Unlock()
			close(c.dead)
		})
	}
	return n, err
}

// err returns the read error that closed dead.
func (c *watchedConn) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.readErr == nil {
		return io.EOF
	}
	return c.readErr
}

package main

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
	sdnotify "github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/runningcore"
	"github.com/pleg-nri/pleg-nri/eventbridge/containerd"
	"github.com/pleg-nri/pleg-nri/eventbridge/corelink"
	"github.com/pleg-nri/pleg-nri/eventbridge/front"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/promutil"
	"github.com/pleg-nri/pleg-nri/pleg"
	"github.com/pleg-nri/pleg-nri/plugin"
)

// preRegisteredConfigWait is how long a plugin launched by containerd waits for its Configure call
// before it starts with the configuration it has.
const preRegisteredConfigWait = 5 * time.Second

// preRegisteredRefusalWait is how long a pre-registered plugin that refused to start (plugin.Refuse)
// lingers before it exits, for the answer to reach containerd (which then stops it).
const preRegisteredRefusalWait = time.Second

// errLeftToRunningCore is what a pre-registered instance that leaves the work to the running core
// (takeover.go) answers containerd, which logs it.
var errLeftToRunningCore = errors.New("a pleg-nri core of the same binary and configuration already serves the run directory: leaving it the work")

// coreStopTimeout is how long the core's event socket lets forwarded calls finish when it stops.
const coreStopTimeout = 5 * time.Second

// runDaemon runs pleg-nri until ctx is done: the core, the NRI plugin, the containerd event
// subscription, the core's event socket and the metrics server; and it makes sure a front serves the
// kubelet's CRI endpoint (ensureFront), which it leaves running when it stops. Each resource is
// released by a defer made right after it; the long-running parts run as components.
func runDaemon(ctx context.Context, cfg config.Config, configPath string) error {
	if err := log.SetLevel(cfg.LogLevel); err != nil {
		return fmt.Errorf("config key \"log-level\": %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	comps := &components{cancel: cancel}
	reg := prometheus.NewRegistry()
	promutil.RegisterProcessCollectors(reg, "core")
	upstreams := promutil.NewUpstreams(reg, "nri", "events", "cri")
	m, ready := pleg.NewPrometheusMetrics(reg), &readiness{}

	// A pre-registered plugin gets its configuration through NRI's Configure, before anything else
	// starts; an external one has it from its flags and --config file already. Either way the core is
	// built from the final configuration: the pre-registered plugin's callbacks wait for it (Hold).
	preRegistered := os.Getenv("NRI_PLUGIN_SOCKET") != ""
	var core *pleg.PLEG // set before the plugin's callbacks run (Release, or nri.Run)
	nri, err := newPlugin(cfg, preRegistered, func() *pleg.PLEG { return core }, nriHooks{plugin.NewPrometheusMetrics(reg, upstreams), ready})
	if err != nil {
		return err
	}
	if preRegistered {
		comps.run(ctx, "NRI plugin", nri.Run)
		var serve bool
		if cfg, serve, err = configurePreRegistered(ctx, cfg, nri.Configured(), func(ctx context.Context, cfg config.Config) (bool, error) {
			return runningcore.TakeOver(ctx, cfg, version)
		}); !serve {
			// A pre-registered plugin's output goes nowhere: containerd's log is where an error is
			// seen, in the answer to its Synchronize. containerd stops the plugin once it has it;
			// exiting at once could close the connection before the answer is written.
			why := err
			if err == nil && ctx.Err() == nil {
				why = errLeftToRunningCore // not this process's failure: it exits 0
			}
			if why != nil && nri.Refuse(why, time.Second) {
				time.Sleep(preRegisteredRefusalWait)
			}
			return err
		}
	}

	// A core started by hand leaves a running one alone (a pre-registered instance decided above
	// whether to take the running core over).
	if !preRegistered {
		if err := runningcore.RefuseSecond(cfg.RunDirectory()); err != nil {
			return err
		}
	}

	// One connection per socket: containerd serves its CRI, events and tasks on one.
	var conns dial.Conns
	defer conns.Close()
	core, closeCore, err := newCore(ctx, cfg, &conns, coreHooks{m, ready})
	if err != nil {
		return err
	}
	defer closeCore()
	nri.Release()
	if !preRegistered {
		comps.run(ctx, "NRI plugin", nri.Run)
	}

	// The kubelet's endpoint belongs to the front, which outlives this process (package front); the core
	// serves its events on its own socket, where the front subscribes (package corelink).
	backend, err := conns.Get(cfg.RuntimeEndpoint)
	if err != nil {
		return fmt.Errorf("config key \"runtime-endpoint\": %w", err)
	}
	if err := front.Ensure(ctx, frontConfig(cfg), preRegistered); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return fmt.Errorf("config key \"listen\": %w", err)
	}
	// A front that goes away while the core runs is replaced at once, on the same socket.
	supervisor := front.NewSupervisor(frontConfig(cfg), preRegistered, frontHooks{front.NewSupervisorMetrics(reg), ready, core})
	comps.run(ctx, "front supervisor", supervisor.Run)
	// What serves the run directory, for the next pre-registered instance (takeover.go) and `pleg-nri
	// version`: written before the core's socket serves, so that whoever finds the socket finds it too.
	if exe, err := os.Executable(); err == nil {
		removeInfo, err := runningcore.WriteInfo(cfg.RunDirectory(), runningcore.Info{PID: os.Getpid(), Version: version, Executable: exe, Config: cfg})
		if err != nil {
			log.G(ctx).WithError(err).Warn("failed to write " + runningcore.InfoName)
		} else {
			defer removeInfo()
		}
	}

	// The runtime's connection, for /readyz (the "cri" upstream).
	comps.run(ctx, "runtime connection", func(ctx context.Context) error {
		kubelet.WatchConnection(ctx, backend, func(up bool) { upstreams.Set("cri", up, false) })
		return nil
	})
	srv, stopSocket, err := serveCoreEvents(ctx, cfg, core, coreLinkMetrics{core: m,
		refused: kubelet.NewRefusedPeersMetric(reg).WithLabelValues(kubelet.SocketCore)})
	if err != nil {
		return err
	}
	defer stopSocket()
	ctrd, err := conns.Get(cfg.ContainerdAddress)
	if err != nil {
		return fmt.Errorf("config key \"containerd-address\": %w", err)
	}
	events, err := containerd.NewTaskEvents(containerd.TaskEventsConfig{Address: cfg.ContainerdAddress, Conn: ctrd,
		Namespace: cfg.ContainerdNamespace, Observer: core, Hooks: taskHooks{upstreams: upstreams, ready: ready, relist: core.Resync}})
	if err != nil {
		return fmt.Errorf("config key \"containerd-address\": %w", err)
	}
	defer events.Close()

	// The core runs until the event socket's streams have ended, so that its last checkpoint records
	// every event the front received, and only those: after a SIGTERM the next core sends nothing twice
	// and loses nothing.
	coreCtx, stopCore := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCore()
	comps.run(coreCtx, "core", core.Run)
	comps.run(ctx, "containerd events", events.Run)
	comps.run(ctx, "CRI endpoint", serverFailure(srv))

	if cfg.MetricsAddress != "" {
		runningcore.RegisterBuildInfo(reg, cfg.RunDirectory(), version)
		// The front's metrics (the kubelet's endpoint: forwarded calls, streams, held reads) with the core's.
		stopMetrics, err := promutil.Serve(ctx, cfg.MetricsAddress, prometheus.Gatherers{reg, &front.Gatherer{RunDir: cfg.RunDirectory()}}, ready.check)
		if err != nil {
			return fmt.Errorf("config key \"metrics-address\": %w", err)
		}
		defer stopMetrics()
	}
	// Until the supervisor holds the front's socket, a front killed takes the endpoint with it: the
	// daemon serves once it does (bounded: a front that never shares is the supervisor's to replace).
	select {
	case <-supervisor.Watching():
	case <-ctx.Done():
	case <-time.After(frontWatchWait):
		log.G(ctx).WithField("waited", frontWatchWait).Warn("the front supervisor does not hold the front's socket yet: a front killed now takes the endpoint away until the next one listens")
	}
	log.G(ctx).WithField("listen", cfg.Listen).WithField("core", srv.Addr().String()).WithField("runtime-endpoint", cfg.RuntimeEndpoint).
		WithField("config", configPath).WithField("version", version).Info(servingLog)
	// A host service of Type=notify is started (and the kubelet ordered after it may start) now. A
	// pre-registered plugin inherits containerd's NOTIFY_SOCKET, which is containerd's unit's, not its own.
	if !preRegistered {
		notifySystemd(ctx, sdnotify.SdNotifyReady)
	}

	<-ctx.Done() // stopped, or a component returned
	if !preRegistered {
		notifySystemd(ctx, sdnotify.SdNotifyStopping)
	}
	// The event socket stops before the core (see coreCtx); on an early return, in its defer.
	stopSocket()
	stopCore()
	if err := comps.wait(); err != nil {
		return err
	}
	log.G(ctx).Info("pleg-nri stopped")
	return nil
}

// components runs the daemon's long-running parts, each on a goroutine of its own. The first to
// return, with an error or without, stops the daemon (cancel); wait returns the first error that a
// component returned while its context was live, prefixed with its name (one returned after is how it
// stopped).
//
// NOTE: runDaemon waits for them only once it served. An early return (a startup error, or a
// pre-registered process that leaves the work to another core) does not: the NRI plugin may then be in
// a callback waiting for a core that will never be built, and the process exits anyway.
type components struct {
	g      errgroup.Group
	cancel context.CancelFunc
}

// run starts fn on ctx as the component called name.
func (c *components) run(ctx context.Context, name string, fn func(context.Context) error) {
	c.g.Go(func() error {
		defer c.cancel()
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

// wait returns once every component has returned, with the first failure.
func (c *components) wait() error { return c.g.Wait() }

// newPlugin builds the NRI plugin, feeding the core core() returns: set before the callbacks run. A
// pre-registered plugin runs before the core: its callbacks wait for Release (plugin.Config.Hold), and
// Configure's first configuration goes to the daemon; a later one only gets a warning when it changes
// keys that need a restart.
func newPlugin(cfg config.Config, preRegistered bool, core func() *pleg.PLEG, m plugin.Metrics) (*plugin.Plugin, error) {
	var configured atomic.Bool
	return plugin.New(plugin.Config{PluginName: cfg.PluginName, PluginIdx: cfg.PluginIdx, SocketPath: cfg.NRISocket,
		Observer:       pleg.ObserverFunc(func(o pleg.Observation) { core().Observe(o) }),
		OnSynchronized: func() { core().Resync() },
		Metrics:        m,
		Hold:           preRegistered,
		Configure: func(ctx context.Context, data []byte) error {
			newCfg, err := config.Parse(data, cfg)
			if err != nil {
				return err
			}
			if configured.Swap(true) {
				if changed := config.ChangedKeys(cfg, newCfg); len(changed) > 0 {
					log.G(ctx).WithField("keys", changed).Warn("configuration from NRI changed keys that need a restart of pleg-nri to take effect")
				}
			}
			return nil
		},
	})
}

// configurePreRegistered is the start of a plugin launched by containerd, whose NRI plugin already
// runs: it waits up to preRegisteredConfigWait for the configuration containerd sends through NRI's
// Configure and returns cfg with it. A configuration the plugin refused is this process's error: it
// exits with it (containerd logs the same refusal, and stops the plugin). Then takeOver (runningcore.TakeOver)
// deals with a core launched by a previous containerd that still serves the run directory: containerd
// (2.4) does not stop its pre-registered plugins, and such a core reconnects through the NRI socket.
// serve is false when this process has nothing to do: ctx ended, or the old core is the same binary
// with the same configuration and goes on.
func configurePreRegistered(ctx context.Context, cfg config.Config, configured <-chan plugin.Configuration,
	takeOver func(context.Context, config.Config) (serve bool, err error)) (_ config.Config, serve bool, err error) {
	select {
	case c := <-configured:
		if c.Err != nil {
			return cfg, false, fmt.Errorf("configuration from NRI (containerd's NRI plugin config, /etc/nri/conf.d): %w", c.Err)
		}
		if cfg, err = config.Parse(c.Data, cfg); err != nil {
			return cfg, false, fmt.Errorf("configuration from NRI (containerd's NRI plugin config, /etc/nri/conf.d): %w", err)
		}
		log.G(ctx).Info("configured by containerd through NRI")
	case <-time.After(preRegisteredConfigWait):
		log.G(ctx).Warn("no configuration from NRI: starting with the defaults and flags")
	case <-ctx.Done():
		return cfg, false, nil
	}
	if serve, err = takeOver(ctx, cfg); err != nil {
		return cfg, false, fmt.Errorf("config key \"run-dir\": %w", err)
	}
	return cfg, serve, nil
}

// newCore builds the core from cfg, with the CRI client and the OOM checker it reads containerd with
// over conns, after it locked the state directory; closeCore unlocks it.
func newCore(ctx context.Context, cfg config.Config, conns *dial.Conns, m coreHooks) (core *pleg.PLEG, closeCore func(), err error) {
	conn, err := conns.Get(cfg.RuntimeEndpoint)
	if err != nil {
		return nil, nil, fmt.Errorf("config key \"runtime-endpoint\": %w", err)
	}
	cri := containerd.NewCRIClient(conn)
	// containerd's own check of an exit with status 137 for an OOM kill, so the first STOPPED says it.
	ctrd, err := conns.Get(cfg.ContainerdAddress)
	if err != nil {
		return nil, nil, fmt.Errorf("config key \"containerd-address\": %w", err)
	}
	oom, err := containerd.NewOOMChecker(ctrd, cfg.ContainerdNamespace)
	if err != nil {
		return nil, nil, fmt.Errorf("config key \"containerd-address\": %w", err)
	}
	stall := time.Duration(cfg.SubscriberStallTimeout)
	if stall == 0 {
		stall = -1 // the key's 0 disables it; pleg's 0 is its default
	}
	pcfg := pleg.Config{Status: cri, Lister: cri, OOM: oom, Metrics: m, SubscriberQueue: cfg.SubscriberQueue, Reconnect: cri.ResetConnectBackoff,
		RelistPeriod: time.Duration(cfg.RelistPeriod), StartupReplay: time.Duration(cfg.StartupReplay), CacheTick: time.Duration(cfg.CacheTick),
		CheckpointInterval: time.Duration(cfg.CheckpointInterval), SubscriberStallTimeout: stall}
	unlock := func() {}
	if cfg.StateDir != "" {
		if unlock, err = pleg.LockStateDir(ctx, cfg.StateDir, pleg.DefaultStateLockWait); err != nil {
			return nil, nil, fmt.Errorf("config key \"state-dir\": %w", err)
		}
		defer func() {
			if err != nil {
				unlock()
			}
		}()
		// The checkpoint belongs to one runtime: one of another endpoint is ignored.
		pcfg.CheckpointPath, pcfg.CheckpointScope = filepath.Join(cfg.StateDir, "checkpoint"), cfg.RuntimeEndpoint
	} else {
		log.G(ctx).Warn("no state-dir: a restart of pleg-nri emits CREATED and STARTED again for every sandbox and container")
	}
	if core, err = pleg.New(pcfg); err != nil {
		return nil, nil, fmt.Errorf("config key \"state-dir\": %w", err)
	}
	// The lock goes last: after the core's last checkpoint (core.Run has returned).
	return core, unlock, nil
}

// serveCoreEvents serves the core's side of the core link (corelink.Core) on its socket in the run
// directory, where the front subscribes: the core's events, and the front's refresh requests
// (refresh-after-stop). It forwards nothing: the kubelet's endpoint is the front's. stop stops it, the
// first time it is called.
func serveCoreEvents(ctx context.Context, cfg config.Config, core *pleg.PLEG, m coreLinkMetrics) (srv *kubelet.Server, stop func(), err error) {
	link, err := corelink.NewCore(corelink.CoreConfig{Events: eventSource{core}, Metrics: m, RefreshStopped: core.RefreshStopped})
	if err != nil {
		return nil, nil, err
	}
	if srv, err = kubelet.NewServer("unix://"+filepath.Join(cfg.RunDirectory(), front.CoreSocketName), link); err != nil {
		return nil, nil, fmt.Errorf("config key \"run-dir\": %w", err)
	}
	l, err := kubelet.Listen(ctx, "unix://"+filepath.Join(cfg.RunDirectory(), front.CoreSocketName))
	if err != nil {
		return nil, nil, fmt.Errorf("config key \"run-dir\": core event socket: %w", err)
	}
	if m.refused != nil {
		kubelet.OnRefusedPeer(l, m.refused.Inc)
	}
	if err := srv.StartOn(ctx, l); err != nil {
		_ = l.Close()
		return nil, nil, fmt.Errorf("config key \"run-dir\": core event socket: %w", err)
	}
	// The core first stops counting what its streams do not send as received (see pleg.PLEG.Stopping).
	return srv, sync.OnceFunc(func() { core.Stopping(); srv.StopWithin(ctx, coreStopTimeout) }), nil
}

// serverFailure is a component that returns srv's serving error, or nil once ctx is done.
func serverFailure(srv *kubelet.Server) func(context.Context) error {
	return func(ctx context.Context) error {
		select {
		case err := <-srv.Err():
			return err
		case <-ctx.Done():
			return nil
		}
	}
}

// frontWatchWait bounds the daemon's wait, before it says it serves, for the front supervisor to hold
// the front's listening socket (front.Supervisor.Watching).
const frontWatchWait = 10 * time.Second

// servingLog is logged once the daemon serves: every listener is open (the metrics server's too).
const servingLog = "pleg-nri is serving"

// eventSource adapts the core's fan-out to the CRI endpoint's EventSource.
type eventSource struct{ core *pleg.PLEG }

func (s eventSource) Subscribe() kubelet.EventStream { return eventStream{s.core.Subscribe()} }

type eventStream struct{ sub *pleg.Subscription }

func (s eventStream) Next(ctx context.Context) (*runtimeapi.ContainerEventResponse, time.Time, error) {
	ev, err := s.sub.Next(ctx)
	return ev.Response, ev.SourceTime, err
}

// NextEncoded hands out the event's encoding, made once and shared by every stream.
func (s eventStream) NextEncoded(ctx context.Context) ([]byte, time.Time, error) {
	ev, err := s.sub.Next(ctx)
	if err != nil {
		return nil, time.Time{}, err
	}
	b, err := ev.Marshaled()
	if err != nil {
		return nil, ev.SourceTime, status.Errorf(codes.Internal, "failed to encode event: %v", err)
	}
	return b, ev.SourceTime, nil
}

func (s eventStream) Close() { s.sub.Close() }

var (
	_ pleg.Observer              = (*pleg.PLEG)(nil)
	_ kubelet.EventSource        = eventSource{}
	_ kubelet.EncodedEventStream = eventStream{}
)

// notifySystemd tells systemd the daemon's state (READY=1, STOPPING=1) when it runs as a unit of
// Type=notify (NOTIFY_SOCKET is set); elsewhere it does nothing.
func notifySystemd(ctx context.Context, state string) {
	if _, err := sdnotify.SdNotify(false, state); err != nil {
		log.G(ctx).WithError(err).WithField("state", state).Warn("failed to notify systemd")
	}
}

package front

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/containerd/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-nri/pleg-nri/eventbridge/corelink"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/fresh"
	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/promutil"
)

// Run runs the front until ctx is done, it is asked to stop, or it handed its socket over.
func Run(ctx context.Context, cfg Config) error {
	// A front outlives whatever started it, and its stderr (the journal, a pipe) may go away meanwhile:
	// a write to a broken pipe must not kill it.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("process", "front"))

	// The listeners: the kubelet's and the control socket, opened here, taken over from a running
	// front, or (the kubelet's) inherited from the core that respawned this front.
	var lis, ctl net.Listener
	var predecessor *net.UnixConn
	var err error
	switch {
	case cfg.Takeover:
		if lis, ctl, predecessor, err = takeOver(ctx, cfg); err != nil {
			return err
		}
		defer predecessor.Close()
	default:
		if cfg.ListenFD > 0 {
			lis, err = inheritedListener(ctx, cfg)
		} else {
			lis, err = (kubelet.ListenConfig{AllowTCP: cfg.AllowTCPListen}).Listen(ctx, cfg.Listen)
		}
		if err != nil {
			return err
		}
		if ctl, err = kubelet.Listen(ctx, filepath.Join(cfg.RunDir, ControlSocketName)); err != nil {
			if cfg.ListenFD > 0 {
				kubelet.KeepSocketFile(lis) // the core keeps it for the next front
			}
			_ = lis.Close()
			return fmt.Errorf("control socket: %w", err)
		}
	}

	// Until the server serves on them, a failure closes the listeners: a socket taken over stays (the
	// previous front, told nothing, serves on), and so does an inherited one (the core keeps it); one
	// opened here is removed.
	serving := false
	defer func() {
		if serving {
			return
		}
		if cfg.Takeover || cfg.ListenFD > 0 {
			kubelet.KeepSocketFile(lis)
		}
		if cfg.Takeover {
			kubelet.KeepSocketFile(ctl)
		}
		_, _ = lis.Close(), ctl.Close()
	}()
	backend, err := dial.CRI(cfg.RuntimeEndpoint)
	if err != nil {
		return fmt.Errorf("--runtime-endpoint: %w", err)
	}
	defer backend.Close()
	reg := prometheus.NewRegistry()
	// The front's connection to the runtime is "front_cri"; the core's is "cri".
	em := kubelet.NewPrometheusMetrics(reg, promutil.NewUpstreams(reg, "front_cri"), "front_cri")
	promutil.RegisterProcessCollectors(reg, "front")
	refused := kubelet.NewRefusedPeersMetric(reg)
	kubelet.OnRefusedPeer(lis, refused.WithLabelValues(kubelet.SocketCRI).Inc)
	kubelet.OnRefusedPeer(ctl, refused.WithLabelValues(kubelet.SocketControl).Inc)
	relay, err := corelink.DialRelay(corelink.RelayConfig{
		Endpoint:     "unix://" + filepath.Join(cfg.RunDir, CoreSocketName),
		Gate:         corelink.NewRuntimeGate(ctx, backend),
		Resubscribed: em.Resubscribed,
		CoreGrace:    cfg.CoreGrace,
		CoreGone:     em.CoreGone,
	})
	if err != nil {
		return err
	}
	defer relay.Close()
	// The hooks' own calls and waits end when the front does.
	hooksDone := make(chan struct{})
	defer close(hooksDone)
	hooks, err := fresh.Hooks(fresh.Config{Runtime: backend, Metrics: em, ReadFreshness: fresh.ReadFreshness(cfg.ReadFreshness),
		Refresh: relay.RefreshStopped, RefreshAfterStop: cfg.RefreshAfterStop, Done: hooksDone})
	if err != nil {
		return fmt.Errorf("--read-freshness: %w", err)
	}
	proxy, err := kubelet.NewProxy(kubelet.ProxyConfig{Backend: backend, Events: relay, Metrics: em, Hooks: hooks})
	if err != nil {
		return fmt.Errorf("the kubelet's endpoint: %w", err)
	}
	srv, err := kubelet.NewServer(cfg.Listen, proxy)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	if err := srv.StartOn(ctx, lis); err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	serving = true
	if predecessor != nil {
		// The predecessor stops accepting once it reads this; until then both accept on the socket.
		if _, err := predecessor.Write([]byte("serving\n")); err != nil {
			log.G(ctx).WithError(err).Warn("could not tell the previous front that this one serves")
		}
	}

	if cfg.LogFile != "" {
		// Bounded (maxLogSize, rotated once): the run directory is usually a tmpfs.
		if lf, err := openLogFile(cfg.LogFile, maxLogSize, 1, 2); err != nil {
			log.G(ctx).WithError(err).Warn("cannot log to the log file: logging to stderr")
		} else {
			log.G(ctx).Logger.SetOutput(lf)
		}
	}
	f := &front{cfg: cfg, lis: lis, ctl: ctl, reg: reg, stop: make(chan struct{}), handedOver: make(chan struct{})}
	go f.serveControl(ctx)
	log.G(ctx).WithField("listen", cfg.Listen).WithField("version", cfg.Version).WithField("pid", os.Getpid()).
		Info("pleg-nri front is serving")

	var serveErr error
	select {
	case <-ctx.Done():
	case <-f.stop:
	case <-f.handedOver:
	case serveErr = <-srv.Err():
	}
	f.closeControl()
	srv.StopWithin(ctx, StopTimeout)
	if serveErr != nil {
		return fmt.Errorf("CRI endpoint: %w", serveErr)
	}
	log.G(ctx).Info("pleg-nri front stopped")
	return nil
}

// inheritedListener is the listening socket for cfg.Listen that the core handed this front as
// descriptor cfg.ListenFD (the socket whose file is at cfg.Listen's path).
func inheritedListener(ctx context.Context, cfg Config) (net.Listener, error) {
	f := os.NewFile(uintptr(cfg.ListenFD), "listen")
	if f == nil {
		return nil, fmt.Errorf("--listen-fd %d: not a descriptor", cfg.ListenFD)
	}
	defer f.Close()
	path := ""
	if network, address, err := dial.ParseEndpoint(cfg.Listen); err == nil && network == "unix" {
		path = address
	}
	l, err := kubelet.FileListener(ctx, f, path)
	if err != nil {
		return nil, fmt.Errorf("--listen-fd %d: %w", cfg.ListenFD, err)
	}
	return l, nil
}

package front

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/log"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/internal/retry"
)

// Supervisor keeps a front serving the kubelet's endpoint for as long as the core runs. The node's
// whole runtime goes through the front, so a front that dies (SIGKILL, an OOM kill, a panic outside a
// handler, `pleg-nri stop-front`) must not take the endpoint away:
//
//   - The supervisor asks the running front to "share" its listening socket: the front sends it (a
//     descriptor of the same socket) and holds that control connection open while it serves. The
//     connection's end is how the supervisor learns at once that the front is gone.
//   - The socket stays open in the core while no front runs: the kernel keeps accepting connections
//     into its backlog, so the kubelet's calls made meanwhile wait instead of failing, and no socket
//     file disappears.
//   - The supervisor spawns a new front on that socket (--listen-fd) and watches it in turn. If starts
//     keep failing for holdWhileFailing, it lets the socket go, so calls fail with UNAVAILABLE rather
//     than wait on a socket that no front may serve, and tries again (a new front then opens a new
//     socket), backing off.
//
// A front replaced on purpose (a takeover by a newer one) is not respawned: a front answers again
// when the old one's connection ends, and the supervisor watches that one.
type Supervisor struct {
	cfg           Config
	preRegistered bool
	hooks         SupervisorHooks
	// up says whether a front is watched (it answered and shares its socket).
	up atomic.Bool
	// watching is closed once the supervisor first holds a front's listening socket (watched).
	watching     chan struct{}
	watchingOnce sync.Once
	// probeInterval, probeTimeout and hangTimeout are the checks that a watched front still answers
	// (liveness.go), fields for tests.
	probeInterval, probeTimeout, hangTimeout time.Duration
}

// SupervisorHooks are told what the supervisor sees, for the core's readiness and metrics.
type SupervisorHooks interface {
	// FrontUp is called with true when a front serves (the supervisor watches it), false when none
	// does.
	FrontUp(up bool)
	// FrontGone is called when the front the supervisor watched went away: its event streams ended
	// with it, and their clients (the kubelet) subscribe again through the next front.
	FrontGone()
	// FrontRespawned is called each time the supervisor starts a front in place of one that went
	// away (before the start, which may fail).
	FrontRespawned()
	// FrontHung is called when the supervisor kills a front that no longer answers (liveness.go).
	FrontHung()
}

// Supervisor's backoff between failed attempts to start a front, and how long it waits before it
// replaces a front that went away, in case the core was told to stop at the same moment.
const (
	stopRace        = 20 * time.Millisecond
	respawnRetryMin = 100 * time.Millisecond
	respawnRetryMax = 5 * time.Second
	// holdWhileFailing is how long the kept socket stays open (calls wait in its backlog) while fronts
	// fail to start: one that was killed while starting is tried again at once on the same socket.
	holdWhileFailing = 2 * time.Second
)

// NewSupervisor returns the supervisor of the front that serves cfg.Listen (see Ensure, which starts
// it the first time). preRegistered is as for Ensure; hooks may be nil.
func NewSupervisor(cfg Config, preRegistered bool, hooks SupervisorHooks) *Supervisor {
	cfg.Takeover, cfg.ListenFD = false, 0
	return &Supervisor{cfg: cfg, preRegistered: preRegistered, hooks: hooks, watching: make(chan struct{}),
		probeInterval: probeInterval, probeTimeout: probeTimeout, hangTimeout: hangTimeout}
}

// Watching is closed once the supervisor holds the listening socket of the front it watches: from
// then on a front's SIGKILL leaves the endpoint open (calls wait in its backlog for the next front).
// Before it, a front killed takes its socket with it, and calls are refused until the next front
// listens. The daemon says it serves only once it is closed.
func (s *Supervisor) Watching() <-chan struct{} { return s.watching }

// Up says whether a front serves the endpoint, as far as the supervisor knows (for /readyz).
func (s *Supervisor) Up() bool { return s.up.Load() }

func (s *Supervisor) setUp(up bool) {
	if s.up.Swap(up) != up && s.hooks != nil {
		s.hooks.FrontUp(up)
	}
}

// Run watches the front until ctx is done, and starts a new one whenever none serves. It returns nil
// once ctx is done; the front it watches runs on.
func (s *Supervisor) Run(ctx context.Context) error {
	var held *os.File // the kubelet's listening socket, as the last front shared it
	defer func() {
		if held != nil {
			_ = held.Close()
		}
	}()
	// failingSince is when the starts began to fail (zero while they do not).
	var failingSince time.Time
	retry := retry.Doubling(respawnRetryMin, respawnRetryMax)
	for ctx.Err() == nil {
		conn, info, lf, err := shareListener(s.cfg.RunDir)
		if err == nil {
			if held != nil {
				_ = held.Close()
			}
			held = lf
			retry.Reset()
			s.setUp(true)
			s.watchingOnce.Do(func() { close(s.watching) })
			log.G(ctx).WithField("pid", info.PID).WithField("front-version", info.Version).Debug("watching the front")
			gone := s.watch(ctx, conn, info.PID)
			if !gone {
				return nil // ctx is done
			}
			if s.hooks != nil {
				s.hooks.FrontGone()
			}
			// A stop of the whole service (systemctl kill, an uninstall's kill) signals the core and the
			// front at once: a front that ends as the core is told to stop is not replaced.
			if !sleep(ctx, stopRace) {
				break
			}
			log.G(ctx).WithField("pid", info.PID).Warn("the front went away")
			continue // a front that took over answers already; else the next share fails
		}
		if ctx.Err() != nil {
			break
		}
		if _, qerr := Query(s.cfg.RunDir, "info"); qerr == nil {
			// A front answers but shares nothing: one of an older protocol, which Ensure replaces;
			// or one that is stopping. Ask again shortly.
			log.G(ctx).WithError(err).Debug("the front answers but does not share its socket")
			if !sleep(ctx, retry.NextBackOff()) {
				break
			}
			continue
		}
		s.setUp(false)
		log.G(ctx).WithField("keeps-socket", held != nil).Warn("no front serves the CRI endpoint: starting one")
		if s.hooks != nil {
			s.hooks.FrontRespawned()
		}
		if err := spawn(ctx, s.cfg, s.preRegistered, held); err != nil {
			if ctx.Err() != nil {
				break
			}
			log.G(ctx).WithError(err).Error("failed to start a front")
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			if held != nil && time.Since(failingSince) >= holdWhileFailing {
				// Calls must fail (UNAVAILABLE), not wait on a socket that no front may serve: let it
				// go; the next front opens the socket anew.
				log.G(ctx).WithField("failing-for", time.Since(failingSince).Round(time.Millisecond)).
					Warn("no front could be started: closing the kept socket, calls fail until one starts")
				_ = held.Close()
				held = nil
			}
			if !sleep(ctx, retry.NextBackOff()) {
				break
			}
			continue
		}
		failingSince = time.Time{}
	}
	return nil
}

// shareListener asks the front of runDir to share its listening socket. The connection stays open as
// long as that front serves.
func shareListener(runDir string) (*net.UnixConn, Info, *os.File, error) {
	var info Info
	conn, err := dialControl(filepath.Join(runDir, ControlSocketName))
	if err != nil {
		return nil, info, nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(controlTimeout))
	if _, err := conn.Write([]byte(`{"op":"share"}` + "\n")); err != nil {
		conn.Close()
		return nil, info, nil, err
	}
	msg, files, err := kubelet.ReceiveFiles(conn, 4096, 1)
	if err == nil && len(files) != 1 {
		err = fmt.Errorf("the front shared %d sockets", len(files))
	}
	if err == nil {
		err = json.Unmarshal(msg, &info)
	}
	if err != nil {
		for _, f := range files {
			_ = f.Close()
		}
		conn.Close()
		if errors.Is(err, io.EOF) {
			err = errors.New("the front shares no socket")
		}
		return nil, info, nil, fmt.Errorf("share: %w", err)
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, info, files[0], nil
}

// watch waits until conn, the control connection of the front pid, ends (gone) or ctx is done (not
// gone); it closes conn. Meanwhile it kills the front if it stops answering (killIfHung), which ends
// conn.
func (s *Supervisor) watch(ctx context.Context, conn *net.UnixConn, pid int) (gone bool) {
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	defer conn.Close()
	probeCtx, stopProbes := context.WithCancel(ctx)
	probesDone := make(chan struct{})
	go func() {
		defer close(probesDone)
		s.killIfHung(probeCtx, pid)
	}()
	defer func() {
		stopProbes()
		<-probesDone
	}()
	_, _ = io.Copy(io.Discard, conn)
	return ctx.Err() == nil
}

// sleep waits d, or until ctx is done (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

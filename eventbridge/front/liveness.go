package front

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/containerd/log"
	"golang.org/x/net/http2"

	"github.com/pleg-nri/pleg-nri/internal/dial"
)

// A front that is alive but does not serve (stopped with SIGSTOP, wedged, starved) keeps its control
// connection open, so the supervisor's watch alone never sees it, while every CRI call of the node
// waits in it: the kubelet's pod syncs, its housekeeping and its probes' results with them. The
// supervisor therefore checks, while it watches a front, that the front still answers on the
// kubelet's endpoint, and kills one whose checks have failed for hangTimeout; its control connection then ends,
// and the supervisor starts a new front on the socket it holds, as after any other death.
const (
	// probeInterval is how often the supervisor checks that the front it watches answers.
	probeInterval = 2 * time.Second
	// probeTimeout bounds one check.
	probeTimeout = 2 * time.Second
	// hangTimeout is how long a front's checks may fail before it is killed: long
	// beyond any pause of a serving front (a check is one handshake that never waits on containerd),
	// short against the kubelet's runtime request timeout (2 min), for which every call would wait.
	hangTimeout = 10 * time.Second
)

// handshake checks that the server listening on listen (a CRI endpoint, see dial.ParseEndpoint) answers
// an HTTP/2 connection's preface with its settings within timeout: the part of a gRPC call that the
// front's own transport serves, without a call that it would forward to the runtime.
func handshake(ctx context.Context, listen string, timeout time.Duration) error {
	network, addr, err := dial.ParseEndpoint(listen)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := new(net.Dialer).DialContext(ctx, network, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		return err
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		return err
	}
	f, err := fr.ReadFrame()
	if err != nil {
		return err
	}
	if _, ok := f.(*http2.SettingsFrame); !ok {
		return fmt.Errorf("the front's first frame is %v, not its settings", f.Header().Type)
	}
	return nil
}

// killIfHung checks every probeInterval, until ctx is done, that the front pid serving the kubelet's
// endpoint answers (see handshake); once its checks have failed for hangTimeout (from the first
// failure after an answer, so that a supervisor that was itself stopped kills nothing on resuming),
// it kills the front with SIGKILL and returns.
func (s *Supervisor) killIfHung(ctx context.Context, pid int) {
	var failingSince time.Time // zero while the front answers
	t := time.NewTicker(s.probeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := handshake(ctx, s.cfg.Listen, s.probeTimeout)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			failingSince = time.Time{}
			continue
		}
		if failingSince.IsZero() {
			failingSince = time.Now()
		}
		silent := time.Since(failingSince)
		log.G(ctx).WithError(err).WithField("pid", pid).WithField("failing-for", silent.Round(time.Millisecond)).Debug("the front did not answer")
		if silent < s.hangTimeout {
			continue
		}
		log.G(ctx).WithError(err).WithField("pid", pid).WithField("failing-for", silent.Round(time.Millisecond)).
			Error("the front has not answered on the CRI endpoint: killing it, a new front takes its socket")
		if s.hooks != nil {
			s.hooks.FrontHung()
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			log.G(ctx).WithError(err).WithField("pid", pid).Error("failed to kill the hung front")
		}
		return
	}
}

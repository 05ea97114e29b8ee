package front

import (
	"bufio"
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
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/internal/promutil"
)

// Info is what a front says about itself on its control socket.
type Info struct {
	Protocol int    `json:"protocol"`
	Version  string `json:"version"`
	// Revision is the front's code (Revision); absent from the answer of a front older than it.
	Revision        string `json:"revision,omitempty"`
	PID             int    `json:"pid"`
	Listen          string `json:"listen"`
	RuntimeEndpoint string `json:"runtime_endpoint"`
	ReadFreshness   string `json:"read_freshness"`
	// RefreshAfterStop is absent from the answer of a front older than the key (false).
	RefreshAfterStop bool `json:"refresh_after_stop,omitempty"`
	// CoreGrace is the front's core grace (a Go duration); absent from the answer of a front older than
	// the key, which never ends a stream for a core gone (0).
	CoreGrace string `json:"core_grace,omitempty"`
}

// compatible says whether the front that answered info serves what fc asks for, with this binary's
// front code (Revision).
func (info Info) compatible(fc Config) bool {
	return info.Protocol == Protocol && info.Revision == Revision && info.Listen == fc.Listen && info.RuntimeEndpoint == fc.RuntimeEndpoint &&
		info.ReadFreshness == fc.ReadFreshness && info.RefreshAfterStop == fc.RefreshAfterStop &&
		coreGrace(info.CoreGrace) == fc.CoreGrace
}

// coreGrace is the duration of an Info's CoreGrace, "" (a front older than the key) being 0, and
// anything unreadable -1 (compatible with nothing).
func coreGrace(s string) time.Duration {
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return -1
	}
	return d
}

// request is one request on the control socket.
type request struct {
	// Op is "info", "stop", "handoff", "share" (the answer is the info with the kubelet's listening
	// socket, and the connection stays open as long as this front serves: see Supervisor) or "metrics"
	// (the answer is then the Prometheus text format).
	Op string `json:"op"`
}

// front is a running front's control side.
type front struct {
	cfg      Config
	lis, ctl net.Listener
	// reg holds the endpoint's metrics, served on the control socket.
	reg *prometheus.Registry
	// stop is closed by a "stop" request, handedOver once a successor took the sockets.
	stop, handedOver chan struct{}
	// once guards the closing of stop and handedOver (one of them, once).
	once sync.Once
	// closed is set when the control listener is closed.
	closed atomic.Bool
	// mu guards sharers.
	mu sync.Mutex
	// sharers are the open connections of "share" requests: closed when this front stops serving, so
	// that the core that watches this front learns it at once.
	sharers map[*net.UnixConn]struct{}
	// timeout bounds each control exchange (reading the request, writing the answer); zero is
	// controlTimeout. A handoff waits longer for its successor (handOff).
	timeout time.Duration
}

func (f *front) closeControl() {
	if f.closed.CompareAndSwap(false, true) {
		_ = f.ctl.Close()
		f.mu.Lock()
		for c := range f.sharers {
			_ = c.Close()
		}
		f.sharers = nil
		f.mu.Unlock()
	}
}

// serveControl answers the control socket until it is closed. A failed accept (EMFILE: the process is
// out of file descriptors) does not end it, or no core could find the front again: it waits, from
// acceptRetryMin doubling to acceptRetryMax while accepts fail, and accepts again.
func (f *front) serveControl(ctx context.Context) {
	var delay time.Duration
	for {
		c, err := f.ctl.Accept()
		if err != nil {
			if f.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			delay = min(max(2*delay, acceptRetryMin), acceptRetryMax)
			log.G(ctx).WithError(err).WithField("retry-in", delay).Warn("control socket: accept failed")
			time.Sleep(delay)
			continue
		}
		delay = 0
		go f.handleControl(ctx, c)
	}
}

func (f *front) info() Info {
	return Info{Protocol: Protocol, Revision: Revision, Version: f.cfg.Version, PID: os.Getpid(), Listen: f.cfg.Listen, RuntimeEndpoint: f.cfg.RuntimeEndpoint,
		ReadFreshness: f.cfg.ReadFreshness, RefreshAfterStop: f.cfg.RefreshAfterStop,
		CoreGrace: f.cfg.CoreGrace.String()}
}

// handleControl answers one request. The exchange has f.timeout to read a line of at most
// maxControlLine bytes and write the answer: a client that sends an endless line or never reads
// holds a handler no longer.
func (f *front) handleControl(ctx context.Context, c net.Conn) {
	defer c.Close()
	timeout := f.timeout
	if timeout == 0 {
		timeout = controlTimeout
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(io.LimitReader(c, maxControlLine)).ReadBytes('\n')
	if err != nil {
		if errors.Is(err, io.EOF) && len(line) == maxControlLine {
			log.G(ctx).WithField("limit", maxControlLine).Warn("control socket: request line too long: refused")
		}
		return
	}
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return
	}
	info, _ := json.Marshal(f.info())
	switch req.Op {
	case "info":
		_, _ = c.Write(append(info, '\n'))
	case "metrics":
		if err := promutil.Write(c, f.reg); err != nil {
			log.G(ctx).WithError(err).Warn("failed to write the metrics")
		}
	case "stop":
		log.G(ctx).Info("asked to stop")
		_, _ = c.Write(append(info, '\n'))
		f.once.Do(func() { close(f.stop) })
	case "share":
		if uc, ok := c.(*net.UnixConn); ok {
			f.share(ctx, uc, info)
		}
	case "handoff":
		uc, ok := c.(*net.UnixConn)
		if !ok {
			return
		}
		if err := f.handOff(ctx, uc, info); err != nil {
			log.G(ctx).WithError(err).Warn("handing the sockets over failed: serving on")
			return
		}
		f.once.Do(func() { close(f.handedOver) })
	}
}

// dialControl connects to a front's control socket.
func dialControl(path string) (*net.UnixConn, error) {
	c, err := net.DialTimeout("unix", path, controlTimeout)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// Query sends op to the front whose control socket is in runDir and returns its answer.
func Query(runDir, op string) (Info, error) {
	var info Info
	c, err := dialControl(filepath.Join(runDir, ControlSocketName))
	if err != nil {
		return info, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(controlTimeout))
	if _, err := fmt.Fprintf(c, "{\"op\":%q}\n", op); err != nil {
		return info, err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return info, fmt.Errorf("no answer from the front: %w", err)
	}
	if err := json.Unmarshal(line, &info); err != nil {
		return info, fmt.Errorf("bad answer from the front: %w", err)
	}
	return info, nil
}

// share sends the kubelet's listening socket to the core that asked (see Supervisor) and holds the
// connection open until the core closes it or this front stops serving: its end tells the core that
// the front is gone, and the socket the core keeps is the one a new front serves on, so the socket
// never closes.
func (f *front) share(ctx context.Context, c *net.UnixConn, info []byte) {
	lf, err := kubelet.ListenerFile(f.lis)
	if err != nil {
		log.G(ctx).WithError(err).Warn("cannot share the listening socket with the core")
		return
	}
	err = kubelet.SendFiles(c, info, lf)
	_ = lf.Close()
	if err != nil {
		return
	}
	f.mu.Lock()
	if f.closed.Load() {
		f.mu.Unlock()
		return
	}
	if f.sharers == nil {
		f.sharers = make(map[*net.UnixConn]struct{})
	}
	f.sharers[c] = struct{}{}
	f.mu.Unlock()
	_ = c.SetDeadline(time.Time{})
	_, _ = io.Copy(io.Discard, c)
	f.mu.Lock()
	delete(f.sharers, c)
	f.mu.Unlock()
}

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
	Protocol        int    `json:"protocol"`
	Version         string `json:"version"`
	PID             int    `json:"pid"`
	Listen          string `json:"listen"`
	RuntimeEndpoint string `json:"runtime_endpoint"`
	ReadFreshness   string `json:"read_freshness"`
	// RefreshAfterStop is absent from the answer of a front older than the key (false).
	RefreshAfterStop bool `json:"refresh_after_stop,omitempty"`
	// ReadSource is absent from the answer of a front older than the key (runtime: it forwards every
	// read).
	ReadSource string `json:"read_source,omitempty"`
}

// compatible says whether the front that answered info serves what fc asks for.
func (info Info) compatible(fc Config) bool {
	return info.Protocol == Protocol && info.Listen == fc.Listen && info.RuntimeEndpoint == fc.RuntimeEndpoint &&
		info.ReadFreshness == fc.ReadFreshness && info.RefreshAfterStop == fc.RefreshAfterStop &&
		readSource(info.ReadSource) == readSource(fc.ReadSource)
}

// readSource is a read-source key's value, "" (a front older than the key) being the runtime.
func readSource(s string) string {
	if s == "" {
		return string(kubelet.ReadSourceRuntime)
	}
	return s
}

// request is one request on the control socket.
type request struct {
	// Op is "info", "stop", "handoff" or "metrics" (the answer is then the Prometheus text format).
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
	// timeout bounds each control exchange (reading the request, writing the answer); zero is
	// controlTimeout. A handoff waits longer for its successor (handOff).
	timeout time.Duration
}

func (f *front) closeControl() {
	if f.closed.CompareAndSwap(false, true) {
		_ = f.ctl.Close()
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
	return Info{Protocol: Protocol, Version: f.cfg.Version, PID: os.Getpid(), Listen: f.cfg.Listen, RuntimeEndpoint: f.cfg.RuntimeEndpoint,
		ReadFreshness: f.cfg.ReadFreshness, RefreshAfterStop: f.cfg.RefreshAfterStop, ReadSource: f.cfg.ReadSource}
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

// handOff sends the listening sockets to a successor and waits until it serves on them. On success the
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

// Ensure makes sure a front compatible with fc serves fc.Listen: it leaves a compatible one alone,

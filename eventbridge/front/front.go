// Package front is pleg-nri's front process.
//
// The front is the small, long-lived process that owns the kubelet's CRI endpoint (--listen) and its
// connections: it forwards every CRI call to containerd (kubelet.Proxy) and relays the event stream
// it gets from the core over the core's event socket (kubelet.Relay). The core (NRI plugin, state,
// relist, checkpoint) can then be restarted, killed or upgraded without ending the kubelet's stream: the
// front subscribes again and the core's startup replay fills the gap. See docs/restarts.md.
//
//	kubelet --CRI--> front (--listen) --every call--> containerd CRI
//	                   ^ GetContainerEvents, relayed
//	                   |
//	                 core (<run-dir>/core.sock) <-- NRI, containerd events, relist
//
// `pleg-nri` (the daemon) starts the core and makes sure a compatible front runs for its --listen: it
// spawns one, detached in its own session (like containerd's shims), when none answers on
// <run-dir>/front.sock, and leaves a running one alone. An incompatible front (another front protocol,
// another runtime endpoint) is replaced: the new front takes the listening socket over from the old one
// (fd passing), so the socket never goes away; the old front's open streams end once.

package front

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/promutil"
)

// Protocol is the version of what a front and a core expect of each other (the control socket's
// messages, the core's event socket, the front's flags). A core leaves a running front of the same
// protocol alone, whatever its binary's version, and replaces one of another.
const Protocol = 1

// The files of the run directory.
const (
	CoreSocketName    = "core.sock"
	ControlSocketName = "front.sock"
	logName           = "front.log"
)

// Bounds of the front's control exchanges.
const (
	startTimeout   = 20 * time.Second
	controlTimeout = 5 * time.Second
	StopTimeout    = 5 * time.Second
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

// Config is the front's configuration: a subset of the daemon's keys.
type Config struct {
	Listen          string
	RuntimeEndpoint string
	RunDir          string
	LogLevel        string
	// Takeover makes the front take the listening socket of the front running in RunDir.
	Takeover bool
	// LogFile, when set, receives the front's output once it serves (before, its errors go to the
	// daemon that started it).
	LogFile string
	// ReadFreshness is the daemon's read-freshness key (kubelet.ReadFreshness).
	ReadFreshness string
	// RefreshAfterStop is the daemon's refresh-after-stop key.
	RefreshAfterStop bool
	// ReadSource is the daemon's read-source key (kubelet.ReadSource): the front answers reads from
	// the core's state (asked on its socket) with state, and compares them with check.
	ReadSource string
	// Version is the binary's version, which the front tells on its control socket (not a flag: a
	// spawned front is this binary).
	Version string
}

// Args are the command line of a front with c, after the binary: "front" and its flags (ParseArgs'
// input).
func (c Config) Args() []string {
	a := []string{"front", "--listen", c.Listen, "--runtime-endpoint", c.RuntimeEndpoint, "--run-dir", c.RunDir, "--log-level", c.LogLevel,
		"--read-freshness", c.ReadFreshness}
	if c.Takeover {
		a = append(a, "--takeover")
	}
	if c.RefreshAfterStop {
		a = append(a, "--refresh-after-stop")
	}
	if c.ReadSource != "" {
		a = append(a, "--read-source", c.ReadSource)
	}
	if c.LogFile != "" {
		a = append(a, "--log-file", c.LogFile)
	}
	return a
}

// ParseArgs parses the front's flags (Args without "front"); a flag not given keeps its value in
// defaults.
func ParseArgs(args []string, defaults Config) (Config, error) {
	c := defaults
	c.Takeover, c.LogFile, c.RefreshAfterStop = false, "", false
	fs := flag.NewFlagSet("pleg-nri front", flag.ContinueOnError)
	fs.StringVar(&c.Listen, "listen", c.Listen, "CRI endpoint served to the kubelet")
	fs.StringVar(&c.RuntimeEndpoint, "runtime-endpoint", c.RuntimeEndpoint, "containerd's CRI endpoint (forwarded calls)")
	fs.StringVar(&c.RunDir, "run-dir", c.RunDir, "directory of the core's event socket and the front's control socket")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log level: trace, debug, info, warn, error")
	fs.BoolVar(&c.Takeover, "takeover", false, "take the listening socket over from the front running in run-dir")
	fs.StringVar(&c.LogFile, "log-file", "", "file the front logs to once it serves (default: its stderr)")
	fs.StringVar(&c.ReadFreshness, "read-freshness", c.ReadFreshness, "how status reads stay as fresh as the events sent: overlay, hold or off")
	fs.StringVar(&c.ReadSource, "read-source", c.ReadSource, "where the status and list reads are answered: runtime, state or check")
	fs.BoolVar(&c.RefreshAfterStop, "refresh-after-stop", false, "ask the core to send a stopped pod's STOPPED again once the client's calls about it went quiet")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if !filepath.IsAbs(c.RunDir) {
		return c, fmt.Errorf("--run-dir must be an absolute path, got %q", c.RunDir)
	}
	return c, nil
}

// Run runs the front until ctx is done, it is asked to stop, or it handed its socket over.
func Run(ctx context.Context, cfg Config) error {
	// A front outlives whatever started it, and its stderr (the journal, a pipe) may go away meanwhile:
	// a write to a broken pipe must not kill it.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("process", "front"))

	// The listeners: the kubelet's and the control socket, opened here or taken over.
	var lis, ctl net.Listener
	var predecessor *net.UnixConn
	var err error
	if cfg.Takeover {
		if lis, ctl, predecessor, err = takeOver(ctx, cfg); err != nil {
			return err
		}
		defer predecessor.Close()
	} else {
		if lis, err = kubelet.Listen(ctx, cfg.Listen); err != nil {
			return err
		}
		if ctl, err = kubelet.Listen(ctx, filepath.Join(cfg.RunDir, ControlSocketName)); err != nil {
			_ = lis.Close()
			return fmt.Errorf("control socket: %w", err)
		}
	}

	// Until the server serves on them, a failure closes the listeners: a socket taken over stays (the
	// previous front, told nothing, serves on); one opened here is removed.
	serving := false
	defer func() {
		if serving {
			return
		}
		if cfg.Takeover {
			kubelet.KeepSocketFile(lis)
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
	relay, err := kubelet.DialRelay(kubelet.RelayConfig{
		Endpoint:     "unix://" + filepath.Join(cfg.RunDir, CoreSocketName),
		Gate:         kubelet.NewRuntimeGate(ctx, backend),
		Resubscribed: em.Resubscribed,
	})
	if err != nil {
		return err
	}
	defer relay.Close()
	pcfg := kubelet.ProxyConfig{Backend: backend, Events: relay, Metrics: em,
		ReadFreshness: kubelet.ReadFreshness(cfg.ReadFreshness), ReadSource: kubelet.ReadSource(cfg.ReadSource), State: relay}
	if cfg.RefreshAfterStop {
		pcfg.RefreshAfterStop = relay.RefreshStopped
	}
	proxy, err := kubelet.NewProxy(pcfg)
	if err != nil {
		return fmt.Errorf("--read-freshness or --read-source: %w", err)
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
		if err := redirectOutput(cfg.LogFile); err != nil {
			log.G(ctx).WithError(err).Warn("cannot log to the log file: logging to stderr")
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

// redirectOutput makes path (appended to, 0600) the process's stdout and stderr.
func redirectOutput(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, fd := range []int{1, 2} {
		if err := syscall.Dup3(int(f.Fd()), fd, 0); err != nil {
			return fmt.Errorf("failed to redirect fd %d to %s: %w", fd, path, err)
		}
	}
	return nil
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
}

func (f *front) closeControl() {
	if f.closed.CompareAndSwap(false, true) {
		_ = f.ctl.Close()
	}
}

// serveControl answers the control socket until it is closed.
func (f *front) serveControl(ctx context.Context) {
	for {
		c, err := f.ctl.Accept()
		if err != nil {
			if !f.closed.Load() {
				log.G(ctx).WithError(err).Warn("control socket failed")
			}
			return
		}
		go f.handleControl(ctx, c.(*net.UnixConn))
	}
}

func (f *front) info() Info {
	return Info{Protocol: Protocol, Version: f.cfg.Version, PID: os.Getpid(), Listen: f.cfg.Listen, RuntimeEndpoint: f.cfg.RuntimeEndpoint,
		ReadFreshness: f.cfg.ReadFreshness, RefreshAfterStop: f.cfg.RefreshAfterStop, ReadSource: f.cfg.ReadSource}
}

func (f *front) handleControl(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(controlTimeout))
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
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
		if err := f.handOff(ctx, c, info); err != nil {
			log.G(ctx).WithError(err).Warn("handing the sockets over failed: serving on")
			return
		}
		f.once.Do(func() { close(f.handedOver) })
	}
}

// handOff sends the listening sockets to a successor and waits until it serves on them. On success the
// socket files are left in place when this front closes its listeners.
func (f *front) handOff(ctx context.Context, c *net.UnixConn, info []byte) error {
	lf, err := kubelet.ListenerFile(f.lis)
	if err != nil {
		return err
	}
	defer lf.Close()
	cf, err := kubelet.ListenerFile(f.ctl)
	if err != nil {
		return err
	}
	defer cf.Close()
	if err := kubelet.SendFiles(c, info, lf, cf); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(startTimeout))
	ack, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || strings.TrimSpace(ack) != "serving" {
		return fmt.Errorf("the successor did not confirm it serves (%q): %w", ack, err)
	}
	kubelet.KeepSocketFile(f.lis)
	kubelet.KeepSocketFile(f.ctl)
	log.G(ctx).Info("sockets handed over to the successor: ending this front's streams and stopping")
	return nil
}

// takeOver asks the front running in cfg.RunDir for its sockets. The returned connection stays open
// until this front serves: it then writes "serving" on it.
func takeOver(ctx context.Context, cfg Config) (lis, ctl net.Listener, conn *net.UnixConn, err error) {
	conn, err = dialControl(filepath.Join(cfg.RunDir, ControlSocketName))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("takeover: %w", err)
	}
	if _, err := conn.Write([]byte(`{"op":"handoff"}` + "\n")); err != nil {
		conn.Close()
		return nil, nil, nil, fmt.Errorf("takeover: %w", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(controlTimeout))
	msg, files, err := kubelet.ReceiveFiles(conn, 4096, 2)
	if err != nil {
		conn.Close()
		return nil, nil, nil, fmt.Errorf("takeover: %w", err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	closeAll := func() {
		for _, f := range files {
			_ = f.Close()
		}
	}
	var old Info
	if err := json.Unmarshal(msg, &old); err != nil || len(files) != 2 {
		closeAll()
		conn.Close()
		return nil, nil, nil, fmt.Errorf("takeover: bad answer from the running front (%d sockets): %q", len(files), msg)
	}
	if old.Listen != cfg.Listen {
		closeAll()
		conn.Close()
		return nil, nil, nil, fmt.Errorf("takeover: the running front serves %s, not %s", old.Listen, cfg.Listen)
	}
	defer closeAll()
	if lis, err = kubelet.FileListener(files[0]); err != nil {
		conn.Close()
		return nil, nil, nil, err
	}
	if ctl, err = kubelet.FileListener(files[1]); err != nil {
		kubelet.KeepSocketFile(lis) // the previous front serves on
		_ = lis.Close()
		conn.Close()
		return nil, nil, nil, err
	}
	log.G(ctx).WithField("previous", old.PID).WithField("previous-version", old.Version).Info("took the sockets over from the running front")
	return lis, ctl, conn, nil
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

// Ensure makes sure a front compatible with fc serves fc.Listen: it leaves a compatible one alone,
// replaces an incompatible one (taking its socket over when it serves the same address), and spawns one
// when none runs. preRegistered says the caller is a plugin containerd started (see spawn).
func Ensure(ctx context.Context, fc Config, preRegistered bool) error {
	runDir := fc.RunDir
	info, err := Query(runDir, "info")
	if err == nil {
		switch {
		case info.compatible(fc):
			log.G(ctx).WithField("pid", info.PID).WithField("front-version", info.Version).Info("a compatible front serves the CRI endpoint: keeping it")
			return nil
		case info.Listen == fc.Listen:
			log.G(ctx).WithField("pid", info.PID).WithField("front-version", info.Version).WithField("front-protocol", info.Protocol).
				Warn("the running front is not compatible: replacing it (its open event streams end once)")
			fc.Takeover = true
		default:
			log.G(ctx).WithField("pid", info.PID).WithField("front-listen", info.Listen).
				Warn("the running front serves another address: stopping it")
			if err := Stop(runDir); err != nil {
				return err
			}
		}
	}
	return spawn(ctx, fc, preRegistered)
}

// spawn starts a front with this binary, detached: in its own session, so that neither a signal to
// the daemon's process group nor the end of the process that launched the daemon (a service manager's
// restart, containerd stopping its pre-registered plugins) reaches it. It waits until the front answers.
func spawn(ctx context.Context, fc Config, preRegistered bool) error {
	var startOut *tailWriter
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("cannot find the pleg-nri binary to start the front: %w", err)
	}
	cmd := exec.Command(exe, fc.Args()...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	for _, kv := range os.Environ() {
		// Not the NRI plugin's variables: the front is no plugin; nor systemd's notify socket: the unit's
		// state is the daemon's to tell.
		if !strings.HasPrefix(kv, "NRI_") && !strings.HasPrefix(kv, "NOTIFY_SOCKET=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	// Its output: until it serves, a pipe read here, so that its startup errors are the daemon's; then
	// the journal when the daemon runs under systemd, else a file of the run directory (the daemon's
	// stderr may be a pipe that ends with it, or nothing, as for a pre-registered plugin).
	if os.Getenv("JOURNAL_STREAM") != "" && !preRegistered {
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	} else {
		fc.LogFile = filepath.Join(fc.RunDir, logName)
		cmd.Args = append(cmd.Args, "--log-file", fc.LogFile)
		out := &tailWriter{}
		cmd.Stdout, cmd.Stderr = out, out
		startOut = out
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("failed to start the front: %w", err)
	}
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	// Reap it if it exits while the daemon runs; after the daemon exits, init does.
	go func() { exited <- cmd.Wait() }()
	startErr := func(err error) error {
		if startOut != nil {
			if last := startOut.lastLine(); last != "" {
				return fmt.Errorf("%s (the front: %v)", last, err)
			}
		}
		return err
	}
	deadline := time.Now().Add(startTimeout)
	for {
		info, err := Query(fc.RunDir, "info")
		if err == nil && info.PID == pid {
			log.G(ctx).WithField("pid", pid).WithField("takeover", fc.Takeover).Info("started the front")
			return nil
		}
		select {
		case err := <-exited:
			return startErr(err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return startErr(fmt.Errorf("the front (pid %d) did not answer within %s", pid, startTimeout))
		}
	}
}

// Stop asks the front in runDir to stop and waits until its control socket is gone.
func Stop(runDir string) error {
	info, err := Query(runDir, "stop")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
		return fmt.Errorf("failed to stop the front: %w", err)
	}
	deadline := time.Now().Add(2 * StopTimeout)
	for time.Now().Before(deadline) {
		if syscall.Kill(info.PID, 0) != nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("the front (pid %d) did not stop", info.PID)
}

// tailWriter keeps the last line written to it.
type tailWriter struct {
	// mu guards buf.
	mu  sync.Mutex
	buf []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if len(w.buf) > 64<<10 {
		w.buf = w.buf[len(w.buf)-32<<10:]
	}
	return len(p), nil
}

// lastLine returns the last non-empty line written, without the program's name prefix.
func (w *tailWriter) lastLine() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(w.buf)), "\n")
	last := lines[len(lines)-1]
	if i := strings.Index(last, ": "); i > 0 && !strings.Contains(last[:i], " ") {
		last = last[i+2:]
	}
	return last
}

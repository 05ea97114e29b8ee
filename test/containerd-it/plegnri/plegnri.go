// Package plegnri runs the real pleg-nri binary (built by internal/testutil/plegnribin) as a daemon
// against a test containerd, for the tests that need the whole program rather than its packages
// (test/containerd-it, test/kubelet-e2e).
//
// The daemon is two processes: the core, which Start, Stop, Kill and Restart run as a service manager
// would, and the front it spawns detached, which serves Socket and outlives the core's restarts.
// Close stops both and fails when a process of the daemon is left.
package plegnri

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// logTailLines bounds the log a Daemon keeps for failure reports.
const logTailLines = 2000

// Options say how to run pleg-nri.
type Options struct {
	// Binary is the pleg-nri binary (from plegnribin.Build).
	Binary string
	// Env is the containerd it attaches to: its NRI socket, its events and its CRI.
	Env *harness.Env
	// Dir holds its socket and its checkpoint; it must exist.
	Dir string
	// Extra flags come after the defaults, so they override them.
	Extra []string
}

// Daemon is a pleg-nri process run as an external NRI plugin of a test containerd.
type Daemon struct {
	// Socket is its CRI endpoint (a path, served by the front); MetricsAddr its metrics address
	// (host:port, the core's).
	Socket, MetricsAddr string
	// RunDir holds the core's event socket, the front's control socket and the front's log.
	RunDir string
	// PID is the core's pid while it runs.
	PID int
	// dir is the daemon's directory: every process of the daemon names it on its command line.
	dir string

	args   []string
	binary string
	// proc is the core while it runs.
	proc *harness.Process
	// mu guards tail, the last lines it logged (over every run, restarts included), and lines, how
	// many it logged.
	mu    sync.Mutex
	tail  []string
	lines int
}

// Start starts pleg-nri and waits until it is ready (NRI registered and synchronized, events subscribed, one relist
// done: /readyz answers 200).
func Start(ctx context.Context, opts Options) (*Daemon, error) {
	addr, err := testutil.FreeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	d := &Daemon{Socket: filepath.Join(opts.Dir, "run", "cri.sock"), RunDir: filepath.Join(opts.Dir, "run"),
		MetricsAddr: addr, binary: opts.Binary, dir: opts.Dir}
	d.args = []string{
		"--nri-socket", opts.Env.NRISocket,
		"--containerd-address", opts.Env.Address,
		"--runtime-endpoint", "unix://" + opts.Env.Address,
		"--listen", "unix://" + d.Socket,
		"--metrics-address", d.MetricsAddr,
		"--log-level", "debug",
		// Its checkpoint in the test's directory, never in the machine's default one (which other
		// tests' daemons would share).
		"--state-dir", filepath.Join(opts.Dir, "state"),
	}
	d.args = append(d.args, opts.Extra...)
	if err := d.start(ctx); err != nil {
		_ = d.Close()
		return nil, err
	}
	return d, nil
}

func (d *Daemon) start(ctx context.Context) error {
	cmd := exec.Command(d.binary, d.args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	// In a session of its own, as a service manager starts a daemon.
	proc, err := harness.StartProcess(cmd)
	if err != nil {
		return fmt.Errorf("start pleg-nri: %w", err)
	}
	d.proc, d.PID = proc, proc.PID()
	go func() {
		<-proc.Exited()
		pw.Close()
	}()
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			d.mu.Lock()
			d.tail = append(d.tail, sc.Text())
			d.lines++
			if len(d.tail) > 2*logTailLines {
				d.tail = append(d.tail[:0], d.tail[len(d.tail)-logTailLines:]...)
			}
			d.mu.Unlock()
		}
	}()
	return d.waitReady(ctx)
}

// waitReady waits for /readyz; it gives up at once when pleg-nri exits.
func (d *Daemon) waitReady(ctx context.Context) error {
	proc := d.proc
	err := harness.WaitFor(ctx, 20*time.Second, "pleg-nri /readyz", func() (bool, error) {
		if !proc.Running() {
			return false, testutil.Stop(errors.New("pleg-nri exited"))
		}
		resp, err := http.Get("http://" + d.MetricsAddr + "/readyz")
		if err != nil {
			return false, err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, errors.New(strings.TrimSpace(string(body)))
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w\npleg-nri log:\n%s", err, d.Log())
	}
	return nil
}

// Stop stops pleg-nri with SIGTERM (SIGKILL after 10 s) and waits for it. It does nothing when it is
// not running.
func (d *Daemon) Stop() { d.stop(syscall.SIGTERM) }

// Kill kills pleg-nri with SIGKILL and waits for it. It does nothing when it is not running.
func (d *Daemon) Kill() { d.stop(syscall.SIGKILL) }

func (d *Daemon) stop(sig syscall.Signal) {
	if d.proc == nil {
		return
	}
	d.proc.Stop(sig, 10*time.Second)
	d.proc, d.PID = nil, 0
}

// Signal sends sig to pleg-nri.
func (d *Daemon) Signal(sig syscall.Signal) error {
	if d.proc == nil {
		return errors.New("pleg-nri is not running")
	}
	return d.proc.Signal(sig)
}

// Restart stops pleg-nri (the core) and starts it again with the same flags (the same socket and
// metrics address), and waits until it is ready.
func (d *Daemon) Restart(ctx context.Context) error {
	d.Stop()
	return d.start(ctx)
}

// Start starts the core again after a Stop or a Kill, with the same flags, and waits until it is ready.
func (d *Daemon) Start(ctx context.Context) error {
	if d.Running() {
		return errors.New("pleg-nri is running")
	}
	return d.start(ctx)
}

// SetBinary makes the next start run binary (an upgrade, or a downgrade).
func (d *Daemon) SetBinary(binary string) { d.binary = binary }

// Close stops the core and the front, waits for them, and returns an error naming every process of
// the daemon still there (they are killed).
func (d *Daemon) Close() error {
	d.Stop()
	var errs []error
	if pid, err := d.FrontPID(); err == nil {
		if err := stopFront(d.RunDir, pid); err != nil {
			errs = append(errs, err)
		}
	}
	if left := d.Processes(); len(left) > 0 {
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		errs = append(errs, fmt.Errorf("pleg-nri processes left behind (killed): %v", left))
	}
	return errors.Join(errs...)
}

// Processes lists the live processes of this daemon (core, front, or any process started with its
// directory on its command line).
func (d *Daemon) Processes() []int {
	return ProcessesNaming(d.dir)
}

// ProcessesNaming lists the live processes, other than this one, whose command line contains s.
func ProcessesNaming(s string) []int {
	return harness.ProcessesWhere(func(pid int) bool { return harness.CommandLineHas(pid, s) })
}

// FrontPID asks the front serving Socket for its pid.
func (d *Daemon) FrontPID() (int, error) {
	return FrontPID(d.RunDir)
}

// FrontPID asks the front whose run directory is runDir for its pid (on its control socket).
func FrontPID(runDir string) (int, error) {
	return frontOp(runDir, "info")
}

func frontOp(runDir, op string) (int, error) {
	c, err := net.DialTimeout("unix", filepath.Join(runDir, "front.sock"), 5*time.Second)
	if err != nil {
		return 0, fmt.Errorf("no front in %s: %w", runDir, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "{\"op\":%q}\n", op); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return 0, fmt.Errorf("no answer from the front in %s: %w", runDir, err)
	}
	var info struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(line, &info); err != nil || info.PID == 0 {
		return 0, fmt.Errorf("bad answer from the front in %s: %q", runDir, line)
	}
	return info.PID, nil
}

// stopFront asks the front to stop and waits for pid to end (SIGKILL after 10 s).
func stopFront(runDir string, pid int) error {
	if _, err := frontOp(runDir, "stop"); err != nil {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	if testutil.WaitGone(context.Background(), pid, 10*time.Second) != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return fmt.Errorf("the front (pid %d) did not stop within 10s: killed", pid)
	}
	return nil
}

// StopFrontIn stops the front whose run directory is runDir, if one answers there.
func StopFrontIn(runDir string) error {
	pid, err := FrontPID(runDir)
	if err != nil {
		return nil
	}
	return stopFront(runDir, pid)
}

// FrontLog returns the front's log.
func (d *Daemon) FrontLog() string {
	b, _ := os.ReadFile(filepath.Join(d.RunDir, "front.log"))
	return string(b)
}

// LogLines is how many lines pleg-nri has logged: the core (every run, restarts included) and the
// front (its log file).
func (d *Daemon) LogLines() (int, error) {
	front, err := os.ReadFile(filepath.Join(d.RunDir, "front.log"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lines + bytes.Count(front, []byte("\n")), nil
}

// Running says whether the process runs.
func (d *Daemon) Running() bool { return d.proc.Running() }

// Log returns the last lines pleg-nri logged.
func (d *Daemon) Log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	tail := d.tail
	if len(tail) > logTailLines {
		tail = tail[len(tail)-logTailLines:]
	}
	return strings.Join(tail, "\n")
}

// Metric returns the sum of the samples of a metric on /metrics whose line contains every filter.
func (d *Daemon) Metric(name string, filters ...string) (float64, error) {
	return ScrapeMetric("http://"+d.MetricsAddr+"/metrics", name, filters...)
}

// ScrapeMetric reads a Prometheus text exposition at url and returns the sum of the samples of the
// metric name whose line contains every filter (0 when there is none).
func ScrapeMetric(url, name string, filters ...string) (float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	return SumMetric(resp.Body, name, filters...)
}

// SumMetric returns the sum of the samples of metric name in a Prometheus text exposition whose line
// contains every filter (0 when there is none).
func SumMetric(r io.Reader, name string, filters ...string) (float64, error) {
	var sum float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
lines:
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		for _, f := range filters {
			if !strings.Contains(l, f) {
				continue lines
			}
		}
		var v float64
		if _, err := fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v); err == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}

package containerdit

import (
	"bufio"
	"context"
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
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// plegNRIBinary is the pleg-nri binary built once for the package's tests (by TestMain).
var plegNRIBinary string

// buildPlegNRI builds cmd/pleg-nri into dir.
func buildPlegNRI(dir string) (string, error) {
	bin := filepath.Join(dir, "pleg-nri")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/pleg-nri/pleg-nri/cmd/pleg-nri")
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build pleg-nri: %w: %s", err, out)
	}
	return bin, nil
}

// plegNRI is a pleg-nri daemon process run against the test containerd.
type plegNRI struct {
	// Socket is its CRI endpoint; MetricsAddr its metrics address.
	Socket, MetricsAddr string
	cmd                 *exec.Cmd
	exited              chan struct{}
	args                []string
	// mu guards tail, the last logTailLines lines pleg-nri logged.
	mu   sync.Mutex
	tail []string
}

// logTailLines bounds the log kept for a failure report.
const logTailLines = 2000

// startPlegNRI starts pleg-nri as an external NRI plugin of the test containerd and waits until it is
// ready (NRI registered, events subscribed, one relist done). It is stopped when the test ends, and
// its log is printed if the test failed. Its state (the checkpoint) is in a directory of its own, so
// it starts with none. extra flags come last, so they override the defaults.
func startPlegNRI(t testing.TB, extra ...string) *plegNRI {
	t.Helper()
	dir, err := os.MkdirTemp("", "plegnri-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &plegNRI{Socket: filepath.Join(dir, "run", "cri.sock"), MetricsAddr: freeLoopbackAddr(t)}
	p.args = append([]string{
		"--nri-socket", env.NRISocket,
		"--containerd-address", env.Address,
		"--runtime-endpoint", "unix://" + env.Address,
		"--listen", "unix://" + p.Socket,
		"--metrics-address", p.MetricsAddr,
		"--state-dir", filepath.Join(dir, "state"),
		"--log-level", "debug",
	}, extra...)
	p.start(t)
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("pleg-nri log:\n%s", p.Log())
		}
	})
	return p
}

func (p *plegNRI) start(t testing.TB) {
	t.Helper()
	p.cmd = exec.Command(plegNRIBinary, p.args...)
	pr, pw := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start pleg-nri: %v", err)
	}
	p.exited = make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.tail = append(p.tail, sc.Text())
			if len(p.tail) > 2*logTailLines {
				p.tail = append(p.tail[:0], p.tail[len(p.tail)-logTailLines:]...)
			}
			p.mu.Unlock()
		}
	}()
	go func(cmd *exec.Cmd, exited chan struct{}) {
		_ = cmd.Wait()
		pw.Close()
		close(exited)
	}(p.cmd, p.exited)
	p.waitReady(t)
}

// waitReady waits for /readyz.
func (p *plegNRI) waitReady(t testing.TB) {
	t.Helper()
	err := harness.WaitFor(context.Background(), 20*time.Second, "pleg-nri /readyz", func() (bool, error) {
		select {
		case <-p.exited:
			return false, fmt.Errorf("pleg-nri exited")
		default:
		}
		resp, err := http.Get("http://" + p.MetricsAddr + "/readyz")
		if err != nil {
			return false, err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("%s", strings.TrimSpace(string(body)))
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%v\npleg-nri log:\n%s", err, p.Log())
	}
}

// stop stops pleg-nri with SIGTERM and waits for it.
func (p *plegNRI) stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd = nil
}

// Log returns the last lines pleg-nri logged.
func (p *plegNRI) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	tail := p.tail
	if len(tail) > logTailLines {
		tail = tail[len(tail)-logTailLines:]
	}
	return strings.Join(tail, "\n")
}

// metric returns the sum of a metric's samples whose line contains every filter.
func (p *plegNRI) metric(t testing.TB, name string, filters ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.MetricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
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
	return sum
}

func freeLoopbackAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

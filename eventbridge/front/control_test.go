package front

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// flakyListener fails its first accepts with EMFILE, as a process out of file descriptors does.
type flakyListener struct {
	net.Listener
	// failures is how many accepts fail still.
	failures atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.failures.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// testFront is a front serving only its control socket, in a directory of its own.
func testFront(t *testing.T, wrap func(net.Listener) net.Listener) (*front, string) {
	t.Helper()
	dir := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(dir, ControlSocketName))
	if err != nil {
		t.Fatal(err)
	}
	var ctl net.Listener = l
	if wrap != nil {
		ctl = wrap(l)
	}
	f := &front{cfg: Config{RunDir: dir}, ctl: ctl, reg: prometheus.NewRegistry(), stop: make(chan struct{}), handedOver: make(chan struct{})}
	return f, dir
}

// serve runs f's control loop until the test ends, and fails the test if the loop ends before.
func serve(t *testing.T, f *front) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		f.serveControl(context.Background())
		close(done)
	}()
	t.Cleanup(func() {
		select {
		case <-done:
			t.Error("the control loop ended before its socket was closed")
		default:
		}
		f.closeControl()
		select {
		case <-done:
		case <-time.After(waitTimeout):
			t.Error("the control loop did not end when its socket was closed")
		}
	})
}

// TestControlSurvivesAcceptErrors: accepts that fail (EMFILE) do not end the control loop: it waits and
// accepts again, and a core still finds the front.
func TestControlSurvivesAcceptErrors(t *testing.T) {
	var fl *flakyListener
	f, dir := testFront(t, func(l net.Listener) net.Listener {
		fl = &flakyListener{Listener: l}
		fl.failures.Store(3)
		return fl
	})
	serve(t, f)
	if _, err := Query(dir, "info"); err != nil {
		t.Fatalf("info after failed accepts: %v", err)
	}
	if n := fl.failures.Load(); n >= 0 {
		t.Errorf("%d injected failures left", n+1)
	}
}

// TestControlLineLimit: a request line longer than maxControlLine is refused once that much is read:
// the client's writes fail long before it wrote all it wanted to, and the front answers on.
func TestControlLineLimit(t *testing.T) {
	f, dir := testFront(t, nil)
	serve(t, f)
	c, err := dialControl(filepath.Join(dir, ControlSocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetWriteDeadline(time.Now().Add(waitTimeout))
	const limit = 16 << 20
	chunk := bytes.Repeat([]byte("a"), 64<<10)
	written := 0
	for written < limit {
		n, err := c.Write(chunk)
		written += n
		if err != nil {
			break
		}
	}
	if written >= limit {
		t.Fatalf("the front read %d bytes of a request line without a newline", written)
	}
	if _, err := Query(dir, "info"); err != nil {
		t.Fatalf("info after a long line: %v", err)
	}
}

// bigCollector is a metric with many series: more text than a socket's buffers hold.
type bigCollector struct{ desc *prometheus.Desc }

func (b bigCollector) Describe(ch chan<- *prometheus.Desc) { ch <- b.desc }

func (b bigCollector) Collect(ch chan<- prometheus.Metric) {
	for i := range 20000 {
		ch <- prometheus.MustNewConstMetric(b.desc, prometheus.GaugeValue, 1, fmt.Sprintf("series-%d-%s", i, strings.Repeat("x", 60)))
	}
}

// TestControlClientNeverReads: a client that asks for the metrics and never reads the answer does not
// hold the handler longer than the exchange's deadline.
func TestControlClientNeverReads(t *testing.T) {
	f, dir := testFront(t, nil)
	defer f.closeControl()
	f.timeout = 200 * time.Millisecond
	f.reg.MustRegister(bigCollector{prometheus.NewDesc("pleg_nri_test_big", "many series", []string{"name"}, nil)})
	c, err := dialControl(filepath.Join(dir, ControlSocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(`{"op":"metrics"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	sc, err := f.ctl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		f.handleControl(context.Background(), sc)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(waitTimeout):
		c.Close() // the handler's write fails: the goroutine ends
		<-done
		t.Fatal("the handler still writes to a client that never reads")
	}
}

// FuzzControlRequest (issue 56) hands the control socket's handler any bytes, as any local peer could
// send: it never panics, always returns within its deadline, and answers an info request with this
// front's info. The ops that pass descriptors (share, handoff) run on a real unix connection and a
// real kubelet listener, and end when their peer has gone.
func FuzzControlRequest(f *testing.F) {
	for _, seed := range []string{`{"op":"info"}` + "\n", `{"op":"metrics"}` + "\n", `{"op":"share"}` + "\n",
		`{"op":"handoff"}` + "\n", `{"op":"stop"}` + "\n", `{"op":` + "\n", "\n", `{"op":"info"}`, strings.Repeat("x", 5000)} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, req []byte) {
		dir, err := os.MkdirTemp("", "fz-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		lis, err := net.Listen("unix", filepath.Join(dir, "cri.sock"))
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		fr := &front{cfg: Config{RunDir: dir}, lis: lis, ctl: lis, reg: prometheus.NewRegistry(), stop: make(chan struct{}),
			handedOver: make(chan struct{}), timeout: 200 * time.Millisecond}
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		ours, theirs := os.NewFile(uintptr(fds[0]), "ours"), os.NewFile(uintptr(fds[1]), "theirs")
		oc, err := net.FileConn(ours)
		_ = ours.Close()
		if err != nil {
			t.Fatal(err)
		}
		tc, err := net.FileConn(theirs)
		_ = theirs.Close()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			fr.handleControl(context.Background(), tc)
		}()
		_ = oc.SetDeadline(time.Now().Add(time.Second))
		_, _ = oc.Write(req)
		_ = oc.(*net.UnixConn).CloseWrite()
		var got bytes.Buffer
		buf := make([]byte, 4096)
		for {
			n, err := oc.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				break
			}
		}
		_ = oc.Close() // a share or a handoff ends with its peer
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("the handler of %q did not return", req)
		}
		if string(req) == `{"op":"info"}`+"\n" && !strings.Contains(got.String(), `"protocol":`) {
			t.Errorf("info answered %q", got.String())
		}
	})
}

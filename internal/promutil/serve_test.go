package promutil

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-nri/pleg-nri/internal/httpbounds"
)

// metricsTestWait bounds the waits of the metrics server's tests for what it does at once.
const metricsTestWait = 10 * time.Second

// TestMetricsServerConnectionLimit: connections beyond httpbounds.MaxConns wait unserved (in the
// listener's backlog, no goroutine, no file descriptor) while httpbounds.MaxConns idle ones are open, and
// are served once one closes.
func TestMetricsServerConnectionLimit(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := ServeOn(context.Background(), l, prometheus.NewRegistry(), func() error { return nil })
	defer stop()
	addr := l.Addr().String()
	healthz := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: pleg-nri\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// A request is served while there is room.
	c := healthz()
	_ = c.SetReadDeadline(time.Now().Add(metricsTestWait))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.Contains(line, "200") {
		t.Fatalf("/healthz: %q, %v", line, err)
	}
	c.Close()

	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range httpbounds.MaxConns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	c = healthz()
	defer c.Close()
	r := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if line, err := r.ReadString('\n'); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("with %d idle connections open, another was served: %q, %v", httpbounds.MaxConns, line, err)
	}
	idle[0].Close()
	_ = c.SetReadDeadline(time.Now().Add(metricsTestWait))
	if line, err := r.ReadString('\n'); err != nil || !strings.Contains(line, "200") {
		t.Fatalf("/healthz once an idle connection closed: %q, %v", line, err)
	}
}

// TestServe: /metrics serves what the gatherer holds, /healthz answers ok, /readyz answers 503 with
// the reason until ready says it is; after stop nothing answers; an address in use is an error.
func TestServe(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "served_total", Help: "a test counter"}))
	var notReady atomic.Pointer[error]
	why := errors.New("no relist has completed yet")
	notReady.Store(&why)
	ready := func() error {
		if p := notReady.Load(); p != nil {
			return *p
		}
		return nil
	}
	// Serve listens on addr (its address is not known here: ServeOn below is the one asked).
	stop, err := Serve(context.Background(), "127.0.0.1:0", reg, ready)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stopOn := ServeOn(context.Background(), l, reg, ready)
	base := "http://" + l.Addr().String()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "not ready: no relist has completed yet") {
		t.Errorf("/readyz not ready: %d %q", code, body)
	}
	notReady.Store(nil)
	if code, body := get("/readyz"); code != 200 || body != "ok\n" {
		t.Errorf("/readyz ready: %d %q", code, body)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "pleg_nri_served_total 0") {
		t.Errorf("/metrics: %d %q", code, body)
	}
	if _, err := Serve(context.Background(), l.Addr().String(), reg, ready); err == nil {
		t.Error("Serve on an address in use: no error")
	}
	stopOn()
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("/healthz answered after stop")
	}
}

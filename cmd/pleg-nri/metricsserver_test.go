package main

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"strings"
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
	stop := serveMetricsOn(context.Background(), l, prometheus.NewRegistry(), &readiness{})
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

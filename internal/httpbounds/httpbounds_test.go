package httpbounds

import (
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// TestBounds: a server of Server on Listener answers, carries the bounds, and serves at most MaxConns
// connections at once: the next one is accepted only when one of them closes.
func TestBounds(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &countingListener{Listener: tcp}
	srv := Server(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	if srv.ReadHeaderTimeout != ReadHeaderTimeout || srv.WriteTimeout != WriteTimeout || srv.MaxHeaderBytes != MaxHeaderBytes {
		t.Errorf("server bounds %+v", srv)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(Listener(l)) }()
	defer func() {
		_ = srv.Close()
		<-done
	}()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "ok" {
		t.Fatalf("answer %q", body)
	}
	// The server has closed that connection (its place is free) before the test fills them all.
	for deadline := time.Now().Add(5 * time.Second); l.open.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open on the server after the answer", l.open.Load())
		}
	}

	// MaxConns idle connections hold every place; one more waits in the backlog, unanswered.
	var held []net.Conn
	for range MaxConns {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	extra, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if _, err := io.WriteString(extra, "GET / HTTP/1.0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = extra.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := extra.Read(make([]byte, 1)); err == nil || n > 0 {
		t.Fatalf("connection %d answered while %d were open", MaxConns+1, MaxConns)
	}
	start := time.Now()
	// One closes: the waiting one is served.
	_ = held[0].Close()
	_ = extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	answer, err := io.ReadAll(extra)
	if err != nil && len(answer) == 0 {
		t.Fatalf("the waiting connection after one closed: %v", err)
	}
	t.Logf("served %s after a place freed", time.Since(start))
	for _, c := range held[1:] {
		_ = c.Close()
	}
}

// countingListener counts the connections it accepted that are not closed yet.
type countingListener struct {
	net.Listener
	open atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.open.Add(1)
	return &countedConn{Conn: c, l: l}, nil
}

type countedConn struct {
	net.Conn
	l    *countingListener
	once atomic.Bool
}

func (c *countedConn) Close() error {
	if c.once.CompareAndSwap(false, true) {
		c.l.open.Add(-1)
	}
	return c.Conn.Close()
}

package containerdit

import (
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestEndpointBadClients: pleg-nri's CRI endpoint, with a client using it as the kubelet does (an
// event stream and pod calls on one connection), gets random bytes, HTTP/1.1, an oversized HTTP/2
// frame, an oversized gRPC message and 50 connections that stall: the bad connections are closed or
// their calls fail, and the kubelet-like client keeps its stream and its calls. Its socket is 0660 in a
// 0750 directory.
func TestEndpointBadClients(t *testing.T) {
	logOnFailure(t)
	p := startPlegNRI(t)
	for path, want := range map[string]fs.FileMode{filepath.Dir(p.Socket): fs.ModeDir | 0o750, p.Socket: fs.ModeSocket | 0o660} {
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %s, want %s", path, fi.Mode(), want)
		}
	}
	ours := recordEvents(t, p.Socket)
	c := newCRI(t, p.Socket)
	healthy := func(after string) {
		t.Helper()
		podID, _ := c.runPod("bad-clients")
		ours.wait(t, podID, evStarted)
		c.stopPod(podID)
		c.removePod(podID)
		ours.wait(t, podID, evDeleted)
		if err := ours.Err(); err != nil {
			t.Fatalf("the event stream ended %s: %v", after, err)
		}
	}
	healthy("at start")

	frame := func(length int, typ byte, stream uint32) []byte {
		b := []byte{byte(length >> 16), byte(length >> 8), byte(length), typ, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[5:], stream)
		return b
	}
	const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	random := make([]byte, 1<<20)
	rnd := rand.New(rand.NewPCG(3, 4))
	for i := range random {
		random[i] = byte(rnd.Uint32())
	}
	dial := func() net.Conn {
		t.Helper()
		conn, err := net.Dial("unix", p.Socket)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	closedByServer := func(conn net.Conn, limit time.Duration) bool {
		_ = conn.SetReadDeadline(time.Now().Add(limit))
		_, err := io.Copy(io.Discard, conn)
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}

	var stalled []net.Conn
	for range 50 {
		stalled = append(stalled, dial())
	}
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"a megabyte of random bytes", random},
		{"an HTTP/1.1 request", []byte("GET /runtime.v1.RuntimeService/Version HTTP/1.1\r\nHost: pleg-nri\r\n\r\n")},
		{"an oversized HTTP/2 frame", append(append([]byte(preface), frame(0, 0x4, 0)...), frame(1<<24-1, 0x0, 1)...)},
	} {
		conn := dial()
		go func() { _, _ = conn.Write(tc.send) }()
		if !closedByServer(conn, 10*time.Second) {
			t.Errorf("%s: the connection is still open after 10s", tc.name)
		}
		healthy("after " + tc.name)
	}

	// A request larger than the kubelet's 16 MiB limit: refused by pleg-nri, not forwarded.
	big := env.PodConfig("too-big")
	big.Annotations["plegit/huge"] = strings.Repeat("x", 17<<20)
	if _, err := c.rt.RunPodSandbox(ctx(t), &runtimeapi.RunPodSandboxRequest{Config: big}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("RunPodSandbox with a 17 MiB request: %v, want ResourceExhausted", err)
	}
	healthy("after an oversized message")

	// The stalled connections are closed after the handshake timeout, all the while the others are served.
	var wg sync.WaitGroup
	var open int
	var mu sync.Mutex
	for _, conn := range stalled {
		wg.Go(func() {
			if !closedByServer(conn, 15*time.Second) {
				mu.Lock()
				open++
				mu.Unlock()
			}
		})
	}
	healthy("with 50 stalled connections")
	wg.Wait()
	if open > 0 {
		t.Errorf("%d of 50 connections that sent nothing are still open after 15s", open)
	}
	healthy("at the end")
	if !p.Running() {
		t.Fatal("pleg-nri exited")
	}
}

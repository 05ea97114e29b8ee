package kubelet

// Bad input on the CRI endpoint: random bytes, HTTP/1.1, oversized frames and messages, clients that
// connect and stall. Each bad client gets its own connection closed or its own call failed; the clients
// already connected keep their event stream and their calls.

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/internal/endpointtest"
	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/grpcraw"
)

// http2Preface is what every HTTP/2 client sends first.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// h2Frame encodes an HTTP/2 frame header (length, type, flags, stream) followed by payload.
func h2Frame(length int, typ, flags byte, stream uint32, payload []byte) []byte {
	b := []byte{byte(length >> 16), byte(length >> 8), byte(length), typ, flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[5:], stream)
	return append(b, payload...)
}

// emptySettings is a client's SETTINGS frame with no setting.
var emptySettings = h2Frame(0, 0x4, 0, 0, nil)

// rawDial connects to the endpoint's socket without any protocol.
func rawDial(t testing.TB, socket string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", socket, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitClosedByServer reads from c until the server closes it, and fails after limit.
func waitClosedByServer(t testing.TB, c net.Conn, limit time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(limit))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server did not close the connection within %s", limit)
	}
}

// healthyClient is a client that was connected before the bad ones: an open event stream and unary
// calls on the same connection, as the kubelet has them.
type healthyClient struct {
	e      *env
	rt     runtimeapi.RuntimeServiceClient
	stream grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]
}

func newHealthyClient(t *testing.T, e *env) *healthyClient {
	t.Helper()
	h := &healthyClient{e: e, rt: runtimeapi.NewRuntimeServiceClient(e.proxied)}
	var err error
	if h.stream, err = h.rt.GetContainerEvents(endpointtest.Ctx(t), &runtimeapi.GetEventsRequest{}); err != nil {
		t.Fatal(err)
	}
	e.source.NextOpened(t)
	h.check(t, "at start")
	return h
}

// check fails the test unless an event published now reaches the stream and a forwarded call works.
func (h *healthyClient) check(t *testing.T, after string) {
	t.Helper()
	id := "healthy-" + strings.ReplaceAll(after, " ", "-")
	h.e.source.Publish(endpointtest.Event(id, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT))
	if ev := endpointtest.RecvEvent(t, h.stream); ev.GetContainerId() != id {
		t.Errorf("healthy event stream %s: got %q, want %q", after, ev.GetContainerId(), id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if v, err := h.rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil || v.RuntimeName != "fake" {
		t.Fatalf("forwarded Version %s: %v, %v", after, v, err)
	}
	select {
	case err := <-h.e.server.Err():
		t.Fatalf("the server stopped serving %s: %v", after, err)
	default:
	}
}

func TestServerSurvivesBadClients(t *testing.T) {
	// A short handshake timeout, so that the test sees stalled handshakes closed.
	e := newEnv(t, 1, grpc.ConnectionTimeout(300*time.Millisecond))
	socket := e.server.Addr().String()
	h := newHealthyClient(t, e)
	rnd := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rnd.Uint32())
		}
		return b
	}

	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"random bytes", random(1 << 10)},
		{"a megabyte of random bytes", random(1 << 20)},
		{"random bytes after the preface", append([]byte(http2Preface), random(4<<10)...)},
		{"HTTP/1.1 GET", []byte("GET / HTTP/1.1\r\nHost: pleg-nri\r\n\r\n")},
		{"HTTP/1.1 POST of a CRI method", []byte("POST /runtime.v1.RuntimeService/Version HTTP/1.1\r\nHost: pleg-nri\r\n" +
			"Content-Type: application/grpc\r\nContent-Length: 5\r\n\r\n\x00\x00\x00\x00\x00")},
		{"HTTP/1.1 upgrade to h2c", []byte("GET / HTTP/1.1\r\nHost: pleg-nri\r\nConnection: Upgrade, HTTP2-Settings\r\n" +
			"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")},
		// A frame far above the 16 KiB SETTINGS_MAX_FRAME_SIZE: a connection error.
		{"oversized HTTP/2 frame", append(append([]byte(http2Preface), emptySettings...), h2Frame(1<<24-1, 0x0, 0, 1, random(1<<10))...)},
		{"HEADERS on stream 0", append(append([]byte(http2Preface), emptySettings...), h2Frame(4, 0x1, 0x4, 0, random(4))...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawDial(t, socket)
			// The server may close before everything is written: write errors are expected.
			go func() { _, _ = c.Write(tc.send) }()
			waitClosedByServer(t, c, 10*time.Second)
			h.check(t, "after "+tc.name)
		})
	}

	t.Run("clients that connect and stall", func(t *testing.T) {
		var conns []net.Conn
		for i := range 100 {
			c := rawDial(t, socket)
			switch i % 3 {
			case 1: // the preface and half a SETTINGS frame
				_, _ = c.Write(append([]byte(http2Preface), emptySettings[:4]...))
			case 2: // half the preface
				_, _ = c.Write([]byte(http2Preface[:10]))
			}
			conns = append(conns, c)
		}
		h.check(t, "with 100 stalled connections")
		var wg sync.WaitGroup
		for _, c := range conns {
			wg.Go(func() { waitClosedByServer(t, c, 10*time.Second) })
		}
		wg.Wait()
		h.check(t, "after 100 stalled connections")
	})

	t.Run("oversized gRPC messages", func(t *testing.T) {
		conn, err := dial.CRI("unix://"+socket, grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		big := make([]byte, dial.MaxMsgSize+1)
		ctx := endpointtest.Ctx(t)
		for _, method := range []string{"/runtime.v1.RuntimeService/Version", GetContainerEventsMethod} {
			var out grpcraw.Frame
			err := conn.Invoke(ctx, method, &grpcraw.Frame{Data: big}, &out, grpc.ForceCodecV2(grpcraw.Codec{}))
			out.Free()
			if status.Code(err) != codes.ResourceExhausted {
				t.Errorf("%s with a %d-byte request: %v, want ResourceExhausted", method, len(big), err)
			}
		}
		// The same connection still works.
		if _, err := runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
			t.Errorf("Version after the oversized calls, same connection: %v", err)
		}
		h.check(t, "after oversized messages")
	})

	t.Run("a stream opened with no request", func(t *testing.T) {
		// HEADERS of GetContainerEvents and then nothing: the handler waits for the request; the
		// connection and the others are not affected.
		conn, err := dial.CRI("unix://" + socket)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, GetContainerEventsMethod)
		if err != nil {
			t.Fatal(err)
		}
		_ = cs
		if _, err := runtimeapi.NewRuntimeServiceClient(conn).Version(endpointtest.Ctx(t), &runtimeapi.VersionRequest{}); err != nil {
			t.Errorf("Version next to a stream with no request: %v", err)
		}
		h.check(t, "with a stream that sent no request")
	})
}

// grpcRequest is the HTTP/2 of a unary call of method with an empty message, after the preface: SETTINGS,
// HEADERS, DATA with END_STREAM.
func grpcRequest(method string) []byte {
	var hdr strings.Builder
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "localhost"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	b := append([]byte{}, emptySettings...)
	b = append(b, h2Frame(hdr.Len(), 0x1, 0x4, 1, []byte(hdr.String()))...) // END_HEADERS
	return append(b, h2Frame(5, 0x0, 0x1, 1, make([]byte, 5))...)           // END_STREAM
}

// FuzzEndpointBytes writes arbitrary bytes (after the HTTP/2 preface when preface is set) on a new
// connection to the CRI endpoint and half-closes it: the server must close the connection within a few
// seconds and go on serving a client connected before, whatever the bytes.
func FuzzEndpointBytes(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), false)
	f.Add([]byte{}, false)
	f.Add([]byte{}, true)
	f.Add(emptySettings, true)
	f.Add(grpcRequest("/runtime.v1.RuntimeService/Version"), true)
	f.Add(grpcRequest(GetContainerEventsMethod), true)
	f.Add(grpcRequest("/no.Such/Method"), true)
	f.Add(append(append([]byte{}, emptySettings...), h2Frame(1<<24-1, 0x0, 0, 1, nil)...), true)
	f.Add(append(append([]byte{}, emptySettings...), h2Frame(8, 0x6, 0, 0, make([]byte, 8))...), true) // PING

	e := newEnv(f, 1)
	// Event streams a fuzzed request opens are answered by the fake source: take them.
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case <-e.source.Opened:
			case <-stop:
				return
			}
		}
	}()
	f.Cleanup(func() { close(stop); <-drained })
	socket := e.server.Addr().String()
	rt := runtimeapi.NewRuntimeServiceClient(e.proxied)

	f.Fuzz(func(t *testing.T, data []byte, preface bool) {
		c, err := net.DialTimeout("unix", socket, 5*time.Second)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.Close()
		if preface {
			data = append([]byte(http2Preface), data...)
		}
		go func() {
			_, _ = c.Write(data)
			_ = c.(*net.UnixConn).CloseWrite()
		}()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("the server did not close the connection: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
			t.Fatalf("a client connected before: Version: %v", err)
		}
	})
}

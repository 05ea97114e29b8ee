package testutil

import (
	"bufio"
	"net"
	"testing"

	"google.golang.org/grpc"
)

// FreeLoopbackAddr returns a 127.0.0.1 address with a port nobody listens on right now (the port may be
// taken again before the caller listens on it: use it where a clash fails loudly).
func FreeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// ServeGRPC serves a gRPC server with the services register registers on the unix socket at path, until
// it is stopped or the test ends.
func ServeGRPC(t testing.TB, path string, register func(*grpc.Server), opts ...grpc.ServerOption) *grpc.Server {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("listen on %s: %v", path, err)
	}
	srv := grpc.NewServer(opts...)
	register(srv)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return srv
}

// ServeAnswer answers every connection to the unix socket at path, until the test ends, with answer once
// it read one line of request (a line protocol's server, a front's control socket, say); an empty
// answer closes the connection without one.
func ServeAnswer(t testing.TB, path, answer string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("listen on %s: %v", path, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = bufio.NewReader(c).ReadBytes('\n')
			_, _ = c.Write([]byte(answer))
			_ = c.Close()
		}
	}()
}

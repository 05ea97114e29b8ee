package testutil

import (
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

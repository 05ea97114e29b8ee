package plugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/net/multiplex"
	"github.com/containerd/ttrpc"
)

// registerOnly is a runtime service that accepts a registration, then drops the connection without sending
// Configure: a runtime that dies between the two. RegisterPlugin answers only once release is closed, so
// that the test knows the next write on the connection is that answer.
type registerOnly struct {
	registered chan struct{}
	release    chan struct{}
}

func (r *registerOnly) RegisterPlugin(context.Context, *api.RegisterPluginRequest) (*api.Empty, error) {
	r.registered <- struct{}{}
	<-r.release
	return &api.Empty{}, nil
}

// writeSignalConn signals on wrote after each write to the connection.
type writeSignalConn struct {
	net.Conn
	wrote chan struct{}
}

func (c writeSignalConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	select {
	case c.wrote <- struct{}{}:
	default:
	}
	return n, err
}

func (r *registerOnly) UpdateContainers(context.Context, *api.UpdateContainersRequest) (*api.UpdateContainersResponse, error) {
	return &api.UpdateContainersResponse{}, nil
}

func TestStuckRegistration(t *testing.T) {
	rt := newFakeRuntime(t)
	if err := os.MkdirAll(filepath.Dir(rt.Outer), 0o750); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", rt.Outer)
	if err != nil {
		t.Fatal(err)
	}
	svc := &registerOnly{registered: make(chan struct{}, 1), release: make(chan struct{})}
	served := make(chan struct{})
	go func() {
		defer close(served)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		wconn := writeSignalConn{Conn: conn, wrote: make(chan struct{}, 1)}
		mux := multiplex.Multiplex(wconn, multiplex.WithBlockedRead())
		defer mux.Close()
		rpcl, err := mux.Listen(multiplex.RuntimeServiceConn)
		if err != nil {
			return
		}
		rpcs, err := ttrpc.NewServer()
		if err != nil {
			return
		}
		defer rpcs.Close()
		api.RegisterRuntimeService(rpcs, svc)
		go rpcs.Serve(context.Background(), rpcl)
		mux.Unblock()
		<-svc.registered
		select { // forget the writes before the answer
		case <-wconn.wrote:
		default:
		}
		close(svc.release)
		// The answer is in the socket once written: the plugin reads it before it sees the connection
		// close, so its Start is waiting for Configure when the runtime goes away.
		<-wconn.wrote
	}()

	h := startPlugin(t, rt.Outer, nil)
	<-served
	ln.Close()

	// The stub that registered waits for a Configure that never comes; the plugin gives it up and connects
	// to the runtime once it is back.
	rt.Start()
	h.waitState(true)
	h.waitSynced()
}

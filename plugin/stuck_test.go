package plugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/net/multiplex"
	"github.com/containerd/ttrpc"
)

// registerOnly is a runtime service that accepts a registration, then drops the connection without sending
// Configure: a runtime that dies between the two.
type registerOnly struct {
	registered chan struct{}
}

func (r *registerOnly) RegisterPlugin(context.Context, *api.RegisterPluginRequest) (*api.Empty, error) {
	r.registered <- struct{}{}
	return &api.Empty{}, nil
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
	svc := &registerOnly{registered: make(chan struct{}, 1)}
	served := make(chan struct{})
	go func() {
		defer close(served)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		mux := multiplex.Multiplex(conn, multiplex.WithBlockedRead())
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
		// Let the reply reach the plugin: its Start now waits for Configure.
		time.Sleep(200 * time.Millisecond)
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

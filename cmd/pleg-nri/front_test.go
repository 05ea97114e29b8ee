package main

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/front"
	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// TestFrontStopsWithoutCore (issue 26): a front whose core is gone (stopped before the subscribers
// came, stopped or killed under them) stops within its stop timeout, by `pleg-nri stop-front` or by
// SIGTERM, with one subscriber gone and another still connected. Its event streams used to wait for
// the core for ever, and so did its server's stop: such fronts were still running ten minutes later.
func TestFrontStopsWithoutCore(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before: the core goes before the subscribers come; sig is how it goes.
		before bool
		sig    syscall.Signal
		// stopFront: the front is stopped by stop-front, else by SIGTERM.
		stopFront bool
	}{
		{name: "core stopped before the subscribers, stop-front", before: true, sig: syscall.SIGTERM, stopFront: true},
		{name: "core stopped under the subscribers, SIGTERM", sig: syscall.SIGTERM},
		{name: "core killed under the subscribers, stop-front", sig: syscall.SIGKILL, stopFront: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.ShortTempDir(t, "pn-")
			runDir := filepath.Join(dir, "run")
			sock := filepath.Join(runDir, "cri.sock")
			d := startDaemon(t, sock, 0o022, append(absentUpstreams(dir), "--listen", "unix://"+sock)...)
			info, err := front.Query(runDir, "info")
			if err != nil {
				t.Fatal(err)
			}
			coreGone := func() {
				_ = d.cmd.Process.Signal(tc.sig)
				select {
				case <-d.done:
				case <-time.After(20 * time.Second):
					t.Fatal("the core did not exit")
				}
			}
			if tc.before {
				coreGone()
			}
			conn, err := dial.CRI("unix://" + sock)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			client := runtimeapi.NewRuntimeServiceClient(conn)
			leaving, leave := context.WithCancel(context.Background())
			defer leave()
			staying, stay := context.WithCancel(context.Background())
			defer stay()
			var streams []runtimeapi.RuntimeService_GetContainerEventsClient
			for _, ctx := range []context.Context{leaving, staying} {
				s, err := client.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
				if err != nil {
					t.Fatal(err)
				}
				streams = append(streams, s)
			}
			if !tc.before {
				coreGone()
			}
			leave()
			if _, err := streams[0].Recv(); err == nil {
				t.Error("the leaving subscriber got an event")
			}

			// Both ways wait for the front's exit for twice its stop timeout.
			start := time.Now()
			if tc.stopFront {
				if err := front.Stop(runDir); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := syscall.Kill(info.PID, syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				if err := testutil.Poll(context.Background(), 2*front.StopTimeout, "the front to exit", func() (bool, error) {
					return !testutil.Alive(info.PID), nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("the front stopped %s after it was asked to", time.Since(start).Round(time.Millisecond))
			if _, err := streams[1].Recv(); err == nil {
				t.Error("the staying subscriber got an event, want its stream ended by the stop")
			}
		})
	}
}

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
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

// startBeforeRuntime starts the daemon (startDaemon) with its front on a socket in a new directory,
// before a fake runtime that answers Version, and its metrics on a free loopback address; it returns
// the run directory, the front's socket and the metrics address.
func startBeforeRuntime(t *testing.T) (runDir, sock, metrics string) {
	t.Helper()
	dir := testutil.ShortTempDir(t, "pn-")
	runDir = filepath.Join(dir, "run")
	sock = filepath.Join(runDir, "cri.sock")
	runtime := filepath.Join(dir, "runtime.sock")
	testutil.ServeVersionRuntime(t, runtime, "fake")
	metrics = freeLoopbackAddr(t)
	startDaemon(t, sock, 0o022, append(absentUpstreams(dir), "--listen", "unix://"+sock,
		"--runtime-endpoint", "unix://"+runtime, "--metrics-address", metrics)...)
	return runDir, sock, metrics
}

// waitMetrics waits up to 10 s until the daemon's metrics at addr hold every line of want; what names
// them in the error.
func waitMetrics(addr, what string, want ...string) error {
	return testutil.Poll(context.Background(), 10*time.Second, what+" in the metrics", func() (bool, error) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false, nil
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		for _, line := range want {
			if !strings.Contains(string(body), "\n"+line+"\n") {
				return false, nil
			}
		}
		return true, nil
	})
}

// TestFrontRespawned (issue 56): a front that dies while the core runs (SIGKILL here; a panic outside a
// handler or an OOM kill end it the same way) is replaced by the core on the same socket. A call made
// in the gap, on a new connection, is answered (it waits in the socket's backlog), never refused or
// "no such file"; the socket file never goes away; the metrics count each respawn. It failed before
// the front supervisor: nothing started a front again, and every call failed for good.
func TestFrontRespawned(t *testing.T) {
	runDir, sock, metrics := startBeforeRuntime(t)

	// The socket file is watched for the whole test: it must never be missing.
	stopWatching := testutil.WatchPresent(sock)

	const kills = 3
	for i := range kills {
		before, err := front.Query(runDir, "info")
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		// The call is made once the front is gone: one that a dying front accepted before its end is
		// reset with it (the kubelet's reconnection then lands in the gap, as this one does).
		if err := testutil.WaitGone(context.Background(), before.PID, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := versionThrough(sock, 10*time.Second); err != nil {
			t.Fatalf("kill %d: a call right after the front's SIGKILL failed: %v", i+1, err)
		}
		after, err := front.Query(runDir, "info")
		if err != nil || after.PID == before.PID {
			t.Fatalf("kill %d: front after the kill: %+v, %v; want another process than %d", i+1, after, err, before.PID)
		}
		t.Logf("kill %d: front %d killed, call answered by front %d %v later", i+1, before.PID, after.PID, time.Since(start).Round(time.Millisecond))
	}
	if err := stopWatching(); err != nil {
		t.Errorf("the socket file went away: %v", err)
	}
	if err := waitMetrics(metrics, "the respawns", fmt.Sprintf("pleg_nri_front_respawns_total %d", kills), "pleg_nri_front_up 1"); err != nil {
		t.Error(err)
	}
}

// TestSecondCoreLeavesTheFront (issue 56): a second core started by hand on the run directory of a
// running one (another state directory, so the state lock does not stop it, and a setting that makes
// the running front incompatible) exits with an error that names the running core, and leaves the
// production front alone: the same process serves the kubelet's socket. It failed before: the second
// core replaced the front (ending the kubelet's stream) and only then found it could not serve.
func TestSecondCoreLeavesTheFront(t *testing.T) {
	dir := testutil.ShortTempDir(t, "pn-")
	runDir := filepath.Join(dir, "run")
	sock := filepath.Join(runDir, "cri.sock")
	startDaemon(t, sock, 0o022, append(absentUpstreams(dir), "--listen", "unix://"+sock)...)
	before, err := front.Query(runDir, "info")
	if err != nil {
		t.Fatal(err)
	}
	args := append(absentUpstreams(dir), "--listen", "unix://"+sock, "--state-dir", filepath.Join(dir, "state2"),
		"--read-freshness", "off")
	code, out := runToExit(t, args...)
	if code == 0 || !strings.Contains(lastLine(out), "already serves") {
		t.Errorf("second core: exit %d, last line %q; want a failure naming the running core", code, lastLine(out))
	}
	after, err := front.Query(runDir, "info")
	if err != nil || after.PID != before.PID {
		t.Errorf("the production front after a second core: %+v, %v; want pid %d still", after, err, before.PID)
	}
}

// TestFrontKilledAsTheDaemonServes: a front SIGKILLed the moment the daemon says it serves (its log
// line, systemd's READY=1) leaves the endpoint open: the supervisor already holds the front's socket,
// so a call made before the next front listens waits in its backlog and is answered. Before the
// daemon waited for the supervisor (front.Supervisor.Watching), a front killed in those first
// milliseconds took its socket with it, and the call was refused (a fresh-clone make test caught it
// in TestFrontRespawned's first kill).
func TestFrontKilledAsTheDaemonServes(t *testing.T) {
	for i := range 3 {
		dir := testutil.ShortTempDir(t, "pn-")
		runDir := filepath.Join(dir, "run")
		sock := filepath.Join(runDir, "cri.sock")
		runtime := filepath.Join(dir, "runtime.sock")
		testutil.ServeVersionRuntime(t, runtime, "fake")
		d := spawnDaemon(t, sock, 0o022, append(absentUpstreams(dir), "--listen", "unix://"+sock,
			"--runtime-endpoint", "unix://"+runtime)...)
		err := testutil.PollEvery(context.Background(), 30*time.Second, time.Millisecond, "pleg-nri to say it serves", func() (bool, error) {
			return strings.Contains(d.out.String(), servingLog), nil
		})
		if err != nil {
			t.Fatalf("run %d: %v\n%s", i+1, err, d.out.String())
		}
		info, err := front.Query(runDir, "info")
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(info.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := testutil.WaitGone(context.Background(), info.PID, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := versionThrough(sock, 10*time.Second); err != nil {
			t.Fatalf("run %d: a call right after the front's SIGKILL, as the daemon said it serves, failed: %v", i+1, err)
		}
	}
}

// TestFrontHungReplaced: a front frozen with SIGSTOP (its control connection to the core stays open,
// so only a check of the endpoint itself sees it) is killed by the core after its checks have failed
// for 10 s, and a new front answers on the same socket: a call made to the frozen front is answered
// by the next one, and the metrics count the kill.
func TestFrontHungReplaced(t *testing.T) {
	runDir, sock, metrics := startBeforeRuntime(t)
	before, err := front.Query(runDir, "info")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(before.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Cleanup(func() { _ = syscall.Kill(before.PID, syscall.SIGCONT) })
	// Once every thread is stopped: a connection the front accepted before is reset by the kill.
	if err := testutil.Poll(context.Background(), 10*time.Second, "the front to stop", func() (bool, error) {
		return testutil.Stopped(before.PID), nil
	}); err != nil {
		t.Fatal(err)
	}
	// Its connection's handshake with the frozen front times out first (as the kubelet's does): wait
	// for ready, as a retry of the call would.
	if err := versionThrough(sock, 30*time.Second, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("a call to the frozen front: %v; want it answered by the next front", err)
	}
	answered := time.Since(stopped)
	after, err := front.Query(runDir, "info")
	if err != nil || after.PID == before.PID {
		t.Fatalf("front after the freeze: %+v, %v; want another process than %d", after, err, before.PID)
	}
	t.Logf("front %d frozen, the call answered by front %d %s later", before.PID, after.PID, answered.Round(time.Millisecond))
	if err := waitMetrics(metrics, "the kill", "pleg_nri_front_hung_kills_total 1", "pleg_nri_front_up 1"); err != nil {
		t.Error(err)
	}
}

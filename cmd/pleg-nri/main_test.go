package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/internal/testutil/plegnribin"
)

// TestMain runs the tests, then fails the package if any goroutine is left behind.
// When the test binary is started as a front (runDaemon run in a test spawns os.Executable(), this
// binary, with the front's arguments), it is the front.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "front" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := runFront(ctx, os.Args[2:])
		stop()
		if err != nil {
			fmt.Fprintf(os.Stderr, "pleg-nri: %v\n", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	code := m.Run()
	// Every process a test started (daemons, and the fronts they spawned detached) must be gone.
	if left := leftProcesses(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: processes left behind by the tests (killed): %v\n", left)
		code = 1
	}
	plegnribin.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// daemonBinary builds this command once for the package's tests and returns its path.
func daemonBinary(t testing.TB) string {
	t.Helper()
	return plegnribin.Binary(t, plegnribin.Default)
}

// leftProcesses kills and lists the processes of the daemon binary built for the tests, and this test
// binary started as a front.
func leftProcesses() []string {
	self, _ := os.Executable()
	entries, _ := os.ReadDir("/proc")
	binPath := plegnribin.Built(plegnribin.Default)
	var out []string
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if (binPath != "" && args[0] == binPath) || (args[0] == self && len(args) > 1 && args[1] == "front") {
			if testutil.Alive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				out = append(out, fmt.Sprintf("%d %s", pid, strings.Join(args, " ")))
			}
		}
	}
	return out
}

// Package kubelete2e runs an unmodified kubelet, built from the Go module proxy, in standalone mode
// (static pods, no API server) against a real containerd of its own, in three setups:
//
//  1. GenericPLEG, runtime endpoint = containerd;
//  2. EventedPLEG, runtime endpoint = containerd (its own GetContainerEvents stream);
//  3. EventedPLEG, runtime endpoint = pleg-nri, which forwards every other call to containerd.
//
// The tests (setup 3, and setup 2 where the difference is the point) check what the kubelet reports
// and what it did in containerd; BenchmarkCrashRestart (make bench-kubelet) measures how fast each
// setup restarts a crashed container.
package kubelete2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/plegnri"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
)

var (
	// env is the containerd every kubelet of the package runs against. The kubelet kills every runtime
	// pod it did not create, so it must be a containerd of its own, and only one kubelet runs at a time.
	env *harness.Env
	// kubeletBinary and plegNRIBinary are built once by TestMain.
	kubeletBinary, plegNRIBinary string
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

// runTests builds the kubelet and pleg-nri, sets up containerd, runs the tests and tears everything
// down. A setup or teardown failure fails the run with the reason: these tests never pass by not
// running.
func runTests(m *testing.M) (code int) {
	ctx := context.Background()
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
		return 1
	}
	if os.Geteuid() != 0 || runtime.GOOS != "linux" {
		return fail("the kubelet end-to-end tests need root on Linux (they run containerd, runc and a kubelet)")
	}
	unlock, err := kubelet.Lock(ctx, os.Stderr)
	if err != nil {
		return fail("%v", err)
	}
	defer unlock()
	kubelet.CleanStale(ctx, os.Stderr)

	start := time.Now()
	if kubeletBinary, err = buildKubelet(ctx); err != nil {
		return fail("%v", err)
	}
	fmt.Fprintf(os.Stderr, "kubelet-e2e: kubelet %s (%s)\n", kubeletBinary, time.Since(start).Round(time.Millisecond))

	env, err = harness.New(ctx, harness.Options{Log: os.Stderr})
	if err != nil {
		return fail("cannot set up the containerd environment: %v", err)
	}
	defer func() {
		if err := env.Teardown(context.Background()); err != nil {
			code = fail("containerd environment teardown: %v", err)
		}
	}()
	if err := env.Start(ctx); err != nil {
		return fail("cannot start containerd: %v", err)
	}
	binDir, err := os.MkdirTemp("", "plegnri-bin-")
	if err != nil {
		return fail("%v", err)
	}
	defer os.RemoveAll(binDir)
	if plegNRIBinary, err = plegnri.Build(binDir); err != nil {
		return fail("%v", err)
	}
	fmt.Fprintf(os.Stderr, "kubelet-e2e: containerd %d ready in %s (%s)\n", env.PID, time.Since(start).Round(time.Millisecond), env.Dir)
	code = m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, env.LogTail(100))
	}
	return code
}

// buildKubelet runs hack/build-kubelet.sh, which builds the kubelet into the dependency cache (nothing
// when it is there), and returns the binary's path.
func buildKubelet(ctx context.Context) (string, error) {
	_, self, _, _ := runtime.Caller(0)
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(filepath.Dir(self), "hack", "build-kubelet.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("building the kubelet failed: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

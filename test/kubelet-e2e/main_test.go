// Package kubelete2e runs an unmodified kubelet, built from the Go module proxy, in standalone mode
// (static pods, no API server) against a real containerd of its own, in three setups:
//
//  1. GenericPLEG, runtime endpoint = containerd;
//  2. EventedPLEG, runtime endpoint = containerd (its own GetContainerEvents stream);
//  3. EventedPLEG, runtime endpoint = pleg-nri, which forwards every other call to containerd; image
//     service endpoint = containerd, as pleg-nri's kubelet switch sets it (issue 58).
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

	"github.com/pleg-nri/pleg-nri/internal/testutil/plegnribin"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
)

var (
	// env is the containerd every kubelet of the package runs against. The kubelet kills every runtime
	// pod it did not create, so it must be a containerd of its own, and only one kubelet runs at a time.
	env *harness.Env
	// kubeletBinary and plegNRIBinary are built once by TestMain.
	kubeletBinary, plegNRIBinary string
	// kubeletVersion is the kubelet's version ("v1.37.2", from its --version), kubeletMinor its minor
	// version (37). KUBELET_VERSION chooses it (see hack/build-kubelet.sh).
	kubeletVersion string
	kubeletMinor   int
)

// eventsTriggerRelist says whether the kubelet under test gives events the 1.37 meaning: a STOPPED
// becomes a targeted relist of the pod through the CRI, and the generic PLEG relists every second and
// owns the cache (k/k PR #139262). Before 1.37 (1.35, 1.36) events write the pod cache and the generic
// relist runs every 300 s.
func eventsTriggerRelist() bool { return kubeletMinor >= 37 }

// eventMeaning describes, for the logs, what the kubelet under test does with events.
func eventMeaning() string {
	if eventsTriggerRelist() {
		return "events trigger targeted relists through the CRI (1.37 meaning); the generic PLEG relists every second"
	}
	return "events write the pod cache (1.35/1.36 meaning); the generic PLEG relists every 300 s"
}

// onlyFor runs a test, or a part of one, that has a meaning for one kind of kubelet only, and says so
// loudly in the log when it does not run: the suite selects by version, never skips silently.
func onlyFor(t testing.TB, relistMeaning bool, why string) bool {
	t.Helper()
	if eventsTriggerRelist() == relistMeaning {
		return true
	}
	t.Logf("NOT RUN on kubelet %s (%s): %s", kubeletVersion, eventMeaning(), why)
	return false
}

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
	if kubeletVersion, kubeletMinor, err = versionOf(ctx, kubeletBinary); err != nil {
		return fail("%v", err)
	}
	fmt.Fprintf(os.Stderr, "kubelet-e2e: kubelet %s %s (%s): %s\n", kubeletVersion, kubeletBinary,
		time.Since(start).Round(time.Millisecond), eventMeaning())

	env, err = harness.New(ctx, harness.Options{Log: os.Stderr, Profile: os.Getenv(containerdProfileEnv) != ""})
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
	defer plegnribin.Cleanup()
	if plegNRIBinary, err = plegnribin.Build(plegnribin.Default); err != nil {
		return fail("%v", err)
	}
	fmt.Fprintf(os.Stderr, "kubelet-e2e: containerd %d ready in %s (%s)\n", env.PID, time.Since(start).Round(time.Millisecond), env.Dir)
	code = m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, env.LogTail(100))
	}
	return code
}

// versionOf asks a kubelet binary for its version ("Kubernetes v1.37.2").
func versionOf(ctx context.Context, binary string) (string, int, error) {
	out, err := exec.CommandContext(ctx, binary, "--version").Output()
	if err != nil {
		return "", 0, fmt.Errorf("%s --version: %w", binary, err)
	}
	f := strings.Fields(string(out))
	var major, minor, patch int
	if len(f) != 2 {
		return "", 0, fmt.Errorf("%s --version said %q", binary, out)
	}
	if _, err := fmt.Sscanf(f[1], "v%d.%d.%d", &major, &minor, &patch); err != nil || major != 1 {
		return "", 0, fmt.Errorf("%s --version said %q: %v", binary, out, err)
	}
	if minor < 35 {
		return "", 0, fmt.Errorf("kubelet %s is not supported (1.35, 1.36, 1.37 are)", f[1])
	}
	return f[1], minor, nil
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

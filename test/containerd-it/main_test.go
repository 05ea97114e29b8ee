// Package containerdit holds pleg-nri's integration tests: they run against a real, isolated containerd
// (test/containerd-it/harness) with CRI and NRI enabled, and drive it through the CRI as a kubelet does.
package containerdit

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pleg-nri/pleg-nri/internal/testutil/plegnribin"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// env is the containerd every test of the package runs against.
var env *harness.Env

func TestMain(m *testing.M) {
	// BenchmarkScrapeFlood's control: this binary, run again, is a stand-in metrics server.
	if body := os.Getenv(standinMetricsEnv); body != "" {
		os.Exit(serveStandinMetrics(body))
	}
	os.Exit(runTests(m))
}

// runTests sets the environment up, runs the tests and tears it down. A setup or teardown failure fails
// the run with the reason: the integration tests never pass by not running.
func runTests(m *testing.M) (code int) {
	ctx := context.Background()
	start := time.Now()
	// PLEG_NRI_IT_CONTAINERD=docker: containerd in a container (make integration-docker).
	where, err := harness.ContainerdFromEnv()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	env, err = harness.New(ctx, harness.Options{Log: os.Stderr, Containerd: where})
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: cannot set up the containerd integration environment: %v\n", err)
		return 1
	}
	defer func() {
		if err := env.Teardown(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: integration environment teardown: %v\n", err)
			code = 1
		}
		// With containerd gone (its waiter goroutine with it), every goroutine the tests started must
		// be gone too.
		if code == 0 {
			if err := goleak.Find(); err != nil {
				fmt.Fprintf(os.Stderr, "FAIL: goroutines left behind by the tests: %v\n", err)
				code = 1
			}
		}
	}()
	if err := env.Start(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: cannot start containerd: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "harness: containerd %d ready in %s (%s)\n", env.PID, time.Since(start).Round(time.Millisecond), env.Dir)
	defer plegnribin.Cleanup()
	if plegNRIBinary, err = plegnribin.Build(plegnribin.Default); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	code = m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, env.LogTail(150))
	}
	return code
}

// logOnFailure prints containerd's log written during the test when the test fails.
func logOnFailure(t *testing.T) {
	t.Helper()
	offset := env.LogSize()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd log during %s:\n%s", t.Name(), env.LogSince(offset))
		}
	})
}

package containerdit

import (
	"context"
	"syscall"
	"testing"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/plegnri"
)

// plegNRIBinary is the pleg-nri binary built once for the package's tests (by TestMain).
var plegNRIBinary string

// plegNRI is a pleg-nri daemon process run against the test containerd (plegnri.Daemon, with the
// test's failure handling).
type plegNRI struct {
	*plegnri.Daemon
}

// startPlegNRI starts pleg-nri as an external NRI plugin of the test containerd and waits until it is
// ready (NRI registered and synchronized, events subscribed, one relist done). It is stopped when the test ends, and
// its log is printed if the test failed. Its state (the checkpoint) is in a directory of its own, so
// it starts with none. extra flags come last, so they override the defaults.
func startPlegNRI(t testing.TB, extra ...string) *plegNRI {
	t.Helper()
	dir := testutil.ShortTempDir(t, "plegnri-")
	d, err := plegnri.Start(context.Background(), plegnri.Options{Binary: plegNRIBinary, Env: env, Dir: dir, Extra: extra})
	if err != nil {
		t.Fatal(err)
	}
	p := &plegNRI{d}
	t.Cleanup(func() {
		// The front too: a test that leaves a process of pleg-nri behind fails.
		if err := p.Close(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("pleg-nri log:\n%s", p.Log())
			t.Logf("pleg-nri front log:\n%s", p.FrontLog())
		}
	})
	return p
}

// start starts pleg-nri again, with the same flags, after a stop or a kill.
func (p *plegNRI) start(t testing.TB) {
	t.Helper()
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// stop stops pleg-nri with SIGTERM and waits for it.
func (p *plegNRI) stop() { p.Stop() }

// kill kills pleg-nri with SIGKILL and waits for it.
func (p *plegNRI) kill() { p.Kill() }

// signal sends sig to pleg-nri.
func (p *plegNRI) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.Signal(sig); err != nil {
		t.Fatalf("signal %s to pleg-nri: %v", sig, err)
	}
}

// metric returns the sum of a metric's samples whose line contains every filter.
func (p *plegNRI) metric(t testing.TB, name string, filters ...string) float64 {
	t.Helper()
	v, err := p.Metric(name, filters...)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	return v
}

func freeLoopbackAddr(t testing.TB) string {
	t.Helper()
	addr, err := testutil.FreeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

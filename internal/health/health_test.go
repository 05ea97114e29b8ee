package health

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// TestCheck (issue 60): pleg-nri health, the installer pod's readiness probe, passes only while the
// core's /readyz answers 200 and the kubelet's endpoint answers a CRI Version call; a /readyz that says
// why it is not ready, or does not answer, and an endpoint that is missing, accepts without ever
// answering (a stopped front) or answers without naming a runtime each fail it within the timeout,
// with the reason printed.
func TestCheck(t *testing.T) {
	dir := testutil.ShortTempDir(t, "hc-")
	good := filepath.Join(dir, "cri.sock")
	testutil.ServeVersionRuntime(t, good, "fake")
	nameless := filepath.Join(dir, "nameless.sock")
	testutil.ServeVersionRuntime(t, nameless, "")
	// A front that is stopped (SIGSTOP) or wedged: the kernel accepts its connections, nothing answers.
	hung := filepath.Join(dir, "hung.sock")
	hl, err := net.Listen("unix", hung)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hl.Close() })
	missing := filepath.Join(dir, "missing.sock")

	ready, notReady := testutil.ServeReadyz(t), testutil.ServeReadyz(t)
	notReady.Fail("no front serves the CRI endpoint")
	// A core that is stopped: its listener accepts, nothing answers.
	stoppedCore, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stoppedCore.Close() })

	const timeout = 500 * time.Millisecond
	for _, tc := range []struct {
		name, readyz, endpoint string
		healthy                bool
		want                   []string
	}{
		{"healthy", ready.URL, "unix://" + good, true, []string{"/readyz: ok", "cri.sock: ok"}},
		{"core not ready", notReady.URL, good, false, []string{"FAIL: 503 Service Unavailable: no front serves the CRI endpoint", "cri.sock: ok"}},
		{"core stopped", "http://" + stoppedCore.Addr().String() + "/readyz", good, false, []string{"/readyz: FAIL: ", "deadline exceeded", "cri.sock: ok"}},
		{"core gone", "http://127.0.0.1:1/readyz", good, false, []string{"/readyz: FAIL: ", "connection refused"}},
		{"bad readyz URL", "http://127.0.0.1:1/\x7f", good, false, []string{"FAIL: ", "invalid control character", "cri.sock: ok"}},
		{"front stopped", ready.URL, hung, false, []string{"/readyz: ok", "hung.sock: FAIL: CRI Version: ", "DeadlineExceeded"}},
		{"no endpoint", ready.URL, missing, false, []string{"/readyz: ok", "missing.sock: FAIL: CRI Version: "}},
		{"bad endpoint", ready.URL, "relative.sock", false, []string{"/readyz: ok", "endpoint relative.sock: FAIL: "}},
		{"no runtime named", ready.URL, nameless, false, []string{"/readyz: ok", "nameless.sock: FAIL: CRI Version: the answer names no runtime"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			start := time.Now()
			err := Check(context.Background(), &out, tc.readyz, tc.endpoint, timeout)
			took := time.Since(start)
			if tc.healthy && err != nil || !tc.healthy && !errors.Is(err, ErrUnhealthy) {
				t.Errorf("Check: %v, want healthy %v:\n%s", err, tc.healthy, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			if n := strings.Count(out.String(), "\n"); n != 2 {
				t.Errorf("%d lines, want one per check:\n%s", n, out.String())
			}
			// Both checks, each bounded by the timeout.
			if took > 2*timeout+time.Second {
				t.Errorf("took %s, want at most two timeouts of %s", took, timeout)
			}
		})
	}
}

func TestReadyzURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://0.0.0.0:9810/readyz":    "http://127.0.0.1:9810/readyz",
		"http://:9810/readyz":           "http://127.0.0.1:9810/readyz",
		"http://[::]:9810/readyz":       "http://[::1]:9810/readyz",
		"http://10.0.0.2:9810/readyz":   "http://10.0.0.2:9810/readyz",
		"http://127.0.0.1:9810/readyz":  "http://127.0.0.1:9810/readyz",
		"http://localhost:19810/readyz": "http://localhost:19810/readyz",
	} {
		if got, err := ReadyzURL(in); err != nil || got != want {
			t.Errorf("ReadyzURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"https://127.0.0.1:9810/readyz", "http://127.0.0.1/readyz", "http://[::1/readyz", "127.0.0.1:9810"} {
		if got, err := ReadyzURL(bad); err == nil {
			t.Errorf("ReadyzURL(%q) = %q, want an error", bad, got)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// TestHealth (issue 60): pleg-nri health, the installer pod's readiness probe, passes only while the
// core's /readyz answers 200 and the kubelet's endpoint answers a CRI Version call; a /readyz that says
// why it is not ready, or does not answer, and an endpoint that is missing or accepts without ever
// answering (a stopped front) each fail it within the timeout, with the reason printed.
func TestHealth(t *testing.T) {
	dir := testutil.ShortTempDir(t, "hc-")
	// The endpoint: a runtime that answers Version, as the front forwards it to containerd.
	good := filepath.Join(dir, "cri.sock")
	testutil.ServeGRPC(t, good, func(s *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(s, versionOnly{}) })
	// A front that is stopped (SIGSTOP) or wedged: the kernel accepts its connections, nothing answers.
	hung := filepath.Join(dir, "hung.sock")
	hl, err := net.Listen("unix", hung)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hl.Close() })
	missing := filepath.Join(dir, "missing.sock")

	ready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }))
	t.Cleanup(ready.Close)
	notReady := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no front serves the CRI endpoint", http.StatusServiceUnavailable)
	}))
	t.Cleanup(notReady.Close)
	// A core that is stopped: its listener accepts, nothing answers.
	stoppedCore, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stoppedCore.Close() })

	const timeout = 500 * time.Millisecond
	for _, tc := range []struct {
		name, readyz, endpoint string
		code                   int
		want                   []string
	}{
		{"healthy", ready.URL + "/readyz", "unix://" + good, 0, []string{"/readyz: ok", "cri.sock: ok"}},
		{"core not ready", notReady.URL + "/readyz", good, 1, []string{"FAIL: 503 Service Unavailable: no front serves the CRI endpoint", "cri.sock: ok"}},
		{"core stopped", "http://" + stoppedCore.Addr().String() + "/readyz", good, 1, []string{"/readyz: FAIL: ", "deadline exceeded", "cri.sock: ok"}},
		{"core gone", "http://127.0.0.1:1/readyz", good, 1, []string{"/readyz: FAIL: ", "connection refused"}},
		{"front stopped", ready.URL + "/readyz", hung, 1, []string{"/readyz: ok", "hung.sock: FAIL: CRI Version: ", "DeadlineExceeded"}},
		{"no endpoint", ready.URL + "/readyz", missing, 1, []string{"/readyz: ok", "missing.sock: FAIL: CRI Version: "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			start := time.Now()
			err := newApp(&out, &errOut, func(string) string { return "" }).Run(context.Background(),
				[]string{"pleg-nri", "health", "--readyz", tc.readyz, "--runtime-endpoint", tc.endpoint, "--timeout", timeout.String()})
			took := time.Since(start)
			code := exitStatus(err, &errOut)
			got := out.String() + errOut.String()
			if code != tc.code {
				t.Errorf("status %d, want %d:\n%s", code, tc.code, got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("output lacks %q:\n%s", w, got)
				}
			}
			// Both checks, each bounded by the timeout.
			if took > 2*timeout+time.Second {
				t.Errorf("took %s, want at most two timeouts of %s", took, timeout)
			}
		})
	}
}

func TestHealthUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--timeout", "0s"},
		{"--readyz", "https://127.0.0.1:9810/readyz"},
		{"--readyz", "http://127.0.0.1/readyz"},
		{"--runtime-endpoint", "relative.sock"},
		{"extra"},
	} {
		var out bytes.Buffer
		err := newApp(&out, &out, func(string) string { return "" }).Run(context.Background(), append([]string{"pleg-nri", "health"}, args...))
		if code := exitStatus(err, &out); code != 2 {
			t.Errorf("pleg-nri health %v: status %d, want 2 (usage):\n%s", args, code, out.String())
		}
	}
	for in, want := range map[string]string{
		"http://0.0.0.0:9810/readyz":    "http://127.0.0.1:9810/readyz",
		"http://:9810/readyz":           "http://127.0.0.1:9810/readyz",
		"http://[::]:9810/readyz":       "http://[::1]:9810/readyz",
		"http://10.0.0.2:9810/readyz":   "http://10.0.0.2:9810/readyz",
		"http://127.0.0.1:9810/readyz":  "http://127.0.0.1:9810/readyz",
		"http://localhost:19810/readyz": "http://localhost:19810/readyz",
	} {
		if got, err := readyzURL(in); err != nil || got != want {
			t.Errorf("readyzURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

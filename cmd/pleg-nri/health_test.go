package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// TestHealth (issue 60): pleg-nri health exits 0 while both checks pass and 1 when one fails, with
// every check's line printed (the checks are package health's).
func TestHealth(t *testing.T) {
	dir := testutil.ShortTempDir(t, "hc-")
	good := filepath.Join(dir, "cri.sock")
	testutil.ServeVersionRuntime(t, good, "fake")
	ready, notReady := testutil.ServeReadyz(t), testutil.ServeReadyz(t)
	notReady.Fail("no front serves the CRI endpoint")
	for _, tc := range []struct {
		name, readyz string
		code         int
		want         []string
	}{
		{"healthy", ready.URL, 0, []string{"/readyz: ok", "cri.sock: ok"}},
		{"core not ready", notReady.URL, 1, []string{"FAIL: 503 Service Unavailable: no front serves the CRI endpoint", "cri.sock: ok", "pleg-nri: not healthy"}},
	} {
		var out, errOut bytes.Buffer
		err := newApp(&out, &errOut, func(string) string { return "" }).Run(context.Background(),
			[]string{"pleg-nri", "health", "--readyz", tc.readyz, "--runtime-endpoint", "unix://" + good, "--timeout", "2s"})
		code := exitStatus(err, &errOut)
		got := out.String() + errOut.String()
		if code != tc.code {
			t.Errorf("%s: status %d, want %d:\n%s", tc.name, code, tc.code, got)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: output lacks %q:\n%s", tc.name, w, got)
			}
		}
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
}

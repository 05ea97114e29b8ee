package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/conformance"
)

// runConformanceCmd runs `pleg-nri conformance args...` with run standing in for the suite, and no
// environment.
func runConformanceCmd(args []string, run func(context.Context, conformance.Options, time.Duration, bool) error) (string, error) {
	return runConformanceCmdEnv(args, noEnv, run)
}

// runConformanceCmdEnv is runConformanceCmd with getenv as its environment.
func runConformanceCmdEnv(args []string, getenv func(string) string, run func(context.Context, conformance.Options, time.Duration, bool) error) (string, error) {
	var out bytes.Buffer
	cmd := conformanceCommand(getenv, run)
	cmd.Writer, cmd.ErrWriter = &out, &out
	err := cmd.Run(context.Background(), append([]string{"conformance"}, args...))
	return out.String(), err
}

func TestConformanceFlags(t *testing.T) {
	var got conformance.Options
	var timeout time.Duration
	var asJSON bool
	capture := func(_ context.Context, o conformance.Options, d time.Duration, j bool) error {
		got, timeout, asJSON = o, d, j
		return nil
	}
	logPath := filepath.Join(t.TempDir(), "containerd.log")
	steps := filepath.Join(t.TempDir(), "steps")
	if err := os.WriteFile(logPath, []byte("a\nb\nc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runConformanceCmd(nil, capture); err != nil {
		t.Fatal(err)
	}
	if got.Endpoint != "unix:///run/containerd/containerd.sock" || got.Image != conformance.DefaultImage ||
		got.Namespace != conformance.DefaultNamespace || timeout != 10*time.Minute || asJSON || len(got.Checks) != 0 ||
		got.ExpectReplay != conformance.ReplayUndeclared || got.LateWait != 0 || got.LogLines != nil || got.RestartRuntime != nil || got.SlowPods != conformance.DefaultSlowPods {
		t.Errorf("defaults: %+v timeout %s json %v", got, timeout, asJSON)
	}
	args := []string{"-r", "unix:///run/pleg-nri/cri.sock", "--image", "busybox:x", "--namespace", "ns", "--run-id", "r1",
		"--checks", "once, load", "--checks", "order/pod", "--load", "7", "--slow-pods", "20", "--timeout", "2m", "--json",
		"--expect-replay", "all", "--late-wait", "5m10s", "--runtime-log", logPath,
		"--runtime-stop-command", "echo stop >>" + steps, "--runtime-start-command", "echo start >>" + steps}
	if _, err := runConformanceCmd(args, capture); err != nil {
		t.Fatal(err)
	}
	if got.Endpoint != "unix:///run/pleg-nri/cri.sock" || got.Image != "busybox:x" || got.Namespace != "ns" || got.RunID != "r1" ||
		strings.Join(got.Checks, ",") != "once,load,order/pod" || got.Load != 7 || got.SlowPods != 20 || timeout != 2*time.Minute || !asJSON ||
		got.ExpectReplay != conformance.ReplayAll || got.LateWait != 5*time.Minute+10*time.Second || got.LogLines == nil {
		t.Errorf("flags: %+v timeout %s json %v", got, timeout, asJSON)
	}
	if n, err := got.LogLines(); n != 3 || err != nil {
		t.Errorf("--runtime-log counts %d lines (%v), want 3", n, err)
	}
	if got.RestartRuntime == nil {
		t.Error("--runtime-stop-command and --runtime-start-command set no RestartRuntime")
	} else if err := got.RestartRuntime(context.Background(), func(context.Context) error { return nil }); err != nil {
		t.Error(err)
	} else if b, _ := os.ReadFile(steps); string(b) != "stop\nstart\n" {
		t.Errorf("the restart ran %q, want the stop then the start command", b)
	}
	for _, bad := range [][]string{{"extra"}, {"--timeout", "0s"}, {"--nope"}, {"--expect-replay", "some"}, {"--late-wait", "-1s"},
		{"--runtime-stop-command", "true"}, {"--runtime-start-command", "true"}} {
		if _, err := runConformanceCmd(bad, capture); !errors.As(err, new(usageError)) {
			t.Errorf("%v: %v, want a usage error", bad, err)
		}
	}
	out, err := runConformanceCmd([]string{"--list"}, capture)
	if err != nil || !strings.Contains(out, "once/exit-0") || !strings.Contains(out, "exactly once") {
		t.Errorf("--list: %v\n%s", err, out)
	}
}

// TestConformanceEndpoint: --runtime-endpoint, else $CONTAINER_RUNTIME_ENDPOINT (as crictl reads
// it), else containerd's socket.
func TestConformanceEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		getenv func(string) string
		want   string
	}{
		{"default", nil, noEnv, "unix:///run/containerd/containerd.sock"},
		{"environment", nil, endpointEnv("unix:///run/pleg-nri/cri.sock"), "unix:///run/pleg-nri/cri.sock"},
		{"the flag over the environment", []string{"--runtime-endpoint", "/run/x.sock"}, endpointEnv("unix:///run/pleg-nri/cri.sock"), "/run/x.sock"},
		{"the short flag over the environment", []string{"-r", "tcp://127.0.0.1:1"}, endpointEnv("unix:///run/pleg-nri/cri.sock"), "tcp://127.0.0.1:1"},
		{"an empty environment variable", nil, endpointEnv(""), "unix:///run/containerd/containerd.sock"},
	} {
		var got string
		capture := func(_ context.Context, o conformance.Options, _ time.Duration, _ bool) error {
			got = o.Endpoint
			return nil
		}
		if _, err := runConformanceCmdEnv(tc.args, tc.getenv, capture); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got != tc.want {
			t.Errorf("%s: endpoint %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestRunConformance: an unknown check fails; an endpoint where nothing serves fails the command,
// naming it.
func TestRunConformance(t *testing.T) {
	ctx := context.Background()
	var out bytes.Buffer
	err := runConformance(&out)(ctx, conformance.Options{Image: "x", Checks: []string{"nope"}}, time.Minute, false)
	if err == nil || !strings.Contains(err.Error(), `no check is named "nope"`) {
		t.Errorf("unknown check: %v", err)
	}
	sock := "unix://" + filepath.Join(t.TempDir(), "cri.sock")
	err = runConformance(&out)(ctx, conformance.Options{Endpoint: sock, Image: "x"}, time.Minute, false)
	if err == nil || !strings.Contains(err.Error(), "cannot reach the CRI endpoint "+sock) {
		t.Errorf("no endpoint: %v", err)
	}
}

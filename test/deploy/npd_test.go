package deploy

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/internal/testutil/plegnribin"
)

// problemGauge is NPD's metric of a condition's status: 1 while the condition type is True with
// reason, 0 once it is not.
var problemGauge = regexp.MustCompile(`(?m)^problem_gauge\{reason="PlegNRINotServing",type="PlegNRIUnhealthy"\} ([0-9.]+)$`)

// TestNPD (issue 60): the real node-problem-detector (make npd: k8s.io/node-problem-detector v1.34.0
// from the Go module proxy), run standalone with deploy/npd's monitor and script against a faked
// pleg-nri (its core's /readyz and its endpoint), raises PlegNRIUnhealthy (reason PlegNRINotServing)
// when /readyz fails and clears it when it answers again, as its problem_gauge shows. Run by make
// test-deploy only (PLEG_NRI_NPD), with the times it took.
func TestNPD(t *testing.T) {
	npd := os.Getenv("PLEG_NRI_NPD")
	need(t, npd != "", "PLEG_NRI_NPD is not set (make test-deploy sets it to make npd's node-problem-detector)")
	_, err := os.Stat(npd)
	need(t, err == nil, "no node-problem-detector at %s (make npd)", npd)

	dir := testutil.ShortTempDir(t, "npd-")
	sock := filepath.Join(dir, "cri.sock")
	testutil.ServeVersionRuntime(t, sock, "fake")
	readyz := testutil.ServeReadyz(t)

	// The shipped monitor, with the script's path in this checkout and a shorter interval.
	data, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "npd", "pleg-nri-monitor.json"))
	if err != nil {
		t.Fatal(err)
	}
	var monitor map[string]any
	if err := json.Unmarshal(data, &monitor); err != nil {
		t.Fatal(err)
	}
	monitor["pluginConfig"].(map[string]any)["invoke_interval"] = "2s"
	monitor["rules"].([]any)[0].(map[string]any)["path"] = filepath.Join(repoRoot(), "deploy", "npd", "check-pleg-nri.sh")
	data, _ = json.Marshal(monitor)
	config := filepath.Join(dir, "monitor.json")
	if err := os.WriteFile(config, data, 0o644); err != nil {
		t.Fatal(err)
	}
	addr, err := testutil.FreeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	port := addr[strings.LastIndex(addr, ":")+1:]
	var log testutil.SyncBuffer
	cmd := exec.Command(npd, "--logtostderr", "--config.custom-plugin-monitor="+config, "--enable-k8s-exporter=false",
		"--hostname-override=pleg-nri-test", "--port=0", "--prometheus-address=127.0.0.1", "--prometheus-port="+port)
	cmd.Env = append(os.Environ(), "PLEG_NRI_BIN="+plegnribin.Binary(t, plegnribin.Default), "PLEG_NRI_READYZ="+readyz.URL,
		"PLEG_NRI_ENDPOINT=unix://"+sock, "PLEG_NRI_HEALTH_TIMEOUT=1s")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		testutil.StopProcess(cmd.Process, done, os.Interrupt, 5*time.Second)
		if t.Failed() {
			t.Logf("node-problem-detector's log:\n%s", log.String())
		}
	})

	// gauge is problem_gauge for the condition, "" while NPD does not show it.
	gauge := func() (string, string) {
		resp, err := http.Get("http://127.0.0.1:" + port + "/metrics")
		if err != nil {
			return "", err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if m := problemGauge.FindSubmatch(body); m != nil {
			return string(m[1]), string(m[0])
		}
		return "", "no problem_gauge of PlegNRIUnhealthy in /metrics"
	}
	wait := func(what, want string, d time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		if err := pollDetail(d, 200*time.Millisecond, what, func() (bool, string) {
			v, detail := gauge()
			return v == want, detail
		}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return time.Since(start)
	}
	wait("the condition False while pleg-nri serves", "0", 60*time.Second)
	readyz.Fail("NRI plugin not registered")
	raised := wait("the condition raised once /readyz fails", "1", 30*time.Second)
	readyz.Fail("")
	cleared := wait("the condition cleared once /readyz answers", "0", 30*time.Second)
	if !strings.Contains(log.String(), "PlegNRINotServing") {
		t.Errorf("NPD's log does not name PlegNRINotServing:\n%s", log.String())
	}
	t.Logf("figures: node-problem-detector %s, invoke_interval 2s: PlegNRIUnhealthy raised %s after /readyz failed, cleared %s after it answered",
		filepath.Base(filepath.Dir(npd)), raised.Round(100*time.Millisecond), cleared.Round(100*time.Millisecond))
}

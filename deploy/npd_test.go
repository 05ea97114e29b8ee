package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/internal/testutil/plegnribin"
)

// npdMonitor is the part of node-problem-detector's custom plugin monitor configuration checked here
// (k8s.io/node-problem-detector pkg/custompluginmonitor/types/config.go).
type npdMonitor struct {
	Plugin       string `json:"plugin"`
	PluginConfig struct {
		InvokeInterval string `json:"invoke_interval"`
		Timeout        string `json:"timeout"`
	} `json:"pluginConfig"`
	Conditions []struct{ Type, Reason, Message string } `json:"conditions"`
	Rules      []struct {
		Type, Condition, Reason, Path, Timeout string
	} `json:"rules"`
}

// TestNPDConfig (issue 60): deploy/npd's monitor raises the condition PlegNRIUnhealthy (reason
// PlegNRINotServing) from the script, at the path where the example DaemonSet mounts it; its timeout
// leaves room for pleg-nri health's two checks.
func TestNPDConfig(t *testing.T) {
	data, err := os.ReadFile("npd/pleg-nri-monitor.json")
	if err != nil {
		t.Fatal(err)
	}
	var m npdMonitor
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("pleg-nri-monitor.json: %v", err)
	}
	if m.Plugin != "custom" || len(m.Conditions) != 1 || m.Conditions[0].Type != "PlegNRIUnhealthy" || m.Conditions[0].Reason != "PlegNRIServing" {
		t.Errorf("the monitor: plugin %q, conditions %+v", m.Plugin, m.Conditions)
	}
	if len(m.Rules) != 1 {
		t.Fatalf("rules: %+v", m.Rules)
	}
	r := m.Rules[0]
	if r.Type != "permanent" || r.Condition != "PlegNRIUnhealthy" || r.Reason != "PlegNRINotServing" || r.Path != "/config/check-pleg-nri.sh" {
		t.Errorf("the rule: %+v", r)
	}
	for _, d := range []string{r.Timeout, m.PluginConfig.Timeout} {
		if to, err := time.ParseDuration(d); err != nil || to <= 2*2*time.Second {
			t.Errorf("timeout %q: want more than the script's two checks of 2s", d)
		}
	}
	if iv, err := time.ParseDuration(m.PluginConfig.InvokeInterval); err != nil || iv > 30*time.Second {
		t.Errorf("invoke_interval %q: want a broken node seen within 30 s", m.PluginConfig.InvokeInterval)
	}
	// The example DaemonSet: the config at /config (its ConfigMap holds both files), executable.
	ds, err := os.ReadFile("npd/npd-daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, doc := range strings.Split(string(ds), "\n---\n") {
		var o struct {
			Kind string
			Spec struct {
				Template struct {
					Spec struct {
						HostNetwork bool `json:"hostNetwork"`
						Containers  []struct {
							Command      []string
							VolumeMounts []struct{ Name, MountPath string } `json:"volumeMounts"`
						}
						Volumes []struct {
							Name      string
							ConfigMap *struct {
								Name        string
								DefaultMode int `json:"defaultMode"`
							} `json:"configMap"`
						}
					}
				}
			}
		}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("npd-daemonset.yaml: %v", err)
		}
		if o.Kind != "DaemonSet" {
			continue
		}
		found = true
		s := o.Spec.Template.Spec
		if !s.HostNetwork || len(s.Containers) != 1 || !strings.Contains(strings.Join(s.Containers[0].Command, " "), "--config.custom-plugin-monitor=/config/pleg-nri-monitor.json") {
			t.Errorf("the DaemonSet's pod: hostNetwork %v, containers %+v", s.HostNetwork, s.Containers)
		}
		mounts := map[string]string{}
		for _, vm := range s.Containers[0].VolumeMounts {
			mounts[vm.MountPath] = vm.Name
		}
		for _, v := range s.Volumes {
			if v.Name == mounts["/config"] && (v.ConfigMap == nil || v.ConfigMap.DefaultMode != 0o755) {
				t.Errorf("the config volume %+v: want a ConfigMap, mode 0755 (the script is run)", v)
			}
		}
		for _, p := range []string{"/config", "/host/run/pleg-nri", "/host/usr/local/bin", "/host/opt/nri/plugins"} {
			if mounts[p] == "" {
				t.Errorf("the DaemonSet mounts nothing at %s (the script's defaults)", p)
			}
		}
	}
	if !found {
		t.Error("npd-daemonset.yaml has no DaemonSet")
	}
	if !strings.Contains(string(ds), "--from-file=deploy/npd/pleg-nri-monitor.json --from-file=deploy/npd/check-pleg-nri.sh") {
		t.Error("npd-daemonset.yaml does not say how to make its ConfigMap from both files")
	}
}

// TestNPDCheckScript (issue 60): deploy/npd/check-pleg-nri.sh follows NPD's plugin protocol: exit 0
// and "pleg-nri serves this node" while pleg-nri health passes, exit 1 and the failed check (the
// condition's message) when the core is not ready or the endpoint does not answer, and exit 1 on a node
// with no pleg-nri binary.
func TestNPDCheckScript(t *testing.T) {
	// pleg-nri health's target faked: a /readyz and a CRI endpoint answering Version.
	sock := filepath.Join(testutil.ShortTempDir(t, "npd-"), "cri.sock")
	testutil.ServeVersionRuntime(t, sock, "fake")
	readyz := testutil.ServeReadyz(t)
	env := []string{"PLEG_NRI_BIN=" + plegnribin.Binary(t, plegnribin.Default), "PLEG_NRI_READYZ=" + readyz.URL,
		"PLEG_NRI_ENDPOINT=unix://" + sock, "PLEG_NRI_HEALTH_TIMEOUT=1s"}
	run := func(what string, env []string, wantCode int, want string) {
		t.Helper()
		cmd := exec.Command("sh", "npd/check-pleg-nri.sh")
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.Output()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != wantCode || !strings.HasPrefix(string(out), want) || strings.Count(string(out), "\n") != 1 {
			t.Errorf("%s: exit %d %q, want %d and one line starting %q", what, code, out, wantCode, want)
		}
	}
	run("healthy", env, 0, "pleg-nri serves this node")
	readyz.Fail("NRI plugin not registered")
	run("core not ready", env, 1, "core "+readyz.URL+": FAIL")
	readyz.Fail("")
	run("healthy again", env, 0, "pleg-nri serves this node")
	bad := append(append([]string{}, env...), "PLEG_NRI_ENDPOINT=unix:///nonexistent/cri.sock")
	run("no endpoint", bad, 1, "endpoint unix:///nonexistent/cri.sock: FAIL")
	noBin := append(append([]string{}, env...), "PLEG_NRI_BIN=")
	if _, err := os.Stat("/host/usr/local/bin/pleg-nri"); err == nil {
		t.Skip("this machine has /host/usr/local/bin/pleg-nri")
	}
	run("not installed", noBin, 1, "pleg-nri is not installed on this node")
}

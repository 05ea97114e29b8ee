package kubeletconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// kubeadmConfig is the shape of the KubeletConfiguration kubeadm writes (kind's, abridged).
const kubeadmConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
cgroupDriver: systemd
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
kind: KubeletConfiguration
`

func TestEditKubeletConfig(t *testing.T) {
	const ours = "unix:///run/pleg-nri/cri.sock"
	for _, tc := range []struct {
		name        string
		in          string
		edit        Edit
		wantChanged bool
		want        map[string]any // the keys checked
	}{
		{"switch", kubeadmConfig, Edit{ours, "true"}, true,
			map[string]any{"containerRuntimeEndpoint": ours, "featureGates": map[string]any{"EventedPLEG": true}, "cgroupDriver": "systemd"}},
		{"already switched", strings.Replace(kubeadmConfig, "unix:///run/containerd/containerd.sock", ours, 1) + "featureGates:\n  EventedPLEG: true\n",
			Edit{ours, "true"}, false, map[string]any{"containerRuntimeEndpoint": ours}},
		{"other gates kept", kubeadmConfig + "featureGates:\n  Foo: true\n", Edit{"", "true"}, true,
			map[string]any{"featureGates": map[string]any{"EventedPLEG": true, "Foo": true}}},
		{"switch back", strings.Replace(kubeadmConfig, "unix:///run/containerd/containerd.sock", ours, 1) + "featureGates:\n  EventedPLEG: true\n",
			Edit{"unix:///run/containerd/containerd.sock", "remove"}, true,
			map[string]any{"containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock", "featureGates": nil}},
		{"remove keeps other gates", kubeadmConfig + "featureGates:\n  EventedPLEG: true\n  Foo: false\n", Edit{"", "remove"}, true,
			map[string]any{"featureGates": map[string]any{"Foo": false}}},
		{"gate only", kubeadmConfig, Edit{"", "false"}, true,
			map[string]any{"containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock", "featureGates": map[string]any{"EventedPLEG": false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, changed, err := EditConfig([]byte(tc.in), tc.edit)
			if err != nil {
				t.Fatal(err)
			}
			if changed != tc.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tc.wantChanged)
			}
			var got map[string]any
			if err := yaml.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			for k, want := range tc.want {
				if diff := cmp.Diff(want, got[k]); diff != "" {
					t.Errorf("%s (-want +got):\n%s", k, diff)
				}
			}
			if got["kind"] != "KubeletConfiguration" || got["authentication"] == nil {
				t.Errorf("other keys lost: %v", got)
			}
		})
	}
	if _, _, err := EditConfig([]byte("kind: Pod\n"), Edit{Endpoint: "x"}); err == nil {
		t.Error("a Pod was edited as a kubelet configuration")
	}
	if _, _, err := EditConfig([]byte(kubeadmConfig), Edit{EventedPLEG: "yes"}); err == nil {
		t.Error("EventedPLEG=yes accepted")
	}
}

func TestEditKubeadmFlags(t *testing.T) {
	in := "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock --node-ip=172.18.0.2\"\n"
	out, changed := EditKubeadmFlags([]byte(in), "unix:///run/pleg-nri/cri.sock")
	want := "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/pleg-nri/cri.sock --node-ip=172.18.0.2\"\n"
	if !changed || string(out) != want {
		t.Errorf("got %q (changed %v), want %q", out, changed, want)
	}
	if _, changed := EditKubeadmFlags(out, "unix:///run/pleg-nri/cri.sock"); changed {
		t.Error("a second edit changed it again")
	}
	noFlag := "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2\"\n"
	if out, changed := EditKubeadmFlags([]byte(noFlag), "unix:///x"); changed || string(out) != noFlag {
		t.Errorf("a file without the flag was changed: %q", out)
	}
}

// TestApply: the configuration and kubeadm's flags file switched to pleg-nri and back, each change
// said once, the configuration's mode kept.
func TestApply(t *testing.T) {
	dir := t.TempDir()
	config, flags := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "kubeadm-flags.env")
	if err := os.WriteFile(config, []byte(kubeadmConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(flags, []byte("KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(endpoint, evented string) string {
		t.Helper()
		changed, err := Apply(config, flags, Edit{Endpoint: endpoint, EventedPLEG: evented})
		if err != nil {
			t.Fatalf("%s %s: %v", endpoint, evented, err)
		}
		return map[bool]string{true: "changed", false: "unchanged"}[changed]
	}
	if got := run("unix:///run/pleg-nri/cri.sock", "true"); got != "changed" {
		t.Errorf("first switch: %s", got)
	}
	if got := run("unix:///run/pleg-nri/cri.sock", "true"); got != "unchanged" {
		t.Errorf("second switch: %s", got)
	}
	data, _ := os.ReadFile(flags)
	if !strings.Contains(string(data), "--container-runtime-endpoint=unix:///run/pleg-nri/cri.sock") {
		t.Errorf("kubeadm-flags.env: %s", data)
	}
	if fi, _ := os.Stat(config); fi.Mode().Perm() != 0o600 {
		t.Errorf("config mode %v, want 0600 kept", fi.Mode().Perm())
	}
	if got := run("unix:///run/containerd/containerd.sock", "remove"); got != "changed" {
		t.Errorf("switch back: %s", got)
	}
	data, _ = os.ReadFile(config)
	if strings.Contains(string(data), "EventedPLEG") || !strings.Contains(string(data), "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock") {
		t.Errorf("after switching back:\n%s", data)
	}
}

func TestApplyErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Apply(filepath.Join(dir, "missing.yaml"), filepath.Join(dir, "flags"), Edit{}); err == nil {
		t.Error("a missing configuration: no error")
	}
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte("kind: Pod\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(config, filepath.Join(dir, "flags"), Edit{Endpoint: "x"}); err == nil {
		t.Error("a configuration of another kind: no error")
	}
	if err := os.WriteFile(config, []byte(kubeadmConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(config, dir, Edit{Endpoint: "x"}); err == nil {
		t.Error("a flags file that is a directory: no error")
	}
}

// TestCheck (issue 60): Check names every setting that differs from the switch (as after `kubeadm
// upgrade node` rewrote the configuration from its ConfigMap), none once Apply made them so, and
// writes nothing.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	config, flags := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "kubeadm-flags.env")
	if err := os.WriteFile(config, []byte(kubeadmConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(flags, []byte("KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := Edit{Endpoint: "unix:///run/pleg-nri/cri.sock", EventedPLEG: "true"}
	drift, err := Check(config, flags, e)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		config + ": containerRuntimeEndpoint is unix:///run/containerd/containerd.sock, want unix:///run/pleg-nri/cri.sock",
		config + ": featureGates.EventedPLEG is unset, want true",
		flags + ": --container-runtime-endpoint is unix:///run/containerd/containerd.sock, want unix:///run/pleg-nri/cri.sock",
	}
	if diff := cmp.Diff(want, drift); diff != "" {
		t.Errorf("drift (-want +got):\n%s", diff)
	}
	if data, _ := os.ReadFile(config); string(data) != kubeadmConfig {
		t.Errorf("Check wrote the configuration:\n%s", data)
	}
	if _, err := Apply(config, flags, e); err != nil {
		t.Fatal(err)
	}
	if drift, err := Check(config, flags, e); err != nil || len(drift) != 0 {
		t.Errorf("after Apply: drift %v, %v", drift, err)
	}
	// The gate alone turned off.
	data, _ := os.ReadFile(config)
	if err := os.WriteFile(config, []byte(strings.Replace(string(data), "EventedPLEG: true", "EventedPLEG: false", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if drift, _ := Check(config, flags, e); len(drift) != 1 || !strings.Contains(drift[0], "featureGates.EventedPLEG is false, want true") {
		t.Errorf("gate off: drift %v", drift)
	}
	if drift, _ := Check(config, flags, Edit{EventedPLEG: "remove"}); len(drift) != 1 || !strings.Contains(drift[0], "want it unset") {
		t.Errorf("remove: drift %v", drift)
	}
	if _, err := Check(filepath.Join(dir, "missing.yaml"), flags, e); err == nil {
		t.Error("a missing configuration: no error")
	}
}

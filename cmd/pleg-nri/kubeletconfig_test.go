package main

import (
	"bytes"
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
		edit        kubeletEdit
		wantChanged bool
		want        map[string]any // the keys checked
	}{
		{"switch", kubeadmConfig, kubeletEdit{ours, "true"}, true,
			map[string]any{"containerRuntimeEndpoint": ours, "featureGates": map[string]any{"EventedPLEG": true}, "cgroupDriver": "systemd"}},
		{"already switched", strings.Replace(kubeadmConfig, "unix:///run/containerd/containerd.sock", ours, 1) + "featureGates:\n  EventedPLEG: true\n",
			kubeletEdit{ours, "true"}, false, map[string]any{"containerRuntimeEndpoint": ours}},
		{"other gates kept", kubeadmConfig + "featureGates:\n  Foo: true\n", kubeletEdit{"", "true"}, true,
			map[string]any{"featureGates": map[string]any{"EventedPLEG": true, "Foo": true}}},
		{"switch back", strings.Replace(kubeadmConfig, "unix:///run/containerd/containerd.sock", ours, 1) + "featureGates:\n  EventedPLEG: true\n",
			kubeletEdit{"unix:///run/containerd/containerd.sock", "remove"}, true,
			map[string]any{"containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock", "featureGates": nil}},
		{"remove keeps other gates", kubeadmConfig + "featureGates:\n  EventedPLEG: true\n  Foo: false\n", kubeletEdit{"", "remove"}, true,
			map[string]any{"featureGates": map[string]any{"Foo": false}}},
		{"gate only", kubeadmConfig, kubeletEdit{"", "false"}, true,
			map[string]any{"containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock", "featureGates": map[string]any{"EventedPLEG": false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, changed, err := editKubeletConfig([]byte(tc.in), tc.edit)
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
	if _, _, err := editKubeletConfig([]byte("kind: Pod\n"), kubeletEdit{endpoint: "x"}); err == nil {
		t.Error("a Pod was edited as a kubelet configuration")
	}
	if _, _, err := editKubeletConfig([]byte(kubeadmConfig), kubeletEdit{eventedPLEG: "yes"}); err == nil {
		t.Error("EventedPLEG=yes accepted")
	}
}

func TestEditKubeadmFlags(t *testing.T) {
	in := "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock --node-ip=172.18.0.2\"\n"
	out, changed := editKubeadmFlags([]byte(in), "unix:///run/pleg-nri/cri.sock")
	want := "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/pleg-nri/cri.sock --node-ip=172.18.0.2\"\n"
	if !changed || string(out) != want {
		t.Errorf("got %q (changed %v), want %q", out, changed, want)
	}
	if _, changed := editKubeadmFlags(out, "unix:///run/pleg-nri/cri.sock"); changed {
		t.Error("a second edit changed it again")
	}
	noFlag := "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2\"\n"
	if out, changed := editKubeadmFlags([]byte(noFlag), "unix:///x"); changed || string(out) != noFlag {
		t.Errorf("a file without the flag was changed: %q", out)
	}
}

func TestRunKubeletConfig(t *testing.T) {
	dir := t.TempDir()
	config, flags := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "kubeadm-flags.env")
	if err := os.WriteFile(config, []byte(kubeadmConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(flags, []byte("KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if err := runKubeletConfig(append([]string{"--config", config, "--kubeadm-flags", flags}, args...), &out, &errb); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, errb.String())
		}
		return strings.TrimSpace(out.String())
	}
	if got := run("--container-runtime-endpoint", "unix:///run/pleg-nri/cri.sock", "--evented-pleg", "true"); got != "changed" {
		t.Errorf("first switch: %s", got)
	}
	if got := run("--container-runtime-endpoint", "unix:///run/pleg-nri/cri.sock", "--evented-pleg", "true"); got != "unchanged" {
		t.Errorf("second switch: %s", got)
	}
	data, _ := os.ReadFile(flags)
	if !strings.Contains(string(data), "--container-runtime-endpoint=unix:///run/pleg-nri/cri.sock") {
		t.Errorf("kubeadm-flags.env: %s", data)
	}
	if fi, _ := os.Stat(config); fi.Mode().Perm() != 0o600 {
		t.Errorf("config mode %v, want 0600 kept", fi.Mode().Perm())
	}
	if got := run("--container-runtime-endpoint", "unix:///run/containerd/containerd.sock", "--evented-pleg", "remove"); got != "changed" {
		t.Errorf("switch back: %s", got)
	}
	data, _ = os.ReadFile(config)
	if strings.Contains(string(data), "EventedPLEG") || !strings.Contains(string(data), "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock") {
		t.Errorf("after switching back:\n%s", data)
	}
}

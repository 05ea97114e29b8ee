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
		{"switch", kubeadmConfig, Edit{Endpoint: ours, EventedPLEG: "true"}, true,
			map[string]any{"containerRuntimeEndpoint": ours, "featureGates": map[string]any{"EventedPLEG": true}, "cgroupDriver": "systemd"}},
		{"already switched", strings.Replace(kubeadmConfig, "unix:///run/containerd/containerd.sock", ours, 1) + "featureGates:\n  EventedPLEG: true\n",
			Edit{Endpoint: ours, EventedPLEG: "true"}, false, map[string]any{"containerRuntimeEndpoint": ours}},
		{"other gates kept", kubeadmConfig + "featureGates:\n  Foo: true\n", Edit{EventedPLEG: "true"}, true,
			map[string]any{"featureGates": map[string]any{"EventedPLEG": true, "Foo": true}}},
		{"switch back", strings.Replace(kubeadmConfig, "unix:///run/containerd/containerd.sock", ours, 1) + "featureGates:\n  EventedPLEG: true\n",
			Edit{Endpoint: "unix:///run/containerd/containerd.sock", EventedPLEG: "remove"}, true,
			map[string]any{"containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock", "featureGates": nil}},
		{"remove keeps other gates", kubeadmConfig + "featureGates:\n  EventedPLEG: true\n  Foo: false\n", Edit{EventedPLEG: "remove"}, true,
			map[string]any{"featureGates": map[string]any{"Foo": false}}},
		{"gate only", kubeadmConfig, Edit{EventedPLEG: "false"}, true,
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
	out, changed := EditKubeadmFlags([]byte(in), "unix:///run/pleg-nri/cri.sock", "")
	want := "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/pleg-nri/cri.sock --node-ip=172.18.0.2\"\n"
	if !changed || string(out) != want {
		t.Errorf("got %q (changed %v), want %q", out, changed, want)
	}
	if _, changed := EditKubeadmFlags(out, "unix:///run/pleg-nri/cri.sock", ""); changed {
		t.Error("a second edit changed it again")
	}
	noFlag := "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2\"\n"
	if out, changed := EditKubeadmFlags([]byte(noFlag), "unix:///x", "unix:///y"); changed || string(out) != noFlag {
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
	e := Edit{Endpoint: "unix:///run/pleg-nri/cri.sock", EventedPLEG: "true", ImageEndpoint: "unix:///run/containerd/containerd.sock"}
	drift, err := Check(config, flags, e)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		config + ": containerRuntimeEndpoint is unix:///run/containerd/containerd.sock, want unix:///run/pleg-nri/cri.sock",
		config + ": imageServiceEndpoint is unset, want unix:///run/containerd/containerd.sock",
		config + ": featureGates.EventedPLEG is unset, want true",
		flags + ": --container-runtime-endpoint is unix:///run/containerd/containerd.sock, want unix:///run/pleg-nri/cri.sock",
		flags + ": --image-service-endpoint is unset, want unix:///run/containerd/containerd.sock",
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

// TestEditImageServiceEndpoint (issue 58): imageServiceEndpoint is set (the kubelet's image calls then go
// to containerd, not through pleg-nri), removed, or left.
func TestEditImageServiceEndpoint(t *testing.T) {
	const containerd = "unix:///run/containerd/containerd.sock"
	for _, tc := range []struct {
		name        string
		in          string
		image       string
		wantChanged bool
		want        any // imageServiceEndpoint after the edit, nil: absent
	}{
		{"set", kubeadmConfig, containerd, true, containerd},
		{"already set", kubeadmConfig + "imageServiceEndpoint: " + containerd + "\n", containerd, false, containerd},
		{"another replaced", kubeadmConfig + "imageServiceEndpoint: unix:///run/other.sock\n", containerd, true, containerd},
		{"remove", kubeadmConfig + "imageServiceEndpoint: " + containerd + "\n", "remove", true, nil},
		{"remove absent", kubeadmConfig, "remove", false, nil},
		{"left", kubeadmConfig + "imageServiceEndpoint: unix:///run/other.sock\n", "", false, "unix:///run/other.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, changed, err := EditConfig([]byte(tc.in), Edit{ImageEndpoint: tc.image})
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
			if diff := cmp.Diff(tc.want, got["imageServiceEndpoint"]); diff != "" {
				t.Errorf("imageServiceEndpoint (-want +got):\n%s", diff)
			}
			if got["containerRuntimeEndpoint"] != containerd {
				t.Errorf("containerRuntimeEndpoint changed: %v", got["containerRuntimeEndpoint"])
			}
		})
	}
}

// TestEditKubeadmFlagsImage: --image-service-endpoint goes next to kubeadm's --container-runtime-endpoint
// (and only where that is), an existing one is changed, and the one added is removed again exactly.
func TestEditKubeadmFlagsImage(t *testing.T) {
	const containerd, ours = "unix:///run/containerd/containerd.sock", "unix:///run/pleg-nri/cri.sock"
	in := "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=" + containerd + " --node-ip=172.18.0.2\"\n"
	switched := "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=" + ours + " --image-service-endpoint=" + containerd + " --node-ip=172.18.0.2\"\n"
	for _, tc := range []struct {
		name, in, endpoint, image, want string
	}{
		{"switch", in, ours, containerd, switched},
		{"switched again", switched, ours, containerd, switched},
		{"back", switched, containerd, "remove", in},
		{"no runtime flag", "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2\"\n", ours, containerd, "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2\"\n"},
		{"existing flag changed", "A=\"--image-service-endpoint unix:///x.sock --container-runtime-endpoint=" + containerd + "\"\n", ours, containerd,
			"A=\"--image-service-endpoint=" + containerd + " --container-runtime-endpoint=" + ours + "\"\n"},
		{"existing flag set back", "A=\"--image-service-endpoint=" + containerd + "\"\n", "", "unix:///x.sock", "A=\"--image-service-endpoint=unix:///x.sock\"\n"},
		{"image left", in, ours, "", strings.Replace(in, containerd, ours, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, changed := EditKubeadmFlags([]byte(tc.in), tc.endpoint, tc.image)
			if string(out) != tc.want || changed != (tc.want != tc.in) {
				t.Errorf("got %q (changed %v), want %q", out, changed, tc.want)
			}
		})
	}
}

// TestApplyRecord (issue 58): the switch records the kubelet's imageServiceEndpoint as it was (absent
// here, as kubeadm writes it) before setting it, and "restore" puts it back exactly and removes the
// record; a second switch (a re-apply after a drift) keeps the first record.
func TestApplyRecord(t *testing.T) {
	const containerd, ours = "unix:///run/containerd/containerd.sock", "unix:///run/pleg-nri/cri.sock"
	for _, tc := range []struct{ name, config, flags string }{
		{"absent", kubeadmConfig, "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=" + containerd + " --node-ip=172.18.0.2\"\n"},
		{"set", kubeadmConfig + "imageServiceEndpoint: unix:///run/images.sock\n",
			"KUBELET_KUBEADM_ARGS=\"--image-service-endpoint=unix:///run/images.sock --container-runtime-endpoint=" + containerd + "\"\n"},
		{"no flags file", kubeadmConfig, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			config, flags, record := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "kubeadm-flags.env"), filepath.Join(dir, "pleg-nri", "record")
			if err := os.WriteFile(config, []byte(tc.config), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.flags != "" {
				if err := os.WriteFile(flags, []byte(tc.flags), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			sw := Edit{Endpoint: ours, EventedPLEG: "true", ImageEndpoint: containerd, Record: record}
			for i := 0; i < 2; i++ {
				if _, err := Apply(config, flags, sw); err != nil {
					t.Fatal(err)
				}
				if drift, err := Check(config, flags, sw); err != nil || len(drift) != 0 {
					t.Errorf("after the switch: drift %v, %v", drift, err)
				}
				var got map[string]any
				data, _ := os.ReadFile(config)
				_ = yaml.Unmarshal(data, &got)
				if got["imageServiceEndpoint"] != containerd {
					t.Errorf("switch %d: imageServiceEndpoint %v", i, got["imageServiceEndpoint"])
				}
				// A drift (kubeadm upgrade node) between the two switches: the record stays the first one.
				if err := os.WriteFile(config, []byte(tc.config), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := Apply(config, flags, sw); err != nil {
				t.Fatal(err)
			}
			back := Edit{Endpoint: containerd, EventedPLEG: "remove", ImageEndpoint: "restore", Record: record}
			if changed, err := Apply(config, flags, back); err != nil || !changed {
				t.Fatalf("restore: %v %v", changed, err)
			}
			data, _ := os.ReadFile(config)
			var got, want map[string]any
			_ = yaml.Unmarshal(data, &got)
			_ = yaml.Unmarshal([]byte(tc.config), &want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("the configuration after restore (-before +after):\n%s", diff)
			}
			fdata, err := os.ReadFile(flags)
			if tc.flags == "" {
				if err == nil {
					t.Errorf("a flags file was made: %s", fdata)
				}
			} else if string(fdata) != tc.flags {
				t.Errorf("the flags file after restore:\n%s\nwant\n%s", fdata, tc.flags)
			}
			if _, err := os.Stat(record); !os.IsNotExist(err) {
				t.Errorf("the record is still there after restore: %v", err)
			}
			// Restore with no record (a switch of an older pleg-nri, which did not set it): left as it is.
			if changed, err := Apply(config, flags, back); err != nil || changed {
				t.Errorf("restore again: %v %v", changed, err)
			}
		})
	}
}

package deploy

// deploy/node.sh (the Helm chart's node agent) is run here on a /proc-like tree of its own: which host
// processes it counts as this install's, to stop them on uninstall and on a switch of mode. The rest
// of node.sh runs against a real systemd node in test/deploy (make test-deploy).

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/internal/testutil/plegnribin"
)

// TestMain runs the tests and removes the pleg-nri they built.
func TestMain(m *testing.M) {
	code := m.Run()
	plegnribin.Cleanup()
	os.Exit(code)
}

// fakeProc is one process of a fake /proc: its exe link's target ("" for none, as a kernel thread),
// its argv and its cgroup file.
type fakeProc struct {
	pid, exe string
	argv     []string
	cgroup   string
}

// TestNodeProcesses (issue 56): node.sh finds this install's cores and fronts of both modes, those
// still running a binary an upgrade replaced ("PATH (deleted)", which uninstall used to miss) included,
// and leaves other binaries, other paths and pods' processes alone.
func TestNodeProcesses(t *testing.T) {
	proc := t.TempDir()
	for _, p := range []fakeProc{
		{"100", "/opt/nri/plugins/10-pleg-nri (deleted)", []string{"/opt/nri/plugins/10-pleg-nri"}, "0::/system.slice/containerd.service\n"},
		{"101", "/opt/nri/plugins/10-pleg-nri (deleted)", []string{"/opt/nri/plugins/10-pleg-nri", "front", "--listen", "unix:///run/pleg-nri/cri.sock"}, "0::/system.slice/containerd.service\n"},
		{"102", "/usr/local/bin/pleg-nri", []string{"/usr/local/bin/pleg-nri", "--config", "/etc/pleg-nri/config.yaml"}, "0::/system.slice/pleg-nri.service\n"},
		{"103", "/usr/local/bin/pleg-nri (deleted)", []string{"/usr/local/bin/pleg-nri", "front", "--run-dir", "/run/pleg-nri"}, "0::/system.slice/pleg-nri.service\n"},
		{"104", "/opt/nri/plugins/10-pleg-nri", []string{"/opt/nri/plugins/10-pleg-nri"}, "0::/system.slice/containerd.service\n"},
		{"200", "/usr/bin/containerd", []string{"/usr/bin/containerd"}, "0::/system.slice/containerd.service\n"},
		{"201", "/usr/local/bin/pleg-nri", []string{"/usr/local/bin/pleg-nri", "version"}, "0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-abc.scope\n"},
		{"202", "/usr/local/bin/pleg-nri-old", []string{"/usr/local/bin/pleg-nri-old"}, "0::/\n"},
		{"203", "", nil, ""},
		{"204", "/usr/local/bin/pleg-nri (deleted)", []string{"/usr/local/bin/pleg-nri", "events"}, "12:memory:/kubepods/burstable/pod1/abc\n"},
	} {
		dir := filepath.Join(proc, p.pid)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if p.exe != "" {
			if err := os.Symlink(p.exe, filepath.Join(dir, "exe")); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(strings.Join(p.argv, "\x00")+"\x00"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(p.cgroup), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("sh", "node.sh", "processes")
	cmd.Env = append(os.Environ(), "PLEG_NRI_PROC="+proc)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node.sh processes: %v\n%s", err, out)
	}
	want := `100 core /opt/nri/plugins/10-pleg-nri
101 front /opt/nri/plugins/10-pleg-nri
102 core /usr/local/bin/pleg-nri
103 front /usr/local/bin/pleg-nri
104 core /opt/nri/plugins/10-pleg-nri
`
	if string(out) != want {
		t.Errorf("node.sh processes:\n%s\nwant:\n%s", out, want)
	}
}

// nodeSh runs node.sh with env (over the test's environment) and returns its output and error.
func nodeSh(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"node.sh"}, args...)...)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestNodeHealth (issue 60): node.sh health, the installer pod's readiness probe, fails until the
// install is done, then passes only while the core's /readyz answers 200 and the host's endpoint (the
// kubelet's socket, reached under HOST_ROOT) answers a CRI Version call: a core that is not ready, a
// front that accepts without answering (stopped) and a front gone each fail it, within the timeout.
func TestNodeHealth(t *testing.T) {
	root := testutil.ShortTempDir(t, "nh-")
	sockDir := filepath.Join(root, "run", "pleg-nri")
	if err := os.MkdirAll(sockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(sockDir, "cri.sock")
	srv := testutil.ServeVersionRuntime(t, sock, "fake")
	readyz := testutil.ServeReadyz(t)
	readyFile := filepath.Join(root, "ready")
	env := map[string]string{
		"HOST_ROOT": root, "PLEG_NRI_BIN": plegnribin.Binary(t, plegnribin.Default), "PLEG_NRI_READY_FILE": readyFile,
		"PLEG_NRI_READYZ": readyz.URL, "PLEG_NRI_ENDPOINT": "unix:///run/pleg-nri/cri.sock", "PLEG_NRI_HEALTH_TIMEOUT": "1",
	}
	check := func(what string, wantOK bool, want string) {
		t.Helper()
		start := time.Now()
		out, err := nodeSh(t, env, "health")
		if (err == nil) != wantOK || !strings.Contains(out, want) {
			t.Errorf("%s: node.sh health: %v, want ok=%v and %q:\n%s", what, err, wantOK, want, out)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("%s: node.sh health took %s, want at most two timeouts of 1s", what, took)
		}
	}
	check("before the install is done", false, "the install has not finished")
	if err := os.WriteFile(readyFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	check("healthy", true, root+"/run/pleg-nri/cri.sock: ok")
	// With the kubelet switch: ready only while the kubelet's settings are the switch's.
	kdir := filepath.Join(root, "var", "lib", "kubelet")
	if err := os.MkdirAll(kdir, 0o755); err != nil {
		t.Fatal(err)
	}
	switched := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/pleg-nri/cri.sock\nfeatureGates:\n  EventedPLEG: true\nimageServiceEndpoint: unix:///run/containerd/containerd.sock\n"
	if err := os.WriteFile(filepath.Join(kdir, "config.yaml"), []byte(switched), 0o644); err != nil {
		t.Fatal(err)
	}
	env["PLEG_NRI_SWITCH_KUBELET"], env["PLEG_NRI_EVENTED_PLEG"] = "true", "true"
	check("switched", true, "kubelet settings: as switched")
	// As kubeadm upgrade node leaves it: the ConfigMap's configuration, containerd's socket.
	if err := os.WriteFile(filepath.Join(kdir, "config.yaml"), []byte(strings.NewReplacer("unix:///run/pleg-nri/cri.sock", "unix:///run/containerd/containerd.sock",
		"featureGates:\n  EventedPLEG: true\n", "", "imageServiceEndpoint: unix:///run/containerd/containerd.sock\n", "").Replace(switched)), 0o644); err != nil {
		t.Fatal(err)
	}
	check("the kubelet's settings drifted", false, "kubelet settings: FAIL: drift: "+root+"/var/lib/kubelet/config.yaml: containerRuntimeEndpoint is unix:///run/containerd/containerd.sock, want unix:///run/pleg-nri/cri.sock")
	check("the kubelet's settings drifted: imageServiceEndpoint too", false, root+"/var/lib/kubelet/config.yaml: imageServiceEndpoint is unset, want unix:///run/containerd/containerd.sock")
	env["PLEG_NRI_SWITCH_KUBELET"] = "false"
	check("not switched: the kubelet's settings are not checked", true, "cri.sock: ok")
	readyz.Fail("NRI plugin not registered")
	check("core not ready", false, "FAIL: 503 Service Unavailable: NRI plugin not registered")
	readyz.Fail("")
	// A stopped front: the socket accepts, nothing answers.
	srv.Stop()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	check("front stopped", false, "cri.sock: FAIL: CRI Version")
	_ = l.Close()
	check("front gone", false, "cri.sock: FAIL: CRI Version")
}

// TestNodeKubeletSwitch (issue 58): the chart's kubelet switch, as node.sh makes it, sets the kubelet's
// imageServiceEndpoint to containerd's socket (its image calls then never cross pleg-nri), recording in
// the switch's mark what it was; a switch applied again after a drift keeps that record, and the restore
// (uninstall, or the switch turned off) puts the configuration and kubeadm's flags back exactly as they
// were. kubelet.imageServiceEndpoint "" leaves it alone.
func TestNodeKubeletSwitch(t *testing.T) {
	const kubeadmConfig = "apiVersion: kubelet.config.k8s.io/v1beta1\ncgroupDriver: systemd\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\nkind: KubeletConfiguration\n"
	const kubeadmFlags = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock --node-ip=172.18.0.2\"\n"
	for _, tc := range []struct {
		name, config, image string
		oldMark             bool // an empty mark: the kubelet switched by an older chart
		wantImage           any  // imageServiceEndpoint once switched
	}{
		{"kubeadm's", kubeadmConfig, "unix:///run/containerd/containerd.sock", false, "unix:///run/containerd/containerd.sock"},
		{"an image service of its own", kubeadmConfig + "imageServiceEndpoint: unix:///run/images.sock\n", "unix:///run/containerd/containerd.sock", false, "unix:///run/containerd/containerd.sock"},
		{"switched by an older chart", strings.Replace(kubeadmConfig, "containerd/containerd.sock", "pleg-nri/cri.sock", 1) + "featureGates:\n  EventedPLEG: true\n",
			"unix:///run/containerd/containerd.sock", true, "unix:///run/containerd/containerd.sock"},
		{"left alone", kubeadmConfig, "", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			kdir := filepath.Join(root, "var", "lib", "kubelet")
			if err := os.MkdirAll(kdir, 0o755); err != nil {
				t.Fatal(err)
			}
			config, flags, mark := filepath.Join(kdir, "config.yaml"), filepath.Join(kdir, "kubeadm-flags.env"), filepath.Join(root, "etc", "pleg-nri", "kubelet-switched")
			testutil.WriteFile(t, config, tc.config)
			testutil.WriteFile(t, flags, kubeadmFlags)
			if tc.oldMark {
				testutil.WriteFile(t, mark, "")
			}
			env := map[string]string{"HOST_ROOT": root, "PLEG_NRI_BIN": plegnribin.Binary(t, plegnribin.Default),
				"PLEG_NRI_SWITCH_KUBELET": "true", "PLEG_NRI_EVENTED_PLEG": "true", "PLEG_NRI_ENDPOINT": "unix:///run/pleg-nri/cri.sock",
				"PLEG_NRI_IMAGE_ENDPOINT": tc.image, "PLEG_NRI_RESTORE_ENDPOINT": "unix:///run/containerd/containerd.sock"}
			run := func(cmd, want string) {
				t.Helper()
				if out, err := nodeSh(t, env, cmd); err != nil || strings.TrimSpace(out) != want {
					t.Fatalf("node.sh %s: %v %q, want %q", cmd, err, out, want)
				}
			}
			imageOf := func() any {
				t.Helper()
				data, _ := os.ReadFile(config)
				var cfg map[string]any
				if err := yaml.Unmarshal(data, &cfg); err != nil {
					t.Fatal(err)
				}
				return cfg["imageServiceEndpoint"]
			}
			run("kubelet-switch", "changed")
			if got := imageOf(); got != tc.wantImage {
				t.Errorf("imageServiceEndpoint after the switch: %v, want %v", got, tc.wantImage)
			}
			if out, err := nodeSh(t, env, "health"); strings.Contains(out, "kubelet settings: FAIL") {
				t.Errorf("node.sh health after the switch: %v\n%s", err, out)
			}
			run("kubelet-switch", "unchanged")
			// kubeadm upgrade node: the configuration as kubeadm writes it; the switch applied again.
			testutil.WriteFile(t, config, tc.config)
			run("kubelet-switch", "changed")
			if _, err := os.Stat(mark); err != nil {
				t.Fatalf("no mark: %v", err)
			}
			run("kubelet-restore", "changed")
			var got, want map[string]any
			data, _ := os.ReadFile(config)
			_ = yaml.Unmarshal(data, &got)
			_ = yaml.Unmarshal([]byte(tc.config), &want)
			// The restore puts the endpoint on containerd's socket and removes the gate, as before.
			want["containerRuntimeEndpoint"] = "unix:///run/containerd/containerd.sock"
			delete(want, "featureGates")
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("the configuration after the restore (-want +got):\n%s", diff)
			}
			if data, _ := os.ReadFile(flags); string(data) != kubeadmFlags {
				t.Errorf("kubeadm's flags after the restore:\n%s\nwant\n%s", data, kubeadmFlags)
			}
			if _, err := os.Stat(mark); !os.IsNotExist(err) {
				t.Errorf("the mark is still there: %v", err)
			}
		})
	}
}

// TestNodeKubeletDropin (issue 60): with kubelet.dropinDir the switch goes through the kubelet's
// drop-in directory: 90-pleg-nri.conf under the host root and --config-dir in kubeadm-flags.env,
// config.yaml untouched; the readiness check finds the kubelet's settings as switched, still after
// kubeadm upgrade node rewrites config.yaml (and the switch again changes nothing); the restore puts
// kubeadm-flags.env and config.yaml back byte for byte. Turning kubelet.dropinDir on over a switch in
// place, or off again, undoes the other switch first.
func TestNodeKubeletDropin(t *testing.T) {
	const kubeadmConfig = "apiVersion: kubelet.config.k8s.io/v1beta1\ncgroupDriver: systemd\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\nkind: KubeletConfiguration\n"
	const kubeadmFlags = "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2 --node-labels=\"\n"
	const dir = "/etc/kubernetes/kubelet.conf.d"
	root := t.TempDir()
	kdir := filepath.Join(root, "var", "lib", "kubelet")
	config, flags, mark := filepath.Join(kdir, "config.yaml"), filepath.Join(kdir, "kubeadm-flags.env"), filepath.Join(root, "etc", "pleg-nri", "kubelet-switched")
	dropin := filepath.Join(root, dir, "90-pleg-nri.conf")
	ready := filepath.Join(root, "ready")
	read := func(path string) string {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	testutil.WriteFile(t, config, kubeadmConfig)
	testutil.WriteFile(t, flags, kubeadmFlags)
	testutil.WriteFile(t, ready, "")
	env := map[string]string{"HOST_ROOT": root, "PLEG_NRI_BIN": plegnribin.Binary(t, plegnribin.Default), "PLEG_NRI_READY_FILE": ready,
		"PLEG_NRI_SWITCH_KUBELET": "true", "PLEG_NRI_EVENTED_PLEG": "true", "PLEG_NRI_ENDPOINT": "unix:///run/pleg-nri/cri.sock",
		"PLEG_NRI_IMAGE_ENDPOINT": "unix:///run/containerd/containerd.sock", "PLEG_NRI_RESTORE_ENDPOINT": "unix:///run/containerd/containerd.sock",
		"PLEG_NRI_KUBELET_DROPIN_DIR": dir, "PLEG_NRI_HEALTH_TIMEOUT": "1", "PLEG_NRI_READYZ": "http://127.0.0.1:1/readyz"}
	// run runs node.sh cmd; its last line is want.
	run := func(cmd, want string) string {
		t.Helper()
		out, err := nodeSh(t, env, cmd)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if err != nil || lines[len(lines)-1] != want {
			t.Fatalf("node.sh %s: %v %q, want %q last", cmd, err, out, want)
		}
		return out
	}
	settings := func() string {
		t.Helper()
		out, _ := nodeSh(t, env, "health")
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "kubelet settings:") {
				return l
			}
		}
		t.Fatalf("node.sh health: no kubelet settings line:\n%s", out)
		return ""
	}
	if s := settings(); !strings.Contains(s, "FAIL") || !strings.Contains(s, "--config-dir is unset") {
		t.Errorf("before the switch: %s", s)
	}
	run("kubelet-switch", "changed")
	if got := read(config); got != kubeadmConfig {
		t.Errorf("config.yaml changed by the switch:\n%s", got)
	}
	if got, want := read(flags), "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2 --node-labels= --config-dir="+dir+"\"\n"; got != want {
		t.Errorf("kubeadm-flags.env: %q, want %q", got, want)
	}
	if got := read(dropin); !strings.Contains(got, "containerRuntimeEndpoint: \"unix:///run/pleg-nri/cri.sock\"") || !strings.Contains(got, "EventedPLEG: true") {
		t.Errorf("the drop-in:\n%s", got)
	}
	if s := settings(); s != "kubelet settings: as switched" {
		t.Errorf("after the switch: %s", s)
	}
	// kubeadm upgrade node: config.yaml written anew from the ConfigMap.
	testutil.WriteFile(t, config, kubeadmConfig+"maxPods: 110\n")
	if s := settings(); s != "kubelet settings: as switched" {
		t.Errorf("after kubeadm upgrade node: %s", s)
	}
	run("kubelet-switch", "unchanged")
	testutil.WriteFile(t, config, kubeadmConfig)
	run("kubelet-restore", "changed")
	if got := read(flags); got != kubeadmFlags {
		t.Errorf("kubeadm-flags.env after the restore: %q", got)
	}
	if got := read(config); got != kubeadmConfig {
		t.Errorf("config.yaml after the restore: %q", got)
	}
	for _, p := range []string{mark, filepath.Join(root, dir)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there after the restore: %v", p, err)
		}
	}

	// A switch in place, then kubelet.dropinDir set: the switch in place is undone first.
	delete(env, "PLEG_NRI_KUBELET_DROPIN_DIR")
	run("kubelet-switch", "changed")
	if !strings.Contains(read(config), "pleg-nri/cri.sock") {
		t.Fatalf("the switch in place: %s", read(config))
	}
	env["PLEG_NRI_KUBELET_DROPIN_DIR"] = dir
	if out := run("kubelet-switch", "changed"); !strings.Contains(out, "undoing the inplace switch") {
		t.Errorf("no word of undoing the switch in place:\n%s", out)
	}
	var got, want map[string]any
	_ = yaml.Unmarshal([]byte(read(config)), &got)
	_ = yaml.Unmarshal([]byte(kubeadmConfig), &want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("config.yaml after the switch in place was undone (-want +got):\n%s", diff)
	}
	if s := settings(); s != "kubelet settings: as switched" {
		t.Errorf("after the switch through the drop-in directory: %s", s)
	}
	// And off again: the drop-in switch undone (kubeadm-flags.env as it was), the switch in place made.
	delete(env, "PLEG_NRI_KUBELET_DROPIN_DIR")
	if out := run("kubelet-switch", "changed"); !strings.Contains(out, "undoing the dropin switch") {
		t.Errorf("no word of undoing the drop-in switch:\n%s", out)
	}
	if got := read(flags); got != kubeadmFlags {
		t.Errorf("kubeadm-flags.env after the drop-in switch was undone: %q", got)
	}
	if _, err := os.Stat(dropin); !os.IsNotExist(err) {
		t.Errorf("the drop-in is still there: %v", err)
	}
	if s := settings(); s != "kubelet settings: as switched" {
		t.Errorf("after the switch in place again: %s", s)
	}
}

// containerdBin is the containerd of the dependency cache (make deps-runtime), or "" without one.
func containerdBin() string {
	cache := os.Getenv("PLEG_NRI_CACHE")
	if cache == "" {
		cache = "/var/cache/pleg-nri"
	}
	if p := filepath.Join(cache, "bin", "containerd"); fileExists(p) {
		return p
	}
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// kindContainerdConfig is the start of kind's node config (sigs.k8s.io/kind v0.33.0,
// images/base/files/etc/containerd/config.toml), with the NRI section make e2e-cluster patches in.
const kindContainerdConfig = `# explicitly use v2 config format
version = 2

[proxy_plugins]
[proxy_plugins."fuse-overlayfs"]
  type = "snapshot"
  address = "/run/containerd-fuse-overlayfs.sock"

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "/var/run/nri/nri.sock"
`

// TestNodeContainerdNRI (issue 60): the chart's containerd.nri timeouts, as node.sh writes them:
// a drop-in beside containerd's config and an import of it in the config, only when they change
// (containerd is restarted only then), removed again when the option is off. With containerd in the
// dependency cache, containerd itself reads the result (containerd config dump): the timeouts are in
// effect, and the rest of the NRI section is kept.
func TestNodeContainerdNRI(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		// wantImports is the config's imports line(s) after the first apply.
		wantImports string
		version     string
	}{
		{"kind", kindContainerdConfig, `imports = ["DIR/conf.d/pleg-nri*.toml"]`, "2"},
		{"imports of its own", "version = 3\nimports = [\"/etc/containerd/other.toml\"]\n\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n",
			`imports = ["DIR/conf.d/pleg-nri*.toml", "/etc/containerd/other.toml"]`, "3"},
		{"containerd's default imports", "version = 3\nimports = ['DIR/conf.d/*.toml']\n", `imports = ['DIR/conf.d/*.toml']`, "3"},
		{"no version", "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n", `imports = ["DIR/conf.d/pleg-nri*.toml"]`, "2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			main := filepath.Join(dir, "config.toml")
			if err := os.WriteFile(main, []byte(strings.ReplaceAll(tc.config, "DIR", dir)), 0o600); err != nil {
				t.Fatal(err)
			}
			env := map[string]string{"HOST_ROOT": "/", "PLEG_NRI_CONTAINERD_CONFIG": main,
				"PLEG_NRI_CONTAINERD_NRI_REGISTRATION_TIMEOUT": "11s", "PLEG_NRI_CONTAINERD_NRI_REQUEST_TIMEOUT": "7s"}
			apply := func(want string) {
				t.Helper()
				out, err := nodeSh(t, env, "containerd-config")
				if err != nil || strings.TrimSpace(out) != want {
					t.Fatalf("node.sh containerd-config: %v %q, want %q", err, out, want)
				}
			}
			dropin := filepath.Join(dir, "conf.d", "pleg-nri.toml")
			apply("changed")
			cfg, _ := os.ReadFile(main)
			if !strings.Contains(string(cfg), strings.ReplaceAll(tc.wantImports, "DIR", dir)+"\n") {
				t.Errorf("containerd's config:\n%s\nwant the line %s", cfg, strings.ReplaceAll(tc.wantImports, "DIR", dir))
			}
			if fi, err := os.Stat(main); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("containerd's config mode changed: %v %v", fi.Mode(), err)
			}
			// The rest of the config as it was: every other line kept, in order.
			var kept []string
			for _, l := range strings.Split(string(cfg), "\n") {
				if !strings.HasPrefix(l, "imports =") {
					kept = append(kept, l)
				}
			}
			var orig []string
			for _, l := range strings.Split(strings.ReplaceAll(tc.config, "DIR", dir), "\n") {
				if !strings.HasPrefix(l, "imports =") {
					orig = append(orig, l)
				}
			}
			if strings.Join(kept, "\n") != strings.Join(orig, "\n") {
				t.Errorf("containerd's config, but its imports:\n%s\nwant:\n%s", strings.Join(kept, "\n"), strings.Join(orig, "\n"))
			}
			want := "# Written by pleg-nri's Helm chart (containerd.nri): containerd's NRI timeouts. Removed when\n# the option is off or the chart is uninstalled.\nversion = " +
				tc.version + "\n\n[plugins.\"io.containerd.nri.v1.nri\"]\n  plugin_registration_timeout = \"11s\"\n  plugin_request_timeout = \"7s\"\n"
			if got, _ := os.ReadFile(dropin); string(got) != want {
				t.Errorf("the drop-in:\n%s\nwant:\n%s", got, want)
			}
			dump(t, main, map[string]string{"plugin_registration_timeout": "11s", "plugin_request_timeout": "7s"}, tc.name == "kind")
			// Again: nothing to do (the installer restarts containerd only on a change).
			apply("unchanged")
			if cfg2, _ := os.ReadFile(main); string(cfg2) != string(cfg) {
				t.Errorf("the config changed on the second apply:\n%s", cfg2)
			}
			// One timeout only.
			delete(env, "PLEG_NRI_CONTAINERD_NRI_REGISTRATION_TIMEOUT")
			apply("changed")
			if got, _ := os.ReadFile(dropin); strings.Contains(string(got), "plugin_registration_timeout") || !strings.Contains(string(got), `plugin_request_timeout = "7s"`) {
				t.Errorf("the drop-in with the request timeout only:\n%s", got)
			}
			dump(t, main, map[string]string{"plugin_registration_timeout": "5s", "plugin_request_timeout": "7s"}, false)
			// Off: the drop-in goes, containerd's defaults again; the import stays and matches nothing.
			delete(env, "PLEG_NRI_CONTAINERD_NRI_REQUEST_TIMEOUT")
			apply("changed")
			if fileExists(dropin) {
				t.Error("the drop-in is still there with the option off")
			}
			dump(t, main, map[string]string{"plugin_registration_timeout": "5s", "plugin_request_timeout": "2s"}, tc.name == "kind")
			apply("unchanged")
		})
	}
	// Off, with no config at all: nothing to do. On: a clear failure.
	env := map[string]string{"HOST_ROOT": "/", "PLEG_NRI_CONTAINERD_CONFIG": filepath.Join(t.TempDir(), "config.toml")}
	if out, err := nodeSh(t, env, "containerd-config"); err != nil || strings.TrimSpace(out) != "unchanged" {
		t.Errorf("off without a config: %v %q", err, out)
	}
	env["PLEG_NRI_CONTAINERD_NRI_REQUEST_TIMEOUT"] = "7s"
	if out, err := nodeSh(t, env, "containerd-config"); err == nil || !strings.Contains(out, "no containerd config at") {
		t.Errorf("on without a config: %v %q, want a failure naming the config", err, out)
	}
}

// dump checks, with the cache's containerd (skipped without one unless make test-deploy runs the
// test), what containerd reads from config: the NRI section's want keys, and with keep, the keys the
// config itself sets (kind's disable and socket_path).
func dump(t *testing.T, config string, want map[string]string, keep bool) {
	t.Helper()
	bin := containerdBin()
	if bin == "" {
		if os.Getenv("PLEG_NRI_DEPLOY_TESTS") == "1" {
			t.Fatal("no containerd in the dependency cache (make deps-runtime)")
		}
		t.Log("SKIP (loud): containerd config dump: no containerd in the dependency cache (make deps-runtime)")
		return
	}
	out, err := exec.Command(bin, "--config", config, "config", "dump").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd config dump: %v\n%s", err, out)
	}
	// The NRI section of the dump.
	_, sec, ok := strings.Cut(string(out), "[plugins.'io.containerd.nri.v1.nri']\n")
	if !ok {
		t.Fatalf("containerd config dump has no NRI section:\n%s", out)
	}
	if i := strings.Index(sec, "\n  [plugins."); i >= 0 {
		sec = sec[:i]
	}
	for k, v := range want {
		if !strings.Contains(sec, k+" = '"+v+"'\n") {
			t.Errorf("containerd reads %s, want %s = %s:\n%s", config, k, v, sec)
		}
	}
	if keep && (!strings.Contains(sec, "socket_path = '/var/run/nri/nri.sock'") || !strings.Contains(sec, "disable = false")) {
		t.Errorf("containerd's NRI section lost the config's own keys:\n%s", sec)
	}
}

// busyboxBin is the static busybox of the image (the dependency cache's, make image), or "".
func busyboxBin() string {
	cache := os.Getenv("PLEG_NRI_CACHE")
	if cache == "" {
		cache = "/var/cache/pleg-nri"
	}
	m, _ := filepath.Glob(filepath.Join(cache, "busybox-static-*", "busybox"))
	if len(m) == 0 {
		return ""
	}
	return m[0]
}

// TestNodeHealthServer (issue 60): the installer serves node.sh health over HTTP (busybox httpd, as
// in the image) for the kubelet's HTTP probe, which does not go through the runtime endpoint it
// checks: 503 with the checks' output until the install is done or while a check fails, 200 once all
// pass.
func TestNodeHealthServer(t *testing.T) {
	bb := busyboxBin()
	if bb == "" {
		if os.Getenv("PLEG_NRI_DEPLOY_TESTS") == "1" {
			t.Fatal("no busybox-static in the dependency cache (make image)")
		}
		t.Skip("SKIP (loud): no busybox-static in the dependency cache (make image fetches it)")
	}
	root := testutil.ShortTempDir(t, "hs-")
	if err := os.MkdirAll(filepath.Join(root, "run", "pleg-nri"), 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.ServeVersionRuntime(t, filepath.Join(root, "run", "pleg-nri", "cri.sock"), "fake")
	readyz := testutil.ServeReadyz(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	readyFile := filepath.Join(root, "ready")
	cmd := exec.Command("sh", "node.sh", "health-server")
	cmd.Env = append(os.Environ(), "HOST_ROOT="+root, "PLEG_NRI_BIN="+plegnribin.Binary(t, plegnribin.Default), "PLEG_NRI_READY_FILE="+readyFile,
		"PLEG_NRI_READYZ="+readyz.URL, "PLEG_NRI_ENDPOINT=unix:///run/pleg-nri/cri.sock", "PLEG_NRI_HEALTH_TIMEOUT=1",
		"PLEG_NRI_HEALTH_ADDRESS="+addr, "PLEG_NRI_HEALTH_DIR="+filepath.Join(root, "www"), "PLEG_NRI_BUSYBOX="+bb)
	var out testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		// The server went with it.
		if _, err := http.Get("http://" + addr + "/cgi-bin/health"); err == nil {
			t.Errorf("the health server still answers after node.sh ended")
		}
	})
	get := func(wantCode int, want string) {
		t.Helper()
		var code int
		var body string
		err := testutil.PollEvery(context.Background(), 10*time.Second, 100*time.Millisecond, "the health server", func() (bool, error) {
			resp, err := http.Get("http://" + addr + "/cgi-bin/health")
			if err != nil {
				return false, err
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			code, body = resp.StatusCode, string(b)
			return code == wantCode && strings.Contains(body, want), nil
		})
		if err != nil {
			t.Fatalf("GET /cgi-bin/health: %d %q, want %d and %q (%v); node.sh:\n%s", code, body, wantCode, want, err, out.String())
		}
	}
	get(http.StatusServiceUnavailable, "the install has not finished")
	if err := os.WriteFile(readyFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	get(http.StatusOK, "/readyz: ok")
	readyz.Fail("no relist has completed yet")
	get(http.StatusServiceUnavailable, "FAIL: 503 Service Unavailable: no relist has completed yet")
	readyz.Fail("")
	get(http.StatusOK, "cri.sock: ok")
	// Each change of the result is in the installer's log (the pod's), with why. The log line of the
	// last change may come a moment after the answer that shows it: wait for it, then count.
	if err := testutil.PollEvery(context.Background(), 10*time.Second, 20*time.Millisecond, "the last change in node.sh's log", func() (bool, error) {
		return strings.Count(out.String(), "readiness: ready:") >= 2, nil
	}); err != nil {
		t.Errorf("%v:\n%s", err, out.String())
	}
	for _, want := range []string{"pleg-nri node: readiness: not ready: the install has not finished;",
		"pleg-nri node: readiness: ready: core http://",
		"pleg-nri node: readiness: not ready: core " + readyz.URL + ": FAIL: 503 Service Unavailable: no relist has completed yet;"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("node.sh's log has no %q:\n%s", want, out.String())
		}
	}
	if n := strings.Count(out.String(), "readiness: ready:"); n != 2 {
		t.Errorf("node.sh logged %d changes to ready, want 2 (once per change):\n%s", n, out.String())
	}
}

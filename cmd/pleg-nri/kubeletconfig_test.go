package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunKubeletConfig: the command says whether it changed anything (the chart's node script restarts
// the kubelet only then).
func TestRunKubeletConfig(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte("kind: KubeletConfiguration\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"changed", "unchanged"} {
		var out, errb bytes.Buffer
		err := runKubeletConfig([]string{"--config", config, "--kubeadm-flags", filepath.Join(dir, "none.env"),
			"--container-runtime-endpoint", "unix:///run/pleg-nri/cri.sock", "--evented-pleg", "true"}, &out, &errb)
		if err != nil || strings.TrimSpace(out.String()) != want {
			t.Errorf("printed %q (%v), want %q", out.String(), err, want)
		}
	}
}

// TestKubeletConfigCheck (issue 60): --check writes nothing, names each drift and fails (status 1);
// after the switch it prints unchanged and succeeds.
func TestKubeletConfigCheck(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "config.yaml")
	orig := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n"
	if err := os.WriteFile(config, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", config, "--kubeadm-flags", filepath.Join(dir, "none.env"),
		"--container-runtime-endpoint", "unix:///run/pleg-nri/cri.sock", "--evented-pleg", "true"}
	var out bytes.Buffer
	err := runKubeletConfig(append([]string{"--check"}, args...), &out, &out)
	if exitStatus(err, &out) != 1 || !strings.Contains(out.String(), "drift: "+config+": containerRuntimeEndpoint is unix:///run/containerd/containerd.sock, want unix:///run/pleg-nri/cri.sock\n") ||
		!strings.Contains(out.String(), "featureGates.EventedPLEG is unset, want true") {
		t.Errorf("--check before the switch: %v\n%s", err, out.String())
	}
	if data, _ := os.ReadFile(config); string(data) != orig {
		t.Errorf("--check wrote the configuration:\n%s", data)
	}
	out.Reset()
	if err := runKubeletConfig(args, &out, &out); err != nil || out.String() != "changed\n" {
		t.Fatalf("the switch: %v %q", err, out.String())
	}
	out.Reset()
	if err := runKubeletConfig(append([]string{"--check"}, args...), &out, &out); err != nil || out.String() != "unchanged\n" {
		t.Errorf("--check after the switch: %v %q", err, out.String())
	}
}

// TestKubeletConfigImageEndpoint (issue 58): the switch sets imageServiceEndpoint (the kubelet's image
// calls then go to containerd directly), recording that it was unset; --check names it when it
// drifts; "restore" puts it back as it was: unset.
func TestKubeletConfigImageEndpoint(t *testing.T) {
	dir := t.TempDir()
	config, record := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "etc", "kubelet-switched")
	orig := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n"
	if err := os.WriteFile(config, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"--config", config, "--kubeadm-flags", filepath.Join(dir, "none.env")}
	sw := append(append([]string{}, common...), "--container-runtime-endpoint", "unix:///run/pleg-nri/cri.sock",
		"--image-service-endpoint", "unix:///run/containerd/containerd.sock", "--evented-pleg", "true", "--record", record)
	var out bytes.Buffer
	if err := runKubeletConfig(sw, &out, &out); err != nil || out.String() != "changed\n" {
		t.Fatalf("the switch: %v %q", err, out.String())
	}
	if data, _ := os.ReadFile(config); !strings.Contains(string(data), "imageServiceEndpoint: unix:///run/containerd/containerd.sock\n") {
		t.Errorf("after the switch:\n%s", data)
	}
	// imageServiceEndpoint gone (kubeadm upgrade node), the rest as switched.
	drifted := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/pleg-nri/cri.sock\nfeatureGates:\n  EventedPLEG: true\n"
	if err := os.WriteFile(config, []byte(drifted), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err := runKubeletConfig(append([]string{"--check"}, sw...), &out, &out)
	if exitStatus(err, &out) != 1 || !strings.Contains(out.String(), "drift: "+config+": imageServiceEndpoint is unset, want unix:///run/containerd/containerd.sock\n") ||
		strings.Count(out.String(), "drift: ") != 1 {
		t.Errorf("--check with imageServiceEndpoint gone: %v\n%s", err, out.String())
	}
	out.Reset()
	back := append(append([]string{}, common...), "--container-runtime-endpoint", "unix:///run/containerd/containerd.sock",
		"--image-service-endpoint", "restore", "--evented-pleg", "remove", "--record", record)
	if err := runKubeletConfig(sw, &out, &out); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := runKubeletConfig(back, &out, &out); err != nil || out.String() != "changed\n" {
		t.Fatalf("restore: %v %q", err, out.String())
	}
	if data, _ := os.ReadFile(config); strings.Contains(string(data), "imageServiceEndpoint") || strings.Contains(string(data), "EventedPLEG") {
		t.Errorf("after restore:\n%s", data)
	}
	out.Reset()
	err = runKubeletConfig(append(append([]string{}, common...), "--image-service-endpoint", "restore"), &out, &out)
	if exitStatus(err, &out) != 2 {
		t.Errorf("restore without --record: %v\n%s", err, out.String())
	}
}

// TestKubeletConfigDropin (issue 60): --dropin-dir with --host-root writes the drop-in under the host
// root and names the kubelet's own path in --config-dir; --check passes, and still passes once config.yaml
// is rewritten (kubeadm upgrade node); restore puts kubeadm-flags.env back byte for byte; --dropin-dir
// without --record is a usage error.
func TestKubeletConfigDropin(t *testing.T) {
	root := t.TempDir()
	config, flags, record := filepath.Join(root, "config.yaml"), filepath.Join(root, "kubeadm-flags.env"), filepath.Join(root, "record")
	const cfg = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n"
	const kflags = "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2\"\n"
	for path, data := range map[string]string{config: cfg, flags: kflags} {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base := []string{"--config", config, "--kubeadm-flags", flags, "--record", record, "--dropin-dir", "/etc/kubernetes/kubelet.conf.d", "--host-root", root}
	sw := append(append([]string{}, base...), "--container-runtime-endpoint", "unix:///run/pleg-nri/cri.sock",
		"--image-service-endpoint", "unix:///run/containerd/containerd.sock", "--evented-pleg", "true")
	var out bytes.Buffer
	if err := runKubeletConfig(append([]string{"--check"}, sw...), &out, &out); exitStatus(err, &out) != 1 ||
		!strings.Contains(out.String(), "drift: "+flags+": --config-dir is unset, want /etc/kubernetes/kubelet.conf.d") {
		t.Errorf("--check before the switch: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := runKubeletConfig(sw, &out, &out); err != nil || out.String() != "changed\n" {
		t.Fatalf("the switch: %v %q", err, out.String())
	}
	if data, err := os.ReadFile(filepath.Join(root, "etc/kubernetes/kubelet.conf.d/90-pleg-nri.conf")); err != nil ||
		!strings.Contains(string(data), "containerRuntimeEndpoint: \"unix:///run/pleg-nri/cri.sock\"") {
		t.Errorf("the drop-in: %v\n%s", err, data)
	}
	if data, _ := os.ReadFile(flags); string(data) != "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2 --config-dir=/etc/kubernetes/kubelet.conf.d\"\n" {
		t.Errorf("kubeadm-flags.env: %q", data)
	}
	if err := os.WriteFile(config, []byte(cfg+"cgroupDriver: systemd\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := runKubeletConfig(append([]string{"--check"}, sw...), &out, &out); err != nil || out.String() != "unchanged\n" {
		t.Errorf("--check after config.yaml was rewritten: %v %q", err, out.String())
	}
	out.Reset()
	if err := runKubeletConfig(append(base, "--container-runtime-endpoint", "unix:///run/containerd/containerd.sock",
		"--image-service-endpoint", "restore", "--evented-pleg", "remove"), &out, &out); err != nil || out.String() != "changed\n" {
		t.Fatalf("restore: %v %q", err, out.String())
	}
	if data, _ := os.ReadFile(flags); string(data) != kflags {
		t.Errorf("kubeadm-flags.env after restore: %q", data)
	}
	if data, _ := os.ReadFile(config); string(data) != cfg+"cgroupDriver: systemd\n" {
		t.Errorf("restore touched config.yaml: %q", data)
	}
	out.Reset()
	err := runKubeletConfig([]string{"--config", config, "--dropin-dir", "/etc/kubernetes/kubelet.conf.d", "--container-runtime-endpoint", "unix:///x.sock"}, &out, &out)
	if exitStatus(err, &out) != 2 || !strings.Contains(out.String(), "--dropin-dir needs --record") {
		t.Errorf("--dropin-dir without --record: %v %q", err, out.String())
	}
}

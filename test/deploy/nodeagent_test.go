package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil/plegnribin"
)

// kubeadmKubeletConfig is a kubelet configuration as kubeadm writes it (abridged).
const kubeadmKubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
cgroupDriver: systemd
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
kind: KubeletConfiguration
`

const kubeadmFlags = `KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock --node-ip=10.0.0.2"
`

// agent runs the chart's node agent (deploy/node.sh from the image) against n as the chart's pod does
// on a node: the node's PID namespace (nsenter -t 1 reaches its systemd), its network (pleg-nri's
// /readyz on loopback), its / at /host, the configuration at /etc/pleg-nri-config, the chart's
// environment. extra are more docker run arguments. It returns the agent's container name.
func (n *node) agent(image, configDir, cmd string, env map[string]string, extra ...string) string {
	n.t.Helper()
	// The node's / as the host sees it: its root file system and its /var volume (a bind of the node
	// container's /proc/PID/root across mount namespaces is refused).
	merged := strings.TrimSpace(run(n.t, "docker", "inspect", "-f", "{{.GraphDriver.Data.MergedDir}}", n.name))
	varVol := strings.TrimSpace(run(n.t, "docker", "inspect", "-f", `{{range .Mounts}}{{if eq .Destination "/var"}}{{.Source}}{{end}}{{end}}`, n.name))
	if merged == "" || varVol == "" {
		n.t.Fatalf("the node's root %q and /var %q", merged, varVol)
	}
	name := fmt.Sprintf("%s-agent-%d", n.name, time.Now().UnixNano())
	args := []string{"run", "--name", name, "--pid", "container:" + n.name, "--network", "container:" + n.name,
		"--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE", "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
		"-v", merged + ":/host", "-v", varVol + ":/host/var", "-v", configDir + ":/etc/pleg-nri-config:ro",
		"-e", "HOST_ROOT=/host", "-e", "PLEG_NRI_CONFIG=/etc/pleg-nri-config/config.yaml", "-e", "PLEG_NRI_READY_TIMEOUT=60"}
	for k, v := range env {
		args = append(args, "-e", k+"="+v)
	}
	args = append(args, extra...)
	if cmd == "install" {
		args = append(args, "-d")
	}
	args = append(args, "--entrypoint", "/bin/sh", image, "/opt/pleg-nri/node.sh", cmd)
	n.t.Cleanup(func() { _, _ = tryRun("docker", "rm", "-f", name) })
	out, err := tryRun("docker", args...)
	if err != nil {
		n.t.Fatalf("node agent %s: %v\n%s", cmd, err, out)
	}
	if cmd == "install" {
		n.waitFor("the node agent's install", 120*time.Second, func() (bool, string) {
			if _, err := tryRun("docker", "exec", name, "/bin/sh", "-c", "test -f /tmp/pleg-nri-ready"); err == nil {
				return true, ""
			}
			logs, _ := tryRun("docker", "logs", name)
			if st, _ := tryRun("docker", "inspect", "-f", "{{.State.Running}}", name); strings.TrimSpace(st) != "true" {
				n.t.Fatalf("the node agent exited:\n%s", logs)
			}
			return false, logs
		})
	}
	logs, _ := tryRun("docker", "logs", name)
	n.t.Logf("node agent %s:\n%s", cmd, logs)
	return name
}

// agentImage is the pleg-nri image of make image (PLEG_NRI_IMAGE), whose node agent the tests run.
func agentImage(t *testing.T) string {
	t.Helper()
	image := os.Getenv("PLEG_NRI_IMAGE")
	need(t, image != "", "PLEG_NRI_IMAGE (the image of make image) is not set")
	_, err := tryRun("docker", "image", "inspect", image)
	need(t, err == nil, "no image %s", image)
	return image
}

// TestNodeAgent runs the Helm chart's node agent (node.sh in the image, as the DaemonSet and the
// uninstall Job run it) against a systemd node with a real containerd and a kubeadm-shaped kubelet
// configuration: install with the kubelet switch, an upgrade to another binary and configuration
// (the kubelet stays switched and is not restarted again), and uninstall (the kubelet back on
// containerd first, then pleg-nri gone).
func TestNodeAgent(t *testing.T) {
	image := agentImage(t)
	n := startNode(t)
	tmp := t.TempDir()
	n.installContainerd()
	n.sh("mkdir -p /var/lib/kubelet")
	n.write("/etc/systemd/system/kubelet.service", kubeletUnit)
	n.write("/var/lib/kubelet/config.yaml", kubeadmKubeletConfig)
	n.write("/var/lib/kubelet/kubeadm-flags.env", kubeadmFlags)
	n.exec("systemctl", "daemon-reload")
	n.exec("systemctl", "enable", "--now", "containerd.service", "kubelet.service")
	kubeletInvocation := n.prop("kubelet.service", "InvocationID")

	// The chart's configuration (its values' config, rendered into the ConfigMap).
	cfgDir := filepath.Join(tmp, "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	config := "listen: unix:///run/pleg-nri/cri.sock\nruntime-endpoint: unix:///run/containerd/containerd.sock\ncontainerd-address: /run/containerd/containerd.sock\nmetrics-address: 127.0.0.1:9810\nstate-dir: /var/lib/pleg-nri\nlog-level: info\n"
	if err := os.WriteFile(filepath.Join(cfgDir, "config.yaml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	switchEnv := map[string]string{"PLEG_NRI_SWITCH_KUBELET": "true", "PLEG_NRI_EVENTED_PLEG": "true", "PLEG_NRI_RESTART_KUBELET_AFTER_RESTART": "false"}

	// Install, switching the kubelet.
	a := n.agent(image, cfgDir, "install", switchEnv)
	if st := n.prop("pleg-nri.service", "ActiveState"); st != "active" {
		t.Fatalf("pleg-nri.service is %s after install", st)
	}
	if en := strings.TrimSpace(n.exec("systemctl", "is-enabled", "pleg-nri.service")); en != "enabled" {
		t.Errorf("pleg-nri.service is %s", en)
	}
	n.waitReady()
	kcfg := n.exec("cat", "/var/lib/kubelet/config.yaml")
	if !strings.Contains(kcfg, "containerRuntimeEndpoint: unix:///run/pleg-nri/cri.sock") || !strings.Contains(kcfg, "EventedPLEG: true") ||
		!strings.Contains(kcfg, "imageServiceEndpoint: unix:///run/containerd/containerd.sock") {
		t.Errorf("the kubelet's configuration after install:\n%s", kcfg)
	}
	if !strings.Contains(n.exec("cat", "/var/lib/kubelet/kubeadm-flags.env"),
		"--container-runtime-endpoint=unix:///run/pleg-nri/cri.sock --image-service-endpoint=unix:///run/containerd/containerd.sock") {
		t.Errorf("kubeadm-flags.env not switched")
	}
	if now := n.prop("kubelet.service", "InvocationID"); now == kubeletInvocation {
		t.Errorf("the kubelet was not restarted after the switch")
	} else {
		kubeletInvocation = now
	}
	plegPID := n.prop("pleg-nri.service", "MainPID")
	run(t, "docker", "rm", "-f", a)

	// The same install again (a rescheduled pod): nothing is restarted.
	a = n.agent(image, cfgDir, "install", switchEnv)
	if now := n.prop("pleg-nri.service", "MainPID"); now != plegPID {
		t.Errorf("an unchanged install restarted pleg-nri (MainPID %s -> %s)", plegPID, now)
	}
	if now := n.prop("kubelet.service", "InvocationID"); now != kubeletInvocation {
		t.Errorf("an unchanged install restarted the kubelet")
	}
	run(t, "docker", "rm", "-f", a)

	// Upgrade: another binary and another configuration. pleg-nri is replaced and restarted; the
	// kubelet stays switched and is not restarted.
	newBin := plegnribin.Binary(t, plegnribin.Deploy)
	// Not the image's binary: its version is deploy-test.
	upgraded := filepath.Join(tmp, "pleg-nri-upgraded")
	data, err := os.ReadFile(newBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(upgraded, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "config.yaml"), []byte(strings.Replace(config, "log-level: info", "log-level: debug", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	a = n.agent(image, cfgDir, "install", switchEnv, "-v", upgraded+":/usr/local/bin/pleg-nri:ro")
	// The binary on the node, and the core that serves (the front is kept across the upgrade).
	if v := n.exec("/usr/local/bin/pleg-nri", "version"); !strings.HasPrefix(v, "pleg-nri deploy-test\n") || !strings.Contains(v, "\ncore: pid ") || !strings.Contains(v, ", version deploy-test\n") {
		t.Errorf("after the upgrade the node runs %q, want pleg-nri deploy-test and its core", v)
	}
	if now := n.prop("pleg-nri.service", "MainPID"); now == plegPID || now == "0" {
		t.Errorf("the upgrade did not restart pleg-nri (MainPID %s)", now)
	}
	if !strings.Contains(n.exec("cat", "/etc/pleg-nri/config.yaml"), "log-level: debug") {
		t.Errorf("the upgrade did not install the new configuration")
	}
	n.waitReady()
	if kcfg := n.exec("cat", "/var/lib/kubelet/config.yaml"); !strings.Contains(kcfg, "containerRuntimeEndpoint: unix:///run/pleg-nri/cri.sock") || !strings.Contains(kcfg, "EventedPLEG: true") {
		t.Errorf("the kubelet's configuration after the upgrade:\n%s", kcfg)
	}
	if now := n.prop("kubelet.service", "InvocationID"); now != kubeletInvocation {
		t.Errorf("the upgrade restarted the kubelet (PLEG_NRI_RESTART_KUBELET_AFTER_RESTART=false)")
	}
	run(t, "docker", "rm", "-f", a)

	// Another configuration with kubelet.restartAfterPlegNRIRestart on: pleg-nri is
	// restarted, then the kubelet, once pleg-nri is ready.
	plegPID = n.prop("pleg-nri.service", "MainPID")
	if err := os.WriteFile(filepath.Join(cfgDir, "config.yaml"), []byte(strings.Replace(config, "log-level: info", "log-level: warn", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	restartEnv := map[string]string{"PLEG_NRI_SWITCH_KUBELET": "true", "PLEG_NRI_EVENTED_PLEG": "true", "PLEG_NRI_RESTART_KUBELET_AFTER_RESTART": "true"}
	a = n.agent(image, cfgDir, "install", restartEnv, "-v", upgraded+":/usr/local/bin/pleg-nri:ro")
	if now := n.prop("pleg-nri.service", "MainPID"); now == plegPID {
		t.Errorf("the new configuration did not restart pleg-nri")
	}
	if now := n.prop("kubelet.service", "InvocationID"); now == kubeletInvocation {
		t.Errorf("the kubelet was not restarted after pleg-nri (PLEG_NRI_RESTART_KUBELET_AFTER_RESTART=true)")
	} else {
		kubeletInvocation = now
	}
	// Nothing changed: nothing is restarted, the kubelet neither.
	run(t, "docker", "rm", "-f", a)
	a = n.agent(image, cfgDir, "install", restartEnv, "-v", upgraded+":/usr/local/bin/pleg-nri:ro")
	if now := n.prop("kubelet.service", "InvocationID"); now != kubeletInvocation {
		t.Errorf("an unchanged install restarted the kubelet (PLEG_NRI_RESTART_KUBELET_AFTER_RESTART=true)")
	}
	run(t, "docker", "rm", "-f", a)

	// Uninstall (the pre-delete hook's pod): the kubelet goes back to containerd, then pleg-nri goes.
	n.agent(image, cfgDir, "uninstall", switchEnv)
	kcfg = n.exec("cat", "/var/lib/kubelet/config.yaml")
	// imageServiceEndpoint as it was: unset (issue 58).
	if !strings.Contains(kcfg, "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock") || strings.Contains(kcfg, "EventedPLEG") ||
		strings.Contains(kcfg, "imageServiceEndpoint") {
		t.Errorf("the kubelet's configuration after uninstall:\n%s", kcfg)
	}
	if flags := n.exec("cat", "/var/lib/kubelet/kubeadm-flags.env"); flags != kubeadmFlags {
		t.Errorf("kubeadm-flags.env not switched back as it was:\n%s", flags)
	}
	if st := n.prop("kubelet.service", "ActiveState"); st != "active" || n.prop("kubelet.service", "InvocationID") == kubeletInvocation {
		t.Errorf("the kubelet after uninstall: %s, restarted: %v", st, n.prop("kubelet.service", "InvocationID") != kubeletInvocation)
	}
	if out, err := n.tryExec("systemctl", "cat", "pleg-nri.service"); err == nil {
		t.Errorf("pleg-nri.service is still there after uninstall:\n%s", out)
	}
	if out, err := n.tryExec("test", "-e", "/usr/local/bin/pleg-nri"); err == nil {
		t.Errorf("/usr/local/bin/pleg-nri is still there after uninstall %s", out)
	}
	if out, err := n.tryExec("curl", "-sf", "http://127.0.0.1:9810/readyz"); err == nil {
		t.Errorf("pleg-nri still answers after uninstall: %s", out)
	}
}

// TestNodeAgentPreregistered runs the node agent in the chart's mode nri: it installs pleg-nri as
// containerd's pre-registered plugin, restarts containerd, which launches it, and waits for /readyz;
// uninstall ends the plugin and removes its files.
func TestNodeAgentPreregistered(t *testing.T) {
	image := agentImage(t)
	n := startNode(t)
	tmp := t.TempDir()
	n.installContainerd()
	n.exec("systemctl", "daemon-reload")
	n.exec("systemctl", "enable", "--now", "containerd.service")
	cfgDir := filepath.Join(tmp, "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "config.yaml"), []byte("listen: unix:///run/pleg-nri/cri.sock\nmetrics-address: 127.0.0.1:9810\nstate-dir: /var/lib/pleg-nri\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"PLEG_NRI_MODE": "nri"}
	a := n.agent(image, cfgDir, "install", env)
	n.waitReady()
	// containerd launched it from its plugin_path, with the installed configuration.
	ps := n.sh("ps -eo pid,ppid,args | grep '[/]opt/nri/plugins/10-pleg-nri'")
	ctrdPID := n.prop("containerd.service", "MainPID")
	if fields := strings.Fields(ps); len(fields) < 3 || fields[1] != ctrdPID {
		t.Errorf("the plugin process %q is not containerd's (%s) child", strings.TrimSpace(ps), ctrdPID)
	}
	if got := n.exec("cat", "/etc/nri/conf.d/10-pleg-nri.conf"); !strings.Contains(got, "listen: unix:///run/pleg-nri/cri.sock") {
		t.Errorf("the pre-registered configuration:\n%s", got)
	}
	if out, err := n.tryExec("systemctl", "cat", "pleg-nri.service"); err == nil {
		t.Errorf("mode nri installed the systemd unit:\n%s", out)
	}
	run(t, "docker", "rm", "-f", a)

	n.agent(image, cfgDir, "uninstall", env)
	n.waitFor("the plugin process gone", 30*time.Second, func() (bool, string) {
		out, err := n.tryExec("sh", "-c", "ps -eo args | grep '[/]opt/nri/plugins/10-pleg-nri'")
		return err != nil, out
	})
	for _, f := range []string{"/opt/nri/plugins/10-pleg-nri", "/etc/nri/conf.d/10-pleg-nri.conf"} {
		if _, err := n.tryExec("test", "-e", f); err == nil {
			t.Errorf("%s is still there after uninstall", f)
		}
	}
}

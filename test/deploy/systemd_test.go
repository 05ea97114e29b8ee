package deploy

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil/plegnribin"
)

// baseImage is the Debian bookworm image that boots systemd (test/images/debian-base.sh).
const baseImage = "pleg-nri-test/debian-base:bookworm"

// containerdUnit is containerd's own unit (containerd/containerd's containerd.service, with the
// binaries in /usr/local/bin).
const containerdUnit = `[Unit]
Description=containerd container runtime
After=network.target local-fs.target
[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999
[Install]
WantedBy=multi-user.target
`

// containerdConfig is containerd's configuration in the container: the defaults (CRI and NRI on, NRI
// at /var/run/nri/nri.sock), with the native snapshotter (overlay on the engine's fuse-overlayfs does
// not mount).
const containerdConfig = `version = 3
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "native"
`

// kubeletUnit stands in for the kubelet's unit: the ordering that the drop-in gives it is what is
// tested, not the kubelet (the kind cluster's tests run a real one).
const kubeletUnit = `[Unit]
Description=stand-in for kubelet.service (the drop-in's ordering is under test)
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
`

// node is a systemd container.
type node struct {
	t    *testing.T
	name string
}

// exec runs a command in the container and returns its output; an error fails the test.
func (n *node) exec(args ...string) string {
	n.t.Helper()
	return run(n.t, "docker", append([]string{"exec", n.name}, args...)...)
}

// sh runs a shell script in the container.
func (n *node) sh(script string) string {
	n.t.Helper()
	return n.exec("sh", "-c", script)
}

// tryExec runs a command in the container and returns its output and error.
func (n *node) tryExec(args ...string) (string, error) {
	return tryRun("docker", append([]string{"exec", n.name}, args...)...)
}

// write writes content to the file path in the container (its directory must exist).
func (n *node) write(path, content string) {
	n.t.Helper()
	f := filepath.Join(n.t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
		n.t.Fatal(err)
	}
	run(n.t, "docker", "cp", f, n.name+":"+path)
}

// installContainerd installs containerd and runc from the dependency cache in /usr/local/bin, with
// containerd's own unit and configuration; it does not start it.
func (n *node) installContainerd() {
	n.t.Helper()
	n.sh("install -m 0755 /cache/containerd/containerd /cache/containerd/containerd-shim-runc-v2 /cache/runc/runc /usr/local/bin/ && mkdir -p /etc/containerd")
	n.write("/etc/systemd/system/containerd.service", containerdUnit)
	n.write("/etc/containerd/config.toml", containerdConfig)
}

// prop returns a unit's property.
func (n *node) prop(unit, name string) string {
	n.t.Helper()
	return strings.TrimSpace(n.exec("systemctl", "show", "-p", name, "--value", unit))
}

// waitFor fails the test unless cond holds within d (it asks every 200 ms); the failure holds cond's
// last detail.
func (n *node) waitFor(what string, d time.Duration, cond func() (bool, string)) {
	n.t.Helper()
	if err := pollDetail(d, 200*time.Millisecond, what, cond); err != nil {
		n.t.Fatal(err)
	}
}

// waitReady waits until pleg-nri's /readyz answers 200 in the container.
func (n *node) waitReady() {
	n.t.Helper()
	n.waitFor("pleg-nri's /readyz", 60*time.Second, func() (bool, string) {
		out, err := n.tryExec("curl", "-sf", "http://127.0.0.1:9810/readyz")
		return err == nil, fmt.Sprintf("%v %s", err, out)
	})
}

// startNode boots a systemd container (the recipe of test/images/debian-base.sh for this project's
// Docker engine) with containerd and runc from the dependency cache, and removes it when the test ends.
func startNode(t *testing.T) *node {
	t.Helper()
	_, err := exec.LookPath("docker")
	need(t, err == nil, "docker is not on PATH")
	_, err = tryRun("docker", "image", "inspect", baseImage)
	need(t, err == nil, "no image %s (test/images/debian-base.sh builds it)", baseImage)
	cache := cacheDir()
	ctrd, runc := filepath.Join(cache, "containerd-v2.4.2"), filepath.Join(cache, "runc-v1.5.2")
	_, err1 := os.Stat(filepath.Join(ctrd, "containerd"))
	_, err2 := os.Stat(filepath.Join(runc, "runc"))
	need(t, err1 == nil && err2 == nil, "no containerd and runc in %s (make deps)", cache)

	b := make([]byte, 4)
	_, _ = rand.Read(b)
	n := &node{t: t, name: "pleg-nri-systemd-" + hex.EncodeToString(b)}
	run(t, "docker", "run", "-d", "--name", n.name, "--hostname", "node",
		"--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE", "--security-opt", "seccomp=unconfined",
		"--security-opt", "apparmor=unconfined", "--security-opt", "systempaths=unconfined",
		"--cgroupns=private", "--tmpfs", "/run", "--tmpfs", "/tmp", "-v", "/var", "--network", "none",
		"-v", ctrd+":/cache/containerd:ro", "-v", runc+":/cache/runc:ro",
		"-v", repoRoot()+":/src:ro", baseImage)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := tryRun("docker", "exec", n.name, "sh", "-c", "journalctl --no-pager -n 60 -u pleg-nri -u containerd -u kubelet; systemctl status --no-pager pleg-nri")
			t.Logf("journal of the node:\n%s", out)
		}
		_, _ = tryRun("docker", "rm", "-f", "-v", n.name)
	})
	n.waitFor("systemd booted", 60*time.Second, func() (bool, string) {
		out, _ := n.tryExec("systemctl", "is-system-running")
		s := strings.TrimSpace(out)
		return s == "running" || s == "degraded", s
	})
	return n
}

// TestSystemdUnits installs pleg-nri with deploy/install.sh in a systemd container next to a real
// containerd and checks the units: systemd-analyze verify is clean; starting the kubelet starts
// containerd and pleg-nri first and waits until pleg-nri's socket exists; the hardening still lets it
// reach containerd's and NRI's sockets, its socket directory and its state directory (it gets ready and
// writes its checkpoint); Restart=always brings it back after a SIGKILL; a restart of containerd does
// not stop it; stopping it does not stop the kubelet; KillMode=process leaves a process it started
// detached running across a restart of the unit.
func TestSystemdUnits(t *testing.T) {
	n := startNode(t)
	bin := plegnribin.Binary(t, plegnribin.Deploy)
	run(t, "docker", "cp", bin, n.name+":/root/pleg-nri")

	// containerd from the cache, as its own unit; a stand-in kubelet.service.
	n.installContainerd()
	n.write("/etc/systemd/system/kubelet.service", kubeletUnit)

	// The install a host operator does (docs/operations.md).
	out := n.exec("sh", "/src/deploy/install.sh", "--binary", "/root/pleg-nri")
	for _, f := range []string{"/usr/local/bin/pleg-nri", "/etc/systemd/system/pleg-nri.service",
		"/etc/systemd/system/kubelet.service.d/10-pleg-nri.conf", "/etc/pleg-nri/config.yaml"} {
		if !strings.Contains(out, "installed "+f) {
			t.Errorf("install.sh did not install %s:\n%s", f, out)
		}
	}
	// systemd-analyze verify: no warning about the units (the stand-in kubelet is verified with its drop-in).
	for _, unit := range []string{"/etc/systemd/system/pleg-nri.service", "/etc/systemd/system/kubelet.service"} {
		if out, err := n.tryExec("systemd-analyze", "verify", unit); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("systemd-analyze verify %s: %v\n%s", unit, err, out)
		}
	}
	n.exec("systemctl", "daemon-reload")
	n.exec("systemctl", "enable", "containerd.service", "pleg-nri.service", "kubelet.service")
	if after := n.prop("kubelet.service", "After"); !strings.Contains(after, "pleg-nri.service") {
		t.Errorf("kubelet.service After=%s, want pleg-nri.service in it", after)
	}
	if wants := n.prop("kubelet.service", "Wants"); !strings.Contains(wants, "pleg-nri.service") {
		t.Errorf("kubelet.service Wants=%s, want pleg-nri.service in it", wants)
	}

	// Starting the kubelet starts containerd, then pleg-nri, and the kubelet only once pleg-nri is
	// started, i.e. it told systemd READY=1 (Type=notify) once it served.
	start := time.Now()
	n.exec("systemctl", "start", "kubelet.service")
	t.Logf("systemctl start kubelet.service (containerd, pleg-nri first): %s", time.Since(start).Round(time.Millisecond))
	mono := func(unit, p string) int64 {
		v, err := strconv.ParseInt(n.prop(unit, p), 10, 64)
		if err != nil || v == 0 {
			t.Fatalf("%s %s: %q %v", unit, p, n.prop(unit, p), err)
		}
		return v
	}
	ctrdUp, plegStart, plegUp, kubeletStart := mono("containerd.service", "ActiveEnterTimestampMonotonic"),
		mono("pleg-nri.service", "ExecMainStartTimestampMonotonic"), mono("pleg-nri.service", "ActiveEnterTimestampMonotonic"),
		mono("kubelet.service", "ExecMainStartTimestampMonotonic")
	if !(ctrdUp <= plegStart && plegUp <= kubeletStart) {
		t.Errorf("order: containerd active at %d, pleg-nri started at %d and active at %d, kubelet started at %d (µs): want containerd, pleg-nri, kubelet",
			ctrdUp, plegStart, plegUp, kubeletStart)
	}
	n.waitReady()

	// The hardening is on, and pleg-nri still reaches everything it needs: ready means NRI registered and synchronized,
	// containerd's events subscribed and a relist done through containerd's CRI socket.
	for p, want := range map[string]string{"ProtectSystem": "strict", "NoNewPrivileges": "yes", "KillMode": "process",
		"Restart": "always", "CapabilityBoundingSet": "", "RestrictNamespaces": "yes",
		"StartLimitIntervalUSec": "0", "RestartUSec": "1s", "MemoryMax": "268435456"} {
		if got := n.prop("pleg-nri.service", p); got != want {
			t.Errorf("pleg-nri.service %s=%q, want %q", p, got, want)
		}
	}
	if out := n.sh("stat -c '%a %F' /run/pleg-nri /run/pleg-nri/cri.sock /var/lib/pleg-nri"); out != "750 directory\n660 socket\n700 directory\n" {
		t.Errorf("socket directory, socket and state directory:\n%s", out)
	}
	// In the unit's mount namespace: its state and socket directories and containerd's and NRI's
	// socket directories are writable, the rest of the file system is not.
	ns := []string{"nsenter", "-t", n.prop("pleg-nri.service", "MainPID"), "-m", "--"}
	for _, dir := range []string{"/var/lib/pleg-nri", "/run/pleg-nri", "/run/containerd", "/var/run/nri"} {
		if out, err := n.tryExec(append(ns, "sh", "-c", "touch "+dir+"/probe && rm "+dir+"/probe")...); err != nil {
			t.Errorf("pleg-nri.service cannot write %s: %v %s", dir, err, out)
		}
	}
	for _, dir := range []string{"/etc", "/usr/local/bin", "/var/lib"} {
		if out, err := n.tryExec(append(ns, "touch", dir+"/probe")...); err == nil || !strings.Contains(out, "Read-only file system") {
			t.Errorf("pleg-nri.service can write %s (ProtectSystem=strict): %v %s", dir, err, out)
		}
	}
	// Through the unit's socket: a client's event stream is open.
	n.exec("sh", "-c", "nohup /usr/local/bin/pleg-nri events >/tmp/events.log 2>&1 &")
	n.waitFor("one event stream open", 20*time.Second, func() (bool, string) {
		out, _ := n.tryExec("sh", "-c", "curl -s http://127.0.0.1:9810/metrics | grep '^pleg_nri_event_streams '")
		return strings.TrimSpace(out) == "pleg_nri_event_streams 1", out
	})

	// Restart=always: a SIGKILLed pleg-nri comes back.
	pid := n.prop("pleg-nri.service", "MainPID")
	n.exec("kill", "-9", pid)
	n.waitFor("pleg-nri restarted after SIGKILL", 30*time.Second, func() (bool, string) {
		now := n.prop("pleg-nri.service", "MainPID")
		return now != "0" && now != pid && n.prop("pleg-nri.service", "ActiveState") == "active", now
	})
	n.waitReady()

	// A containerd restart does not stop pleg-nri (Wants, not Requires or BindsTo); it reconnects.
	pid = n.prop("pleg-nri.service", "MainPID")
	n.exec("systemctl", "restart", "containerd.service")
	if now := n.prop("pleg-nri.service", "MainPID"); now != pid {
		t.Errorf("restarting containerd restarted pleg-nri (MainPID %s -> %s)", pid, now)
	}
	n.waitReady()

	// KillMode=process: a process pleg-nri's unit started beside it survives a restart of the unit
	// (what lets a detached front hold the kubelet's stream); only the main process is replaced.
	helper := strings.TrimSpace(n.sh(`main=$(systemctl show -p MainPID --value pleg-nri)
		sleep 3600 </dev/null >/dev/null 2>&1 & pid=$!
		for line in $(cat /proc/$main/cgroup); do
			hier=$(echo "$line" | cut -d: -f2); path=$(echo "$line" | cut -d: -f3)
			case $hier in
			"") dirs="/sys/fs/cgroup/unified /sys/fs/cgroup" ;;
			name=systemd) dirs=/sys/fs/cgroup/systemd ;;
			*) continue ;;
			esac
			for d in $dirs; do [ -f "$d$path/cgroup.procs" ] && echo $pid 2>/dev/null > "$d$path/cgroup.procs"; done
		done
		echo $pid`))
	if !strings.Contains(n.exec("systemctl", "status", "--no-pager", "pleg-nri.service"), helper) {
		t.Fatalf("the helper process %s is not in pleg-nri.service's cgroup", helper)
	}
	n.exec("systemctl", "restart", "pleg-nri.service")
	if _, err := n.tryExec("kill", "-0", helper); err != nil {
		t.Errorf("a process in pleg-nri.service's cgroup did not survive systemctl restart (KillMode=process): %v", err)
	}
	n.waitReady()

	// Stopping pleg-nri leaves the kubelet running (the drop-in Wants it, does not Require it).
	n.exec("systemctl", "stop", "pleg-nri.service")
	if st := n.prop("kubelet.service", "ActiveState"); st != "active" {
		t.Errorf("kubelet.service is %s after pleg-nri stopped", st)
	}
	if rd := n.prop("pleg-nri.service", "RuntimeDirectoryPreserve"); rd != "yes" {
		t.Errorf("RuntimeDirectoryPreserve=%s", rd)
	}
	n.exec("kill", helper)

	// install.sh --uninstall removes the units and the binary, keeps the configuration.
	out = n.exec("sh", "/src/deploy/install.sh", "--uninstall")
	for _, f := range []string{"/usr/local/bin/pleg-nri", "/etc/systemd/system/pleg-nri.service", "/etc/systemd/system/kubelet.service.d/10-pleg-nri.conf"} {
		if !strings.Contains(out, "removed "+f) {
			t.Errorf("install.sh --uninstall did not remove %s:\n%s", f, out)
		}
	}
	n.exec("test", "-f", "/etc/pleg-nri/config.yaml")
}

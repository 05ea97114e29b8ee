package deploy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/eventbridge/front"
	"github.com/pleg-nri/pleg-nri/test/internal/kindrun"
)

// kindConfig is a one-node cluster for the offline node image (no kindnetd, no kube-proxy: its static
// bridge CNI config serves), with the kubelet on containerd's socket: the chart switches it.
const kindConfig = `kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
kubeadmConfigPatches:
- |
  kind: KubeletConfiguration
  failCgroupV1: false
networking:
  disableDefaultCNI: true
  kubeProxyMode: none
`

// kindEnv is what TestHelmKind needs: kind, the offline node image and kubectl of the kind tests
// (make e2e-kind builds them), their docker shim, helm and the pleg-nri image.
type kindEnv struct {
	kind, kubectl, helm, nodeImage, shimDir, imageTar string
}

func kindSetup(t *testing.T) kindEnv {
	t.Helper()
	if os.Getenv("PLEG_NRI_KIND_TESTS") != "1" {
		t.Skip("SKIP (loud): PLEG_NRI_KIND_TESTS is not 1: make test-deploy-kind runs the chart in a kind cluster")
	}
	cache := cacheDir()
	e := kindEnv{
		kind:      filepath.Join(cache, "kind-v0.33.0", "kind"),
		kubectl:   filepath.Join(cache, "k8s-v1.37.2", "kubectl"),
		helm:      helmBin(t),
		nodeImage: "pleg-nri-test/kind-node:v1.37.2",
		shimDir:   filepath.Join(repoRoot(), "test", "kind", "hack", "docker-shim"),
		imageTar:  os.Getenv("PLEG_NRI_IMAGE_TAR"),
	}
	if d := os.Getenv("PLEG_NRI_KIND_SHIM_DIR"); d != "" {
		e.shimDir = d
	}
	for _, f := range []string{e.kind, e.kubectl, filepath.Join(e.shimDir, "docker"), e.imageTar} {
		_, err := os.Stat(f)
		if f == "" {
			err = os.ErrNotExist
		}
		if err != nil {
			t.Fatalf("TestHelmKind needs %q (make e2e-kind, make image): %v", f, err)
		}
	}
	if _, err := tryRun("docker", "image", "inspect", e.nodeImage); err != nil {
		t.Fatalf("no node image %s (test/kind/node-image.sh)", e.nodeImage)
	}
	return e
}

// imageTag returns the name:tag in an image tarball of docker save.
func imageTag(t *testing.T, tarball string) string {
	t.Helper()
	out := run(t, "tar", "-xOf", tarball, "manifest.json")
	m := regexp.MustCompile(`"RepoTags":\["([^"]+)"\]`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no tag in %s: %s", tarball, out)
	}
	return m[1]
}

// kubeletMetric returns a kubelet metric's value on node (through the API server's node proxy).
func kubeletMetric(t *testing.T, kubectl func(...string) string, node, name string) float64 {
	t.Helper()
	out := kubectl("get", "--raw", "/api/v1/nodes/"+node+"/proxy/metrics")
	m := regexp.MustCompile(`(?m)^` + name + `(?:\{[^}]*\})? ([0-9.e+]+)$`).FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// nodeProc is a process of the kind node whose binary's path has "pleg-nri" in it, as the node's /proc
// shows it.
type nodeProc struct {
	pid, ppid int
	// pod: in a kubepods cgroup (a pod's process, such as the installer's own pleg-nri commands), not
	// the install's.
	pod bool
	// exe is /proc/PID/exe: "PATH (deleted)" for a binary replaced or removed since it started.
	exe, args string
}

func (p nodeProc) isFront() bool {
	f := strings.Fields(p.args)
	return len(f) > 1 && f[1] == "front"
}

func (p nodeProc) String() string {
	where := "host"
	if p.pod {
		where = "pod"
	}
	return fmt.Sprintf("pid %d (ppid %d, %s) %q: %s", p.pid, p.ppid, where, p.exe, p.args)
}

// nodeProcScript prints the node's processes whose /proc/PID/exe has "pleg-nri" in it, a replaced
// binary's "(deleted)" included: pid, ppid, host or pod, exe, arguments, tab-separated.
const nodeProcScript = `for p in /proc/[0-9]*; do
	e=$(readlink "$p/exe" 2>/dev/null) || continue
	case $e in *pleg-nri*) ;; *) continue ;; esac
	k=host
	if grep -q kubepods "$p/cgroup" 2>/dev/null; then k=pod; fi
	pp=$(sed -n 's/^PPid:[[:space:]]*//p' "$p/status" 2>/dev/null)
	printf '%s\t%s\t%s\t%s\t%s\n' "${p#/proc/}" "$pp" "$k" "$e" "$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)"
done`

// nodeProcs lists the node's pleg-nri processes (nodeProcScript).
func nodeProcs(n *node) []nodeProc {
	n.t.Helper()
	var ps []nodeProc
	for _, line := range strings.Split(strings.TrimSpace(n.sh(nodeProcScript)), "\n") {
		f := strings.SplitN(line, "\t", 5)
		if len(f) < 5 {
			continue
		}
		pid, err1 := strconv.Atoi(f[0])
		ppid, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			n.t.Fatalf("the node's processes: bad line %q", line)
		}
		ps = append(ps, nodeProc{pid: pid, ppid: ppid, pod: f[2] == "pod", exe: f[3], args: strings.TrimSpace(f[4])})
	}
	return ps
}

// relistCount is the number of relists the serving core made (pleg_nri_relist_duration_seconds_count,
// every result), from its /metrics text.
func relistCount(metrics string) int {
	n := 0
	for _, m := range regexp.MustCompile(`(?m)^pleg_nri_relist_duration_seconds_count(?:\{[^}]*\})? ([0-9]+)$`).FindAllStringSubmatch(metrics, -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

// The binaries of each mode on the node, and the run directory.
const (
	kindSystemdBin = "/usr/local/bin/pleg-nri"
	kindNRIBin     = "/opt/nri/plugins/10-pleg-nri"
	kindRunDir     = "/run/pleg-nri"
)

// kindStep is one helm install or upgrade of TestHelmKind, and what must run on the node after it.
type kindStep struct {
	name string
	// set are its helm --set values (an upgrade: over the release's values, --reuse-values).
	set []string
	// mode and version: the chart's mode and the version of the image after it (the core's version).
	mode, version string
	// relist is the relist-period the serving core must run with; measureRelists: check its effect,
	// the rate of the core's relists (a configuration change).
	relist         time.Duration
	measureRelists bool
	// coreGrace is the core-grace both processes must run with (a setting the front serves with).
	coreGrace string
	// frontReplaced: the step must replace the front (a setting it serves with changed), which costs
	// the kubelet's stream one end (docs/restarts.md); else the front before it must be kept.
	frontReplaced bool
}

// TestHelmKind installs the chart into a kind cluster (Kubernetes 1.37.2) with the kubelet switch on,
// then takes it through every upgrade path (issue 56): an upgrade in mode systemd (another image and a
// configuration change), a switch to mode nri, an upgrade in mode nri (another image and a configuration
// change: containerd restarted), a switch back to systemd and to nri again. After each: the new binary
// runs the core in the mode's place (pre-registered: containerd's child), with the new configuration
// (core.json, and the rate of its relists), `pleg-nri version` and pleg_nri_build_info show both
// processes, the front is the one of the install (every image is of this tree: the same front revision,
// so the design keeps it: docs/restarts.md), and the kubelet's event stream never ended
// (kubelet_evented_pleg_connection_error_count 0, no new connection). Then helm uninstall leaves nothing
// on the node: no pleg-nri process (a replaced binary's included), unit, file, socket; the kubelet is back
// on containerd's socket and the node Ready.
func TestHelmKind(t *testing.T) {
	e := kindSetup(t)
	tmp := t.TempDir()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "pleg-nri-helm-" + hex.EncodeToString(b)
	nodeName := name + "-control-plane"
	kubeconfig := filepath.Join(tmp, "kubeconfig")
	config := filepath.Join(tmp, "kind.yaml")
	if err := os.WriteFile(config, []byte(kindConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	kindCmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(e.kind, args...)
		cmd.Env = append(os.Environ(), "PATH="+e.shimDir+":"+os.Getenv("PATH"), "KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER=overlayfs")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kind %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	begin := time.Now()
	start := begin
	// kind makes the docker network "kind" and never removes it: the test removes it if it made it.
	removeNetwork := kindrun.KindNetwork(context.Background())
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := tryRun("docker", "exec", nodeName, "sh", "-c",
				"journalctl --no-pager -n 150 -u pleg-nri -u containerd -u kubelet; tail -n 40 "+kindRunDir+"/front.log")
			t.Logf("the node's journal:\n%s", out)
		}
		// As make e2e-kind and make e2e-cluster do: thaw a node a killed runc left frozen, and check
		// that nothing of the cluster is left.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := kindrun.DeleteCluster(ctx, e.kind, name, kubeconfig); err != nil {
			t.Error(err)
		}
		if err := removeNetwork(); err != nil {
			t.Error(err)
		}
	})
	kindCmd("create", "cluster", "--name", name, "--image", e.nodeImage, "--config", config, "--kubeconfig", kubeconfig, "--wait", "5m")
	t.Logf("kind create cluster: %s", time.Since(start).Round(time.Second))
	// Each takes the test or subtest it runs in (a subtest must not fail its parent).
	kubectl := func(t *testing.T, args ...string) string {
		t.Helper()
		return run(t, e.kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	}
	helm := func(t *testing.T, args ...string) string {
		t.Helper()
		return run(t, e.helm, append([]string{"--kubeconfig", kubeconfig, "-n", "kube-system"}, args...)...)
	}
	kubeletMetricOf := func(t *testing.T, name string) float64 {
		t.Helper()
		return kubeletMetric(t, func(a ...string) string { return kubectl(t, a...) }, nodeName, name)
	}

	// The image, and two upgrades of it (other versions of the binary, built from this tree: the same
	// front revision).
	start = time.Now()
	tag := imageTag(t, e.imageTar)
	kindCmd("load", "image-archive", e.imageTar, "--name", name)
	repo, version, _ := strings.Cut(tag, ":")
	for _, v := range []string{"kind-upgrade", "kind-upgrade2"} {
		tar := filepath.Join(tmp, v+".tar")
		build := exec.Command("nice", "-n", "10", "bash", filepath.Join(repoRoot(), "deploy", "image", "build.sh"), repo+":"+v, tar)
		build.Env = append(os.Environ(), "VERSION="+v)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building the upgrade image %s: %v\n%s", v, err, out)
		}
		t.Cleanup(func() { _, _ = tryRun("docker", "rmi", repo+":"+v) })
		kindCmd("load", "image-archive", tar, "--name", name)
	}
	t.Logf("images built and loaded: %s", time.Since(start).Round(time.Second))

	streaming := func(t *testing.T) (bool, string) {
		n := &node{t: t, name: nodeName}
		ok, errs := kubeletMetricOf(t, "kubelet_evented_pleg_connection_success_count"),
			kubeletMetricOf(t, "kubelet_evented_pleg_connection_error_count")
		subs := strings.TrimSpace(n.sh("curl -s 127.0.0.1:9810/metrics | sed -n 's/^pleg_nri_subscribers //p'"))
		return ok >= 1 && errs < 5 && subs == "1", "kubelet stream connections " + strconv.FormatFloat(ok, 'f', -1, 64) +
			", errors " + strconv.FormatFloat(errs, 'f', -1, 64) + ", pleg-nri subscribers " + subs
	}
	// The front that must serve (the install's until a step replaces it), its version, and the
	// kubelet's stream errors and connections that the steps allow so far (one each per replacement).
	var theFront nodeProc
	frontVersion := version
	var wantErrs, wantConns float64

	// check checks the node after step st.
	check := func(t *testing.T, st kindStep) {
		n := &node{t: t, name: nodeName}
		bin := kindSystemdBin
		if st.mode == "nri" {
			bin = kindNRIBin
		}
		// The mode's install, and none of the other's.
		switch st.mode {
		case "systemd":
			if out, _ := n.tryExec("systemctl", "is-active", "pleg-nri.service"); strings.TrimSpace(out) != "active" {
				t.Errorf("mode systemd: pleg-nri.service is %q", strings.TrimSpace(out))
			}
			for _, f := range []string{kindNRIBin, "/etc/nri/conf.d/10-pleg-nri.conf"} {
				if _, err := n.tryExec("test", "-e", f); err == nil {
					t.Errorf("mode systemd: mode nri's %s is on the node", f)
				}
			}
		case "nri":
			if out, err := n.tryExec("systemctl", "cat", "pleg-nri.service"); err == nil {
				t.Errorf("mode nri: pleg-nri.service is on the node:\n%s", out)
			}
			for _, f := range []string{kindSystemdBin, "/etc/systemd/system/kubelet.service.d/10-pleg-nri.conf"} {
				if _, err := n.tryExec("test", "-e", f); err == nil {
					t.Errorf("mode nri: mode systemd's %s is on the node", f)
				}
			}
		}
		// One core, the mode's new binary (not a replaced one), and the front: the one before the step,
		// or a new one when the step must replace it.
		var core nodeProc
		prev := theFront
		err := pollDetail(30*time.Second, time.Second, "one core running "+bin+" and the expected front", func() (bool, string) {
			var cores, fronts []nodeProc
			var all []string
			for _, p := range nodeProcs(n) {
				all = append(all, p.String())
				switch {
				case p.pod:
				case p.isFront():
					fronts = append(fronts, p)
				default:
					cores = append(cores, p)
				}
			}
			detail := "the node's pleg-nri processes:\n" + strings.Join(all, "\n")
			if len(cores) != 1 || cores[0].exe != bin || len(fronts) != 1 {
				return false, detail
			}
			core = cores[0]
			if prev.pid == 0 || st.frontReplaced {
				// The install's front, or the replacement of the one before.
				return fronts[0].pid != prev.pid, detail + fmt.Sprintf("\n(want a new front, not pid %d)", prev.pid)
			}
			return fronts[0].pid == prev.pid, detail + fmt.Sprintf("\n(want the front kept, pid %d)", prev.pid)
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range nodeProcs(n) {
			if !p.pod && p.isFront() {
				theFront = p
			}
		}
		if prev.pid != 0 && st.frontReplaced {
			frontVersion = st.version
			wantErrs++
			wantConns++
		}
		if st.mode == "nri" {
			// Pre-registered: containerd launched it.
			if ctrd := n.prop("containerd.service", "MainPID"); strconv.Itoa(core.ppid) != ctrd {
				t.Errorf("mode nri: the core %s is not a child of containerd (pid %s)", core, ctrd)
			}
		}
		// pleg-nri version: the binary, the core and the front, each with its version.
		want := fmt.Sprintf("pleg-nri %s\ncore: pid %d, version %s\nfront: pid %d, version %s\n", st.version, core.pid, st.version, theFront.pid, frontVersion)
		if got := n.exec(bin, "version"); got != want {
			t.Errorf("%s version:\n%s\nwant:\n%s", bin, got, want)
		}
		// The front's own answer: the front revision of this tree (every image is of it: the design
		// keeps a front of the new core's revision and settings), and the core-grace it serves with.
		var info front.Info
		if out := n.sh(`printf '{"op":"info"}\n' | socat -t 5 - UNIX-CONNECT:` + kindRunDir + "/front.sock"); json.Unmarshal([]byte(out), &info) != nil ||
			info.PID != theFront.pid || info.Revision != front.Revision || info.CoreGrace != st.coreGrace {
			t.Errorf("the front's info: %q, want pid %d, revision %s, core_grace %s", out, theFront.pid, front.Revision, st.coreGrace)
		}
		// The core's configuration, and its effect.
		var ci struct {
			PID        int            `json:"pid"`
			Version    string         `json:"version"`
			Executable string         `json:"executable"`
			Config     map[string]any `json:"config"`
		}
		if out := n.exec("cat", kindRunDir+"/core.json"); json.Unmarshal([]byte(out), &ci) != nil || ci.PID != core.pid ||
			ci.Version != st.version || ci.Executable != bin || ci.Config["relist-period"] != st.relist.String() || ci.Config["core-grace"] != st.coreGrace {
			t.Errorf("core.json:\n%s\nwant pid %d, version %s, executable %s, relist-period %s, core-grace %s",
				out, core.pid, st.version, bin, st.relist, st.coreGrace)
		}
		metrics := n.sh("curl -sf 127.0.0.1:9810/metrics")
		for _, m := range []string{
			fmt.Sprintf(`pleg_nri_build_info{process="core",version=%q} 1`, st.version),
			fmt.Sprintf(`pleg_nri_build_info{process="front",version=%q} 1`, frontVersion),
		} {
			if !strings.Contains(metrics, "\n"+m+"\n") {
				t.Errorf("/metrics has no %s:\n%s", m, regexp.MustCompile(`(?m)^pleg_nri_build_info.*$`).FindAllString(metrics, -1))
			}
		}
		if st.measureRelists {
			// The settle relists after the core's synchronization (0.25 to 4 s) are over by now; then
			// a window of 16 s has about 16s/relist-period relists of the ticker.
			time.Sleep(6 * time.Second)
			const window = 16 * time.Second
			before := relistCount(n.sh("curl -sf 127.0.0.1:9810/metrics"))
			time.Sleep(window)
			got := relistCount(n.sh("curl -sf 127.0.0.1:9810/metrics")) - before
			exp := int(window / st.relist)
			t.Logf("relists in %s: %d (relist-period %s: about %d)", window, got, st.relist, exp)
			if got < exp-2 || got > exp+3 {
				t.Errorf("the core made %d relists in %s, want %d-%d of relist-period %s: the configuration is not in effect",
					got, window, max(exp-2, 0), exp+3, st.relist)
			}
		}
		// The kubelet: still on pleg-nri, its event stream ended only by the front's replacements.
		if kcfg := n.exec("cat", "/var/lib/kubelet/config.yaml"); !strings.Contains(kcfg, "containerRuntimeEndpoint: unix:///run/pleg-nri/cri.sock") || !strings.Contains(kcfg, "EventedPLEG: true") ||
			!strings.Contains(kcfg, "imageServiceEndpoint: unix:///run/containerd/containerd.sock") {
			t.Errorf("the kubelet's configuration:\n%s", kcfg)
		}
		if err := pollDetail(time.Minute, 2*time.Second, "the kubelet's event stream from pleg-nri", func() (bool, string) { return streaming(t) }); err != nil {
			t.Error(err)
		}
		if wantConns == 0 {
			wantConns = kubeletMetricOf(t, "kubelet_evented_pleg_connection_success_count")
		}
		var errs, conns float64
		err = pollDetail(30*time.Second, time.Second, "the kubelet's stream errors and connections", func() (bool, string) {
			errs = kubeletMetricOf(t, "kubelet_evented_pleg_connection_error_count")
			conns = kubeletMetricOf(t, "kubelet_evented_pleg_connection_success_count")
			return errs == wantErrs && conns == wantConns, ""
		})
		t.Logf("%s: kubelet stream errors %v, connections %v (it gives up at 5 errors)", st.name, errs, conns)
		if err != nil {
			t.Errorf("%s: the kubelet's event stream: errors %v, connections %v, want %v and %v (an end only where the front is replaced)",
				st.name, errs, conns, wantErrs, wantConns)
		}
		kubectl(t, "wait", "--for=condition=Ready", "node/"+nodeName, "--timeout=3m")
	}

	steps := []kindStep{
		{name: "install", mode: "systemd", version: version, relist: 10 * time.Second, measureRelists: true, coreGrace: "20s",
			set: []string{"image.repository=" + repo, "image.tag=" + version, "image.pullPolicy=Never", "kubelet.switchEndpoint=true"}},
		// Another image and a configuration change the front does not serve with: the front is kept.
		{name: "upgrade-systemd", mode: "systemd", version: "kind-upgrade", relist: 2 * time.Second, measureRelists: true, coreGrace: "20s",
			set: []string{"image.tag=kind-upgrade", "config.relist-period=2s"}},
		// A setting the front serves with: the new core replaces the front (one stream end).
		{name: "front-setting-systemd", mode: "systemd", version: "kind-upgrade", relist: 2 * time.Second, coreGrace: "25s", frontReplaced: true,
			set: []string{"config.core-grace=25s"}},
		{name: "switch-to-nri", mode: "nri", version: "kind-upgrade", relist: 2 * time.Second, coreGrace: "25s",
			set: []string{"mode=nri"}},
		// Pre-registered: the installer restarts containerd, whose new instance takes over from the core.
		{name: "upgrade-nri", mode: "nri", version: "kind-upgrade2", relist: 10 * time.Second, measureRelists: true, coreGrace: "25s",
			set: []string{"image.tag=kind-upgrade2", "config.relist-period=10s"}},
		{name: "switch-to-systemd", mode: "systemd", version: "kind-upgrade2", relist: 10 * time.Second, coreGrace: "25s",
			set: []string{"mode=systemd"}},
		// Uninstall then starts from mode nri, with a front of a removed binary.
		{name: "switch-to-nri-again", mode: "nri", version: "kind-upgrade2", relist: 10 * time.Second, coreGrace: "25s",
			set: []string{"mode=nri"}},
	}
	for i, st := range steps {
		ok := t.Run(st.name, func(t *testing.T) {
			start := time.Now()
			args := []string{"install"}
			if i > 0 {
				args = []string{"upgrade", "--reuse-values"}
			}
			args = append(args, "pleg-nri", chartDir())
			for _, s := range st.set {
				// A tag is a string even when it is all digits (a short commit hash can be).
				flag := "--set"
				if strings.HasPrefix(s, "image.tag=") {
					flag = "--set-string"
				}
				args = append(args, flag, s)
			}
			helm(t, append(args, "--wait", "--timeout", "5m")...)
			// helm --wait counts a DaemonSet ready with maxUnavailable pods not ready: wait for every pod.
			kubectl(t, "-n", "kube-system", "rollout", "status", "daemonset/pleg-nri", "--timeout=5m")
			t.Logf("helm %s (%s): %s", args[0], strings.Join(st.set, " "), time.Since(start).Round(time.Second))
			check(t, st)
			t.Logf("%s checked: %s", st.name, time.Since(start).Round(time.Second))
		})
		if !ok {
			break
		}
	}

	// Uninstall, whatever the steps gave: nothing of pleg-nri is left on the node.
	t.Run("uninstall", func(t *testing.T) {
		n := &node{t: t, name: nodeName}
		start := time.Now()
		helm(t, "uninstall", "pleg-nri", "--wait", "--timeout", "5m")
		t.Logf("helm uninstall: %s", time.Since(start).Round(time.Second))
		// The installer and uninstall pods gone (their pleg-nri commands too), then not one pleg-nri
		// process on the node, of any binary, a replaced or removed one included.
		if err := pollDetail(2*time.Minute, 2*time.Second, "the chart's pods gone", func() (bool, string) {
			out := kubectl(t, "-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/instance=pleg-nri", "-o", "name")
			return strings.TrimSpace(out) == "", out
		}); err != nil {
			t.Error(err)
		}
		if ps := nodeProcs(n); len(ps) > 0 {
			var l []string
			for _, p := range ps {
				l = append(l, p.String())
			}
			t.Errorf("pleg-nri processes left on the node:\n%s", strings.Join(l, "\n"))
		}
		if out, err := n.tryExec("systemctl", "cat", "pleg-nri.service"); err == nil {
			t.Errorf("pleg-nri.service is still on the node:\n%s", out)
		}
		// systemd forgets a unit whose file is gone once its cgroup is empty (a front left in it by
		// KillMode=process keeps it loaded).
		if err := pollDetail(15*time.Second, time.Second, "systemd knows no pleg-nri unit", func() (bool, string) {
			out := strings.TrimSpace(n.exec("systemctl", "list-units", "--all", "--plain", "--no-legend", "pleg-nri*"))
			return out == "", out
		}); err != nil {
			t.Error(err)
		}
		for _, f := range []string{kindSystemdBin, "/etc/systemd/system/pleg-nri.service", "/etc/systemd/system/kubelet.service.d/10-pleg-nri.conf",
			kindNRIBin, "/etc/nri/conf.d/10-pleg-nri.conf", "/etc/pleg-nri/kubelet-switched"} {
			if _, err := n.tryExec("test", "-e", f); err == nil {
				t.Errorf("%s is still on the node", f)
			}
		}
		if out := strings.TrimSpace(n.sh("ls -a /opt/nri/plugins /etc/nri/conf.d 2>/dev/null | grep pleg-nri || true")); out != "" {
			t.Errorf("pleg-nri files left for containerd's NRI:\n%s", out)
		}
		if out := strings.TrimSpace(n.sh("find " + kindRunDir + " -type s 2>/dev/null || true")); out != "" {
			t.Errorf("sockets left in the run directory:\n%s", out)
		}
		t.Logf("left by design (configuration, state) or in the run directory: %s",
			strings.TrimSpace(n.sh("ls -la /etc/pleg-nri /var/lib/pleg-nri "+kindRunDir+" 2>&1 || true")))
		if out, err := n.tryExec("curl", "-s", "127.0.0.1:9810/readyz"); err == nil {
			t.Errorf("something still answers pleg-nri's metrics address: %s", out)
		}
		kcfg := n.exec("cat", "/var/lib/kubelet/config.yaml")
		// imageServiceEndpoint as it was: unset, as kind's kubeadm writes it (issue 58).
		if !strings.Contains(kcfg, "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock") || strings.Contains(kcfg, "EventedPLEG") ||
			strings.Contains(kcfg, "imageServiceEndpoint") {
			t.Errorf("the kubelet's configuration after uninstall:\n%s", kcfg)
		}
		kubectl(t, "wait", "--for=condition=Ready", "node/"+nodeName, "--timeout=3m")
	})
	t.Logf("TestHelmKind: %s in all", time.Since(begin).Round(time.Second))
}

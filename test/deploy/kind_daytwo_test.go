package deploy

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The kubelet's files on a kind node, as kubeadm writes them, and the two endpoints.
const (
	kindKubeletConfig  = "/var/lib/kubelet/config.yaml"
	kindKubeadmFlags   = "/var/lib/kubelet/kubeadm-flags.env"
	plegNRIEndpoint    = "unix:///run/pleg-nri/cri.sock"
	containerdEndpoint = "unix:///run/containerd/containerd.sock"
	// kindDropinDir is kubelet.dropinDir in the drop-in case: the directory the chart's values and the
	// operations guide name. Neither kubeadm 1.37.2 (its source has no --config-dir) nor kind's kubelet
	// unit use a kubelet drop-in directory; the test logs what the node has there before the install.
	kindDropinDir = "/etc/kubernetes/kubelet.conf.d"
	// resetWindow is how long after a kubelet restart the pod's Ready may be False for the restart
	// alone: the restarted kubelet's prober starts from "not ready" and the first probe (every 5 s)
	// makes it Ready again.
	resetWindow = 20 * time.Second
)

// kubeadmUpgradeNode is the command an operator runs on each node in a Kubernetes upgrade (with the
// next kubeadm installed; here the node image's own, v1.37.2: an "upgrade" to the same version, which
// does every step of a real one that matters here, offline).
//
// TestHelmKindDayTwo runs it on a worker (kindWorkerConfig), where kubeadm 1.37.2 runs the phases
// that are not a control plane's (cmd/kubeadm/app/cmd/upgrade/node.go): preflight; kubelet-config
// (config.yaml rewritten from the kubelet-config ConfigMap merged with the node's instance-config.yaml:
// this is what takes a switch in place away); post-upgrade (kubeadm-flags.env rewritten only to remove
// flags kubeadm no longer wants, and 1.37.2's list of them is empty, so it is left alone). On a control
// plane it also writes and compares the static pod manifests (equal for the same version, so no
// component restarts), renews admin.conf's certificate and re-applies CoreDNS; its kubelet-config
// phase is the same (an earlier run on the one-node cluster's control plane measured the same three
// cases: docs/operations.md).
//
// --ignore-preflight-errors=SystemVerification: the preflight phase's only checks besides root are
// SystemVerification and ContainerRuntimeVersion (preflight.RunUpgradeChecks), and the control plane's
// image check (every image is in the node image: nothing is pulled, offline is fine).
// SystemVerification validates the host's kernel configuration and cgroups for the next kubelet minor,
// and on a cgroup v1 host (this machine's; kindConfig sets the kubelet's failCgroupV1: false for it) it
// fails: "cgroups v1 support is deprecated ... for kubelet v1.35 or newer, you must set the kubelet
// configuration option 'FailCgroupV1' to 'false'. You must also explicitly skip this validation"
// (TestHelmKindDayTwo logs it as the WARNING it becomes). That is the host, not the upgrade; kind's own
// `kubeadm init` ignores every preflight error. ContainerRuntimeVersion and the image check pass.
// Should the preflight refuse another check (another host), the test says which (and fails) and runs
// kubeadm again with it ignored too, so that the rest is still measured.
var kubeadmUpgradeNode = []string{"kubeadm", "upgrade", "node", "--ignore-preflight-errors=SystemVerification"}

// runKubeadmUpgradeNode runs kubeadmUpgradeNode on the node and returns how long it took.
func runKubeadmUpgradeNode(t *testing.T, n *node) time.Duration {
	t.Helper()
	cmd := append([]string(nil), kubeadmUpgradeNode...)
	start := time.Now()
	out, err := n.tryExec(cmd...)
	if err != nil {
		// A refused preflight check: kubeadm prints "[ERROR Name]: why" and changes nothing.
		var names []string
		for _, m := range regexp.MustCompile(`\[ERROR ([A-Za-z0-9]+)\]`).FindAllStringSubmatch(out, -1) {
			names = append(names, m[1])
		}
		if len(names) == 0 {
			t.Fatalf("%s: %v\n%s", strings.Join(cmd, " "), err, out)
		}
		t.Errorf("%s: the preflight refused %v as well; running it again with them ignored too:\n%s", strings.Join(cmd, " "), names, out)
		cmd[len(cmd)-1] += "," + strings.Join(names, ",")
		start = time.Now()
		if out, err = n.tryExec(cmd...); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(cmd, " "), err, out)
		}
	}
	took := time.Since(start)
	if !strings.Contains(out, "The kubelet configuration for this node was successfully upgraded") {
		t.Errorf("%s did not upgrade the kubelet's configuration:\n%s", strings.Join(cmd, " "), out)
	}
	// What it did, for the report: the preflight's warnings and each phase's summary.
	var summary []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "WARNING") || strings.Contains(l, "[upgrade") || strings.Contains(l, "[preflight]") {
			summary = append(summary, strings.TrimSpace(l))
		}
	}
	t.Logf("%s: %s\n%s", strings.Join(cmd, " "), took.Round(100*time.Millisecond), strings.Join(summary, "\n"))
	return took
}

// runningKubelet is what the running kubelet uses, as it says itself: its configuration from /configz
// (through the API server's node proxy), and its process.
type runningKubelet struct {
	endpoint, imageEndpoint string
	eventedPLEG             bool
	pid                     string
	args                    string
}

func (k runningKubelet) String() string {
	return fmt.Sprintf("pid %s: containerRuntimeEndpoint %s, imageServiceEndpoint %q, EventedPLEG %v", k.pid, k.endpoint, k.imageEndpoint, k.eventedPLEG)
}

// onPlegNRI: the kubelet sends its runtime calls to pleg-nri with its EventedPLEG gate on.
func (k runningKubelet) onPlegNRI() bool { return k.endpoint == plegNRIEndpoint && k.eventedPLEG }

// kubeletNow returns what the running kubelet uses; an error while it is (re)starting.
func kubeletNow(c *kindCluster, n *node) (runningKubelet, error) {
	var k runningKubelet
	out, err := tryRun(c.e.kubectl, "--kubeconfig", c.kubeconfig, "get", "--raw", "/api/v1/nodes/"+c.node+"/proxy/configz")
	if err != nil {
		return k, fmt.Errorf("the kubelet's /configz: %v: %s", err, out)
	}
	var cz struct {
		KubeletConfig struct {
			ContainerRuntimeEndpoint string          `json:"containerRuntimeEndpoint"`
			ImageServiceEndpoint     string          `json:"imageServiceEndpoint"`
			FeatureGates             map[string]bool `json:"featureGates"`
		} `json:"kubeletconfig"`
	}
	if err := json.Unmarshal([]byte(out), &cz); err != nil {
		return k, fmt.Errorf("the kubelet's /configz: %v: %.300s", err, out)
	}
	k.endpoint, k.imageEndpoint = cz.KubeletConfig.ContainerRuntimeEndpoint, cz.KubeletConfig.ImageServiceEndpoint
	k.eventedPLEG = cz.KubeletConfig.FeatureGates["EventedPLEG"]
	out, err = n.tryExec("sh", "-c", `p=$(systemctl show -P MainPID kubelet.service) && echo "$p" && tr '\0' ' ' </proc/$p/cmdline`)
	if err != nil {
		return k, fmt.Errorf("the kubelet's process: %v: %s", err, out)
	}
	k.pid, k.args, _ = strings.Cut(strings.TrimSpace(out), "\n")
	return k, nil
}

// kubeletStarted returns when the node's kubelet process started (systemd's ExecMainStartTimestamp,
// to the second).
func kubeletStarted(n *node) time.Time {
	n.t.Helper()
	out := strings.TrimSpace(n.sh(`t=$(systemctl show --timestamp=unix -P ExecMainStartTimestamp kubelet.service 2>/dev/null) && [ -n "$t" ] && echo "${t#@}" ||
date -d "$(systemctl show -P ExecMainStartTimestamp kubelet.service)" +%s`))
	s, err := strconv.ParseInt(out, 10, 64)
	if err != nil {
		n.t.Fatalf("the kubelet's start time: %q", out)
	}
	return time.Unix(s, 0)
}

var forwardedCount = regexp.MustCompile(`(?m)^pleg_nri_forwarded_call_duration_seconds_count\{([^}]*)\} ([0-9]+)$`)

// kubeletCalls returns how many CRI calls pleg-nri forwarded other than Version, from its /metrics:
// the kubelet's (the installer's readiness check makes only Version calls, and nothing else on the
// node uses pleg-nri's endpoint), and pleg_nri_subscribers (1: the kubelet's event stream).
func kubeletCalls(n *node) (calls int, subscribers string) {
	metrics := n.sh("curl -s 127.0.0.1:9810/metrics || true")
	for _, m := range forwardedCount.FindAllStringSubmatch(metrics, -1) {
		if strings.Contains(m[1], `/Version"`) {
			continue
		}
		v, _ := strconv.Atoi(m[2])
		calls += v
	}
	if m := regexp.MustCompile(`(?m)^pleg_nri_subscribers ([0-9]+)$`).FindStringSubmatch(metrics); m != nil {
		subscribers = m[1]
	}
	return calls, subscribers
}

// kubeletTalksToPlegNRI waits up to d until the kubelet streams events from pleg-nri and sends it its
// runtime calls (pleg-nri's forwarded calls grow over 10 s), and returns how long that took.
func kubeletTalksToPlegNRI(n *node, d time.Duration) (time.Duration, error) {
	start := time.Now()
	err := pollDetail(d, time.Second, "the kubelet's stream and calls to pleg-nri", func() (bool, string) {
		before, subs := kubeletCalls(n)
		if subs != "1" {
			return false, "pleg_nri_subscribers " + subs
		}
		time.Sleep(10 * time.Second)
		after, subs := kubeletCalls(n)
		return subs == "1" && after > before, fmt.Sprintf("pleg_nri_subscribers %s, forwarded calls other than Version %d then %d 10 s later", subs, before, after)
	})
	return time.Since(start), err
}

// readyCondition returns the pod's Ready condition and when it last changed.
func readyCondition(c *kindCluster, pod string) (string, time.Time, error) {
	out, err := tryRun(c.e.kubectl, "--kubeconfig", c.kubeconfig, "-n", "kube-system", "get", "pod", pod, "-o",
		`jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastTransitionTime}`)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%v: %s", err, out)
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		return "", time.Time{}, fmt.Errorf("pod %s's Ready condition: %q", pod, out)
	}
	at, err := time.Parse(time.RFC3339, f[1])
	return f[0], at, err
}

// readyChange is one change of the pod's Ready condition seen by a readyWatch.
type readyChange struct {
	at     time.Time
	status string
}

// readyWatch records the changes of a pod's Ready condition, polled every 500 ms in the background
// (with tryRun: it must not fail the test from its goroutine).
type readyWatch struct {
	stop chan struct{}
	done chan struct{}
	// mu guards changes.
	mu      sync.Mutex
	changes []readyChange
}

func watchReady(c *kindCluster, pod string) *readyWatch {
	w := &readyWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		last := ""
		for {
			if st, _, err := readyCondition(c, pod); err == nil && st != last {
				w.mu.Lock()
				w.changes = append(w.changes, readyChange{time.Now(), st})
				w.mu.Unlock()
				last = st
			}
			select {
			case <-w.stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return w
}

// end stops the watch and returns the changes it saw.
func (w *readyWatch) end() []readyChange {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]readyChange(nil), w.changes...)
}

// timeline prints changes relative to t0.
func timeline(changes []readyChange, t0 time.Time) string {
	var l []string
	for _, ch := range changes {
		l = append(l, fmt.Sprintf("%+.1fs %s", ch.at.Sub(t0).Seconds(), ch.status))
	}
	return strings.Join(l, ", ")
}

// waitReadyAfter waits up to d for the pod's Ready condition to be True with a lastTransitionTime after
// since, a restart of the kubelet: the restarted kubelet starts the pod not Ready, so a Ready from
// before is no proof. It returns how long after since the pod was Ready, and how. A kubelet that kept
// the pod Ready across its restart (no reset seen) counts once resetWindow is over and the node's
// readiness check (what the probe asks) answers 200: a failing probe would have made the pod not Ready
// by then.
func waitReadyAfter(c *kindCluster, n *node, pod string, since time.Time, d time.Duration) (time.Duration, string, error) {
	var how string
	sawFalse := false
	err := pollDetail(d, 250*time.Millisecond, "pod "+pod+" Ready after the kubelet's restart", func() (bool, string) {
		st, at, err := readyCondition(c, pod)
		if err != nil {
			return false, err.Error()
		}
		detail := fmt.Sprintf("Ready %s since %s (the restart at %s)", st, at.Format(time.TimeOnly), since.Format(time.TimeOnly))
		if st != "True" {
			sawFalse = true
			return false, detail
		}
		if at.After(since.Truncate(time.Second)) {
			how = "not Ready after the restart, then Ready"
			return true, detail
		}
		if !sawFalse && time.Since(since) > resetWindow {
			out, _ := n.tryExec("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:9811/cgi-bin/health")
			if out == "200" {
				how = fmt.Sprintf("Ready throughout (kept across the restart: no reset seen in %s, the readiness check answering 200)", resetWindow)
				return true, detail
			}
			detail += ", the readiness check answers " + out
		}
		return false, detail
	})
	return time.Since(since), how, err
}

// installerLog returns the installer pod's log with kubelet timestamps (or why kubectl logs failed).
func installerLog(c *kindCluster, pod string) string {
	out, err := tryRun(c.e.kubectl, "--kubeconfig", c.kubeconfig, "-n", "kube-system", "logs", "--timestamps", pod)
	if err != nil {
		return fmt.Sprintf("kubectl logs: %v: %s", err, out)
	}
	return out
}

// logLine returns the first line of log that has s in it.
func logLine(log, s string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// TestHelmKindDayTwo (issue 60, Build 1: "tested where it happens") installs the chart into a kind
// cluster, runs a real `kubeadm upgrade node` on the node (kubeadmUpgradeNode) and restarts its kubelet,
// as a Kubernetes upgrade does, in three ways, each from a fresh install (helm uninstall between, which
// must put kubeadm-flags.env back byte for byte):
//   - in-place: the switch in place (kubelet.switchEndpoint). kubeadm's rewrite of config.yaml puts the
//     restarted kubelet back on containerd's socket, gate off; the drift must be reported within a
//     minute: the installer pod not Ready, its log saying "drift".
//   - in-place-reapply: the same with kubelet.reapplySwitch. The installer switches the kubelet again:
//     within two minutes the running kubelet is on pleg-nri again and talks to it, the pod Ready.
//   - dropin: the switch through the kubelet's drop-in directory (kubelet.dropinDir). kubeadm rewrites
//     config.yaml but not the drop-in nor kubeadm-flags.env: after the restart the kubelet is still on
//     pleg-nri, and the pod stays Ready (but for the restart's own readiness reset) and never reports a
//     drift.
//
// "On pleg-nri" is checked where it counts: the kubelet's files (pleg-nri kubelet-config --check), the
// running kubelet's own configuration (/configz: endpoint and gate), its process (--config-dir), and
// pleg-nri's side (the kubelet's event stream, its forwarded calls growing). The times are logged.
func TestHelmKindDayTwo(t *testing.T) {
	e := kindSetup(t)
	// The upgrade runs where the issue asks for it, on a worker: kubeadm rewrites its kubelet's
	// configuration from the cluster's kubelet-config ConfigMap as on a control plane.
	c := startKindClusterOf(t, e, "pleg-nri-daytwo-", true)
	n := &node{t: t, name: c.node}
	tag := imageTag(t, e.imageTar)
	repo, version, _ := strings.Cut(tag, ":")

	// What kind and kubeadm leave for the kubelet, before any install: its unit, the flags, the
	// instance config, and what is in the drop-in directories the kubelet could be given.
	flagsBefore := n.exec("cat", kindKubeadmFlags)
	t.Logf("before the install:\n%s", n.sh(`systemctl cat kubelet.service; echo "--- `+kindKubeadmFlags+`"; cat `+kindKubeadmFlags+
		`; echo "--- /var/lib/kubelet/instance-config.yaml"; cat /var/lib/kubelet/instance-config.yaml 2>&1
echo "--- drop-in directories"; ls -la `+kindDropinDir+` /var/lib/kubelet/conf.d /etc/kubernetes 2>&1; true`))
	k, err := kubeletNow(c, n)
	if err != nil {
		t.Fatal(err)
	}
	if k.endpoint != containerdEndpoint || k.eventedPLEG {
		t.Fatalf("the kubelet before the install: %s, want containerd's socket and no gate", k)
	}

	type dayTwoCase struct {
		name string
		set  []string
		// dropin is kubelet.dropinDir; reapply, kubelet.reapplySwitch.
		dropin  string
		reapply bool
	}
	cases := []dayTwoCase{
		{name: "in-place"},
		{name: "in-place-reapply", set: []string{"kubelet.reapplySwitch=true"}, reapply: true},
		{name: "dropin", set: []string{"kubelet.dropinDir=" + kindDropinDir}, dropin: kindDropinDir},
	}
	var figures []string
	for _, tc := range cases {
		uninstalled := false
		t.Run(tc.name, func(t *testing.T) {
			sc := *c
			sc.t = t
			c := &sc
			n := &node{t: t, name: c.node}
			dropinBefore := dirState(n, kindDropinDir)

			// A fresh install, the kubelet switched; whatever happens from here (a failed install
			// too), uninstalled at the end, checking what the uninstall puts back.
			defer func() { uninstalled = dayTwoUninstall(t, c, n, flagsBefore, dropinBefore) }()
			start := time.Now()
			args := []string{"install", "pleg-nri", chartDir(), "--set", "image.repository=" + repo, "--set-string", "image.tag=" + version,
				"--set", "image.pullPolicy=Never", "--set", "kubelet.switchEndpoint=true"}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			c.helm(append(args, "--wait", "--timeout", "5m")...)
			c.kubectl("-n", "kube-system", "rollout", "status", "daemonset/pleg-nri", "--timeout=5m")
			t.Logf("helm install (%s): %s", strings.Join(tc.set, " "), time.Since(start).Round(time.Second))
			pod := c.installerPod()
			dropinArgs := func(args ...string) []string {
				if tc.dropin != "" {
					args = append(args, "--dropin-dir", tc.dropin)
				}
				return args
			}
			checkArgs := dropinArgs("/usr/local/bin/pleg-nri", "kubelet-config", "--check", "--container-runtime-endpoint", plegNRIEndpoint,
				"--image-service-endpoint", containerdEndpoint, "--evented-pleg", "true")
			switched := func() (bool, string) {
				out, err := n.tryExec(checkArgs...)
				return err == nil, strings.TrimSpace(out)
			}
			if ok, out := switched(); !ok {
				t.Fatalf("the kubelet's files after the install: %s", out)
			}
			var k runningKubelet
			if err := pollDetail(2*time.Minute, time.Second, "the running kubelet on pleg-nri after the install", func() (bool, string) {
				var err error
				if k, err = kubeletNow(c, n); err != nil {
					return false, err.Error()
				}
				return k.onPlegNRI(), k.String()
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := kubeletTalksToPlegNRI(n, 2*time.Minute); err != nil {
				t.Fatal(err)
			}
			if tc.dropin != "" {
				// The switch through the drop-in only: the kubelet runs with --config-dir, config.yaml is
				// kubeadm's (containerd's socket).
				if !strings.Contains(k.args, "--config-dir="+tc.dropin) {
					t.Errorf("the kubelet's command line has no --config-dir=%s: %s", tc.dropin, k.args)
				}
				if cfg := n.exec("cat", kindKubeletConfig); strings.Contains(cfg, plegNRIEndpoint) {
					t.Errorf("the drop-in switch edited %s:\n%s", kindKubeletConfig, cfg)
				}
				t.Logf("the switch through %s: %s\nthe kubelet: %s", tc.dropin,
					n.sh("cat "+kindKubeadmFlags+"; ls -la "+tc.dropin+"; cat "+tc.dropin+"/*"), k.args)
			}
			if st, _, err := readyCondition(c, pod); err != nil || st != "True" {
				t.Fatalf("the installer pod is not Ready after the install: %q %v", st, err)
			}
			calls0, _ := kubeletCalls(n)

			// The upgrade, then the kubelet's restart, as an operator does them.
			w := watchReady(c, pod)
			mtime := func() string { return strings.TrimSpace(n.exec("stat", "-c", "%y", kindKubeletConfig)) }
			before := mtime()
			upgradeStart := time.Now()
			took := runKubeadmUpgradeNode(t, n)
			rewritten := time.Now()
			if after := mtime(); after == before {
				t.Errorf("kubeadm upgrade node did not rewrite %s (modified %s)", kindKubeletConfig, after)
			}
			cfg := n.exec("cat", kindKubeletConfig)
			t.Logf("%s as kubeadm upgrade node left it (containerRuntimeEndpoint, featureGates, imageServiceEndpoint): %s", kindKubeletConfig,
				strings.Join(regexp.MustCompile(`(?m)^(containerRuntimeEndpoint|imageServiceEndpoint|featureGates|  EventedPLEG).*$`).FindAllString(cfg, -1), "; "))
			if flags := n.exec("cat", kindKubeadmFlags); tc.dropin != "" && !strings.Contains(flags, "--config-dir="+tc.dropin) {
				t.Errorf("kubeadm upgrade node took --config-dir out of %s:\n%s", kindKubeadmFlags, flags)
			}
			restart := time.Now()
			n.exec("systemctl", "restart", "kubelet.service")
			restartedPID := n.prop("kubelet.service", "MainPID")
			t.Logf("kubeadm upgrade node: %s; the kubelet restarted %s after it", took.Round(100*time.Millisecond), restart.Sub(rewritten).Round(100*time.Millisecond))

			switch {
			case tc.dropin == "" && !tc.reapply:
				figures = append(figures, dayTwoInPlace(t, c, n, pod, rewritten, restart, w))
			case tc.reapply:
				figures = append(figures, dayTwoReapply(t, c, n, pod, rewritten, restart, restartedPID, switched, w))
			default:
				figures = append(figures, dayTwoDropin(t, c, n, pod, upgradeStart, restart, switched, w))
			}
			calls, _ := kubeletCalls(n)
			t.Logf("pleg-nri forwarded %d calls other than Version (the kubelet's) from before the upgrade to the end", calls-calls0)
		})
		if !uninstalled {
			t.Fatalf("%s: the uninstall failed: the next case would not start from a fresh install", tc.name)
		}
	}
	t.Logf("TestHelmKindDayTwo (%s):\n%s", strings.Join(kubeadmUpgradeNode, " "), strings.Join(figures, "\n"))
}

// dayTwoInPlace checks the switch in place after the upgrade and the restart: the drift is reported
// within a minute of the upgrade (the pod not Ready, its log saying why), the restarted kubelet is on
// containerd's socket, and the pod stays not Ready past the restart's readiness reset.
func dayTwoInPlace(t *testing.T, c *kindCluster, n *node, pod string, rewritten, restart time.Time, w *readyWatch) string {
	var notReady, logged time.Duration
	var line string
	if err := pollDetail(time.Minute-time.Since(rewritten), 500*time.Millisecond, "the drift reported (pod not Ready, its log saying drift)", func() (bool, string) {
		if st, _, err := readyCondition(c, pod); err == nil && st == "False" && notReady == 0 {
			notReady = time.Since(rewritten)
		}
		if logged == 0 {
			if line = logLine(installerLog(c, pod), "kubelet: drift from the switch"); line != "" {
				logged = time.Since(rewritten)
			}
		}
		return notReady > 0 && logged > 0, fmt.Sprintf("not Ready after %s, drift logged after %s", notReady, logged)
	}); err != nil {
		t.Error(err)
	}
	t.Logf("the installer's log: %s", line)
	if !strings.Contains(line, "containerRuntimeEndpoint is "+containerdEndpoint) {
		t.Errorf("the drift logged does not name the endpoint kubeadm put back: %s", line)
	}
	// The restarted kubelet: on containerd's socket, gate off, no longer calling pleg-nri.
	var k runningKubelet
	if err := pollDetail(time.Minute, time.Second, "the restarted kubelet on containerd's socket", func() (bool, string) {
		var err error
		if k, err = kubeletNow(c, n); err != nil {
			return false, err.Error()
		}
		return k.endpoint == containerdEndpoint && !k.eventedPLEG, k.String()
	}); err != nil {
		t.Error(err)
	}
	onContainerd := time.Since(restart)
	calls, subs := kubeletCalls(n)
	time.Sleep(10 * time.Second)
	if calls2, subs2 := kubeletCalls(n); calls2 != calls || subs2 != "0" {
		t.Errorf("the kubelet on containerd's socket still talks to pleg-nri: forwarded calls other than Version %d then %d 10 s later, pleg_nri_subscribers %s then %s", calls, calls2, subs, subs2)
	}
	// Past the restart's readiness reset, still not Ready: the probe fails on the drift.
	if d := time.Until(restart.Add(45 * time.Second)); d > 0 {
		time.Sleep(d)
	}
	st, at, err := readyCondition(c, pod)
	health, _ := n.tryExec("curl", "-s", "http://127.0.0.1:9811/cgi-bin/health")
	if err != nil || st != "False" || !strings.Contains(health, "drift") {
		t.Errorf("45 s after the kubelet's restart: Ready %q (since %s, %v); the readiness check:\n%s", st, at.Format(time.TimeOnly), err, health)
	}
	changes := w.end()
	f := fmt.Sprintf("in place: drift reported %.1f s after kubeadm upgrade node (pod not Ready after %.1f s and still not Ready 45 s after the kubelet's restart, the check failing on the drift; log after %.1f s); the restarted kubelet seen on containerd's socket by %.1f s after its restart (checked once the drift was reported); Ready changes seen every 0.5 s (from the upgrade's end): %s",
		max(notReady, logged).Seconds(), notReady.Seconds(), logged.Seconds(), onContainerd.Seconds(), timeline(changes, rewritten))
	t.Log(f)
	return f
}

// dayTwoReapply checks kubelet.reapplySwitch after the upgrade and the restart: within two minutes the
// kubelet's files and the running kubelet are on pleg-nri again, the kubelet streams from it and calls
// it, and the pod is Ready after the kubelet's last restart.
func dayTwoReapply(t *testing.T, c *kindCluster, n *node, pod string, rewritten, restart time.Time, restartedPID string, switched func() (bool, string), w *readyWatch) string {
	var filesAgain, runningAgain time.Duration
	var k runningKubelet
	if err := pollDetail(2*time.Minute, time.Second, "the kubelet switched again (its files and the running kubelet)", func() (bool, string) {
		ok, out := switched()
		if ok && filesAgain == 0 {
			filesAgain = time.Since(restart)
		}
		var err error
		if k, err = kubeletNow(c, n); err != nil {
			return false, out + "; " + err.Error()
		}
		if ok && k.onPlegNRI() {
			runningAgain = time.Since(restart)
			return true, ""
		}
		return false, out + "; " + k.String()
	}); err != nil {
		t.Fatal(err)
	}
	// The installer's log (kubectl logs asks the kubelet, which the installer has just restarted).
	var drift, reapplied string
	if err := pollDetail(30*time.Second, time.Second, "the installer's log to say it re-applied the switch", func() (bool, string) {
		log := installerLog(c, pod)
		drift, reapplied = logLine(log, "kubelet: drift from the switch"), logLine(log, "re-applying the switch")
		return drift != "" && reapplied != "", log
	}); err != nil {
		t.Error(err)
	}
	t.Logf("the installer's log:\n%s\n%s", drift, reapplied)
	talks, err := kubeletTalksToPlegNRI(n, time.Minute)
	if err != nil {
		t.Error(err)
	}
	talks += runningAgain
	// The pod Ready after the kubelet's last restart (the installer's, or the operator's if the
	// installer re-applied the switch before it).
	last := kubeletStarted(n)
	by := "the installer"
	if k.pid == restartedPID {
		by = "the operator (the installer re-applied before it)"
	}
	up, how, err := waitReadyAfter(c, n, pod, last, 2*time.Minute)
	if err != nil {
		t.Error(err)
	}
	changes := w.end()
	f := fmt.Sprintf("in place with kubelet.reapplySwitch: after the kubelet's restart, its files switched again by %.1f s, the running kubelet on pleg-nri by %.1f s (last restarted by %s, %.1f s after the operator's), seen streaming from and calling pleg-nri by %.1f s (a 10 s sample), the pod seen Ready by %.1f s after the last restart (%s); Ready changes seen every 0.5 s (from the upgrade's end): %s",
		filesAgain.Seconds(), runningAgain.Seconds(), by, last.Sub(restart.Truncate(time.Second)).Seconds(), talks.Seconds(), up.Seconds(), how, timeline(changes, rewritten))
	t.Log(f)
	return f
}

// dayTwoDropin checks the switch through the drop-in directory after the upgrade and the restart: the
// kubelet is still on pleg-nri (its effective files, the running kubelet with --config-dir, its
// stream and calls), the pod Ready after the restart and not Ready at no other time, and no drift
// reported over more than one drift check.
func dayTwoDropin(t *testing.T, c *kindCluster, n *node, pod string, upgradeStart, restart time.Time, switched func() (bool, string), w *readyWatch) string {
	var k runningKubelet
	if err := pollDetail(time.Minute, time.Second, "the restarted kubelet (a new process) on pleg-nri", func() (bool, string) {
		var err error
		if k, err = kubeletNow(c, n); err != nil {
			return false, err.Error()
		}
		return k.onPlegNRI() && kubeletStarted(n).After(restart.Add(-time.Second)), k.String()
	}); err != nil {
		t.Error(err)
	}
	running := time.Since(restart)
	if !strings.Contains(k.args, "--config-dir="+kindDropinDir) {
		t.Errorf("the restarted kubelet's command line has no --config-dir=%s: %s", kindDropinDir, k.args)
	}
	if ok, out := switched(); !ok {
		t.Errorf("the kubelet's effective settings after the upgrade: %s", out)
	}
	talks, err := kubeletTalksToPlegNRI(n, time.Minute)
	if err != nil {
		t.Error(err)
	}
	talks += running
	up, how, err := waitReadyAfter(c, n, pod, restart, time.Minute)
	if err != nil {
		t.Error(err)
	}
	// More than one drift check (every 30 s) and probe window after the restart: no drift, Ready.
	if d := time.Until(restart.Add(50 * time.Second)); d > 0 {
		time.Sleep(d)
	}
	if line := logLine(installerLog(c, pod), "drift"); line != "" {
		t.Errorf("the installer reported a drift: %s", line)
	}
	if st, _, err := readyCondition(c, pod); err != nil || st != "True" {
		t.Errorf("50 s after the kubelet's restart the pod is not Ready: %q %v", st, err)
	}
	// Not Ready only for the restart's reset: from after the restart, back within the reset window.
	changes := w.end()
	for i, ch := range changes {
		if ch.status == "True" {
			continue
		}
		end := time.Now()
		if i+1 < len(changes) {
			end = changes[i+1].at
		}
		if ch.at.Before(restart) || ch.at.After(restart.Add(resetWindow)) || end.After(restart.Add(2*resetWindow)) {
			t.Errorf("the pod was not Ready from %+.1fs to %+.1fs after the kubelet's restart: not the restart's readiness reset", ch.at.Sub(restart).Seconds(), end.Sub(restart).Seconds())
		}
	}
	f := fmt.Sprintf("drop-in (%s): after kubeadm upgrade node (%s before the restart) and the kubelet's restart, the running kubelet on pleg-nri by %.1f s, seen streaming from and calling it by %.1f s (a 10 s sample), the pod counted Ready %.1f s after the restart (%s), no drift over 50 s; Ready changes seen every 0.5 s (from the upgrade's start): %s",
		kindDropinDir, restart.Sub(upgradeStart).Round(100*time.Millisecond), running.Seconds(), talks.Seconds(), up.Seconds(), how, timeline(changes, upgradeStart))
	t.Log(f)
	return f
}

// dirState returns whether dir exists on the node, its entries and their contents.
func dirState(n *node, dir string) string {
	out, _ := n.tryExec("sh", "-c", `if [ -d "$1" ]; then echo directory; ls -A "$1"; cat "$1"/* 2>/dev/null; else echo absent; fi`, "-", dir)
	return out
}

// dayTwoUninstall uninstalls the chart and checks what it puts back: kubeadm-flags.env byte for byte,
// the drop-in directory as it was, the running kubelet on containerd's socket with the gate off. It
// reports whether the uninstall itself went through (the chart's pods gone).
func dayTwoUninstall(t *testing.T, c *kindCluster, n *node, flagsBefore, dropinBefore string) bool {
	start := time.Now()
	if out, err := tryRun(c.e.helm, "--kubeconfig", c.kubeconfig, "-n", "kube-system", "uninstall", "pleg-nri", "--wait", "--timeout", "5m"); err != nil {
		t.Errorf("helm uninstall: %v\n%s", err, out)
		return false
	}
	if err := pollDetail(2*time.Minute, 2*time.Second, "the chart's pods gone", func() (bool, string) {
		out, err := tryRun(c.e.kubectl, "--kubeconfig", c.kubeconfig, "-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/instance=pleg-nri", "-o", "name")
		return err == nil && strings.TrimSpace(out) == "", out
	}); err != nil {
		t.Error(err)
		return false
	}
	t.Logf("helm uninstall: %s", time.Since(start).Round(time.Second))
	if flags, err := n.tryExec("cat", kindKubeadmFlags); err != nil || flags != flagsBefore {
		t.Errorf("after uninstall %s is not as before the install (%v):\n%q\nwant:\n%q", kindKubeadmFlags, err, flags, flagsBefore)
	}
	if after := dirState(n, kindDropinDir); after != dropinBefore {
		t.Errorf("after uninstall %s is not as before the install:\n%s\nwant:\n%s", kindDropinDir, after, dropinBefore)
	}
	if err := pollDetail(2*time.Minute, time.Second, "the running kubelet back on containerd's socket, gate off", func() (bool, string) {
		k, err := kubeletNow(c, n)
		if err != nil {
			return false, err.Error()
		}
		return k.endpoint == containerdEndpoint && !k.eventedPLEG && !strings.Contains(k.args, "--config-dir"), k.String() + ": " + k.args
	}); err != nil {
		t.Error(err)
	}
	return true
}

package deploy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/test/internal/kindrun"
)

// kindCluster is a kind cluster made for one test, deleted when it ends: one node of kindConfig, or a
// control plane and a worker of kindWorkerConfig. node is the node the test works on: the control
// plane, or the worker.
type kindCluster struct {
	t                      *testing.T
	e                      kindEnv
	name, node, kubeconfig string
}

// kindWorkerConfig is kindConfig with a worker beside the control plane.
var kindWorkerConfig = strings.Replace(kindConfig, "- role: control-plane\n", "- role: control-plane\n- role: worker\n", 1)

// startKindCluster makes a one-node cluster (kindConfig) and loads the pleg-nri image
// (PLEG_NRI_IMAGE_TAR) into it.
func startKindCluster(t *testing.T, e kindEnv, prefix string) *kindCluster {
	t.Helper()
	return startKindClusterOf(t, e, prefix, false)
}

// startKindClusterOf makes the cluster, with a worker (kindWorkerConfig, the test's node) or without,
// and loads the pleg-nri image into it.
func startKindClusterOf(t *testing.T, e kindEnv, prefix string, worker bool) *kindCluster {
	t.Helper()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	c := &kindCluster{t: t, e: e, name: prefix + hex.EncodeToString(b)}
	c.node = c.name + "-control-plane"
	cfg := kindConfig
	if worker {
		c.node, cfg = c.name+"-worker", kindWorkerConfig
	}
	tmp := t.TempDir()
	c.kubeconfig = filepath.Join(tmp, "kubeconfig")
	config := filepath.Join(tmp, "kind.yaml")
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	removeNetwork := kindrun.KindNetwork(context.Background())
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := tryRun("docker", "exec", c.node, "sh", "-c",
				"journalctl --no-pager -n 150 -u pleg-nri -u containerd -u kubelet; tail -n 40 "+kindRunDir+"/front.log")
			t.Logf("the node's journal:\n%s", out)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := kindrun.DeleteCluster(ctx, e.kind, c.name, c.kubeconfig); err != nil {
			t.Error(err)
		}
		if err := removeNetwork(); err != nil {
			t.Error(err)
		}
	})
	start := time.Now()
	c.kindCmd("create", "cluster", "--name", c.name, "--image", e.nodeImage, "--config", config, "--kubeconfig", c.kubeconfig, "--wait", "5m")
	c.kindCmd("load", "image-archive", e.imageTar, "--name", c.name)
	t.Logf("kind create cluster and load the image: %s", time.Since(start).Round(time.Second))
	return c
}

func (c *kindCluster) kindCmd(args ...string) string {
	c.t.Helper()
	cmd := exec.Command(c.e.kind, args...)
	cmd.Env = append(os.Environ(), "PATH="+c.e.shimDir+":"+os.Getenv("PATH"), "KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER=overlayfs")
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Fatalf("kind %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (c *kindCluster) kubectl(args ...string) string {
	c.t.Helper()
	return run(c.t, c.e.kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
}

func (c *kindCluster) helm(args ...string) string {
	c.t.Helper()
	return run(c.t, c.e.helm, append([]string{"--kubeconfig", c.kubeconfig, "-n", "kube-system"}, args...)...)
}

// installerPod returns the name of the chart's installer pod on the node.
func (c *kindCluster) installerPod() string {
	c.t.Helper()
	return strings.TrimSpace(c.kubectl("-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/instance=pleg-nri,app.kubernetes.io/component=installer",
		"--field-selector", "spec.nodeName="+c.node, "-o", "jsonpath={.items[0].metadata.name}"))
}

// podReady returns the Ready condition of pod ("True", "False") and its container's restart count.
func (c *kindCluster) podReady(pod string) (string, string) {
	c.t.Helper()
	out := c.kubectl("-n", "kube-system", "get", "pod", pod, "-o",
		`jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.containerStatuses[0].restartCount}`)
	f := strings.Fields(out)
	if len(f) != 2 {
		return "", ""
	}
	return f[0], f[1]
}

// waitReadyIs polls pod's Ready condition every 250 ms until it is want, for at most d, and returns
// how long that took.
func (c *kindCluster) waitReadyIs(pod, want string, d time.Duration) (time.Duration, error) {
	start := time.Now()
	var last string
	for time.Since(start) < d {
		if last, _ = c.podReady(pod); last == want {
			return time.Since(start), nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return time.Since(start), fmt.Errorf("pod %s: Ready is %q after %s, want %s", pod, last, d, want)
}

// TestHelmKindHealth (issue 60) installs the chart into a kind cluster (the kubelet switched to
// pleg-nri, containerd's NRI timeouts set, metrics on every address) and breaks pleg-nri on the node
// in the ways the installer pod's readiness must see: the core stopped (systemctl stop), the core hung
// (SIGSTOP: /readyz accepts and never answers). After each fault the pod must be not Ready within
// 30 s, and Ready again within 30 s of the repair; a front killed (which the core replaces within a
// second) must not make it not Ready, nor a restart of containerd; a front hung (SIGSTOP: the
// kubelet's calls hang in it) must be replaced by the core within 30 s; and the pod is never restarted (no liveness
// probe). Then the kubelet's settings put back as kubeadm upgrade node leaves them: the pod goes not
// Ready and says why, and with kubelet.reapplySwitch the installer switches the kubelet again. The
// times are logged.
// It also checks, on the node, what the chart's other day-two options did: containerd reads the NRI
// timeouts, and the pod carries the scrape annotations of an address Prometheus reaches there.
func TestHelmKindHealth(t *testing.T) {
	e := kindSetup(t)
	c := startKindCluster(t, e, "pleg-nri-health-")
	n := &node{t: t, name: c.node}
	tag := imageTag(t, e.imageTar)
	repo, version, _ := strings.Cut(tag, ":")
	start := time.Now()
	c.helm("install", "pleg-nri", chartDir(), "--set", "image.repository="+repo, "--set-string", "image.tag="+version, "--set", "image.pullPolicy=Never",
		"--set", "kubelet.switchEndpoint=true", "--set", "config.metrics-address=0.0.0.0:9810",
		"--set", "containerd.nri.pluginRegistrationTimeout=15s", "--set", "containerd.nri.pluginRequestTimeout=4s",
		"--wait", "--timeout", "5m")
	c.kubectl("-n", "kube-system", "rollout", "status", "daemonset/pleg-nri", "--timeout=5m")
	t.Logf("helm install: %s", time.Since(start).Round(time.Second))
	pod := c.installerPod()

	// containerd's NRI timeouts: in its drop-in, read by containerd (config dump), and pleg-nri
	// registered under them (the pod is ready: /readyz needs the NRI plugin registered).
	dumpOut := n.exec("containerd", "config", "dump")
	for _, want := range []string{"plugin_registration_timeout = '15s'", "plugin_request_timeout = '4s'", "socket_path = '/var/run/nri/nri.sock'"} {
		if !strings.Contains(dumpOut, want) {
			t.Errorf("containerd config dump on the node has no %s", want)
		}
	}
	// The scrape annotations, and /metrics at the pod's address (the node's: hostNetwork).
	ann := c.kubectl("-n", "kube-system", "get", "pod", pod, "-o", `jsonpath={.metadata.annotations.prometheus\.io/scrape} {.metadata.annotations.prometheus\.io/port} {.metadata.annotations.prometheus\.io/path} {.status.podIP}`)
	f := strings.Fields(ann)
	if len(f) != 4 || f[0] != "true" || f[1] != "9810" || f[2] != "/metrics" {
		t.Fatalf("the installer pod's scrape annotations and IP: %q", ann)
	}
	if out, err := tryRun("curl", "-sf", "--max-time", "5", "http://"+f[3]+":9810/metrics"); err != nil || !strings.Contains(out, "pleg_nri_build_info{process=\"core\"") {
		t.Errorf("curl http://%s:9810/metrics from outside the node: %v\n%.300s", f[3], err, out)
	}

	// A real Prometheus that knows nothing of pleg-nri but the pods' annotations finds and scrapes it.
	t.Run("prometheus-annotations", func(t *testing.T) { promAnnotations(t, c, pod) })

	if st, _ := c.podReady(pod); st != "True" {
		t.Fatalf("the installer pod is not Ready after the install: %q", st)
	}
	proc := func(front bool) nodeProc {
		t.Helper()
		for _, p := range nodeProcs(n) {
			if !p.pod && p.isFront() == front {
				return p
			}
		}
		t.Fatalf("no pleg-nri %s on the node", map[bool]string{true: "front", false: "core"}[front])
		return nodeProc{}
	}

	const bound = 30 * time.Second
	type fault struct {
		name           string
		breakIt, fixIt func()
	}
	var pid int
	faults := []fault{
		{"core stopped (systemctl stop pleg-nri)",
			func() { n.exec("systemctl", "stop", "pleg-nri.service") },
			func() { n.exec("systemctl", "start", "pleg-nri.service") }},
		{"core hung (SIGSTOP)",
			func() { pid = proc(false).pid; n.exec("kill", "-STOP", fmt.Sprint(pid)) },
			func() { n.exec("kill", "-CONT", fmt.Sprint(pid)) }},
	}
	var figures []string
	for _, f := range faults {
		// The next fault only from a node that is Ready again (a failed check of what the operator
		// sees does not stop the others).
		backUp := false
		t.Run(strings.Fields(f.name)[0]+"-"+strings.Fields(f.name)[1], func(t *testing.T) {
			f.breakIt()
			down, err := c.waitReadyIs(pod, "False", bound)
			// Repaired whatever happened, so that the next fault starts from a healthy node.
			f.fixIt()
			if err != nil {
				// Never not Ready: Ready still.
				t.Errorf("%s: %v", f.name, err)
				backUp = true
				return
			}
			up, err := c.waitReadyIs(pod, "True", bound)
			if err != nil {
				t.Errorf("%s, repaired: %v", f.name, err)
				return
			}
			backUp = true
			// The operator's view: the pod's events say the probe failed (an HTTP probe's event gives
			// only the status code), its log says why.
			events := c.kubectl("-n", "kube-system", "get", "events", "--field-selector", "involvedObject.name="+pod, "-o", "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}")
			if !strings.Contains(events, "Readiness probe failed: HTTP probe failed with statuscode: 503") {
				t.Errorf("%s: the pod's events have no failed readiness probe:\n%s", f.name, events)
			}
			var why string
			for _, l := range strings.Split(c.kubectl("-n", "kube-system", "logs", pod), "\n") {
				if strings.Contains(l, "readiness: not ready: ") && strings.Contains(l, "FAIL") {
					why = l
				}
			}
			if why == "" {
				t.Errorf("%s: the installer's log does not say why it is not Ready", f.name)
			}
			t.Logf("%s: the installer's log: %s", f.name, why)
			figures = append(figures, fmt.Sprintf("%s: not Ready after %s, Ready %s after the repair", f.name, down.Round(100*time.Millisecond), up.Round(100*time.Millisecond)))
			t.Log(figures[len(figures)-1])
		})
		if !backUp {
			break
		}
	}

	// A front killed: the core starts another within a second; the pod stays Ready.
	t.Run("front-killed", func(t *testing.T) {
		old := proc(true).pid
		n.exec("kill", "-KILL", fmt.Sprint(old))
		if _, err := c.waitReadyIs(pod, "False", 20*time.Second); err == nil {
			t.Errorf("the pod went not Ready after the front was killed (the core replaces it within a second)")
		}
		if now := proc(true).pid; now == old {
			t.Errorf("the front was not replaced")
		}
		figures = append(figures, "front killed: Ready throughout the 20 s after")
	})

	// A front hung (SIGSTOP: it keeps its control connection to the core, and every CRI call of the
	// node, the kubelet's housekeeping among them, waits in it, so the kubelet would not even record
	// its probes' results): the core finds it silent on the endpoint and kills it after 10 s, the next
	// front serves, and the node's runtime answers again.
	t.Run("front-hung", func(t *testing.T) {
		old := proc(true).pid
		start := time.Now()
		n.exec("kill", "-STOP", fmt.Sprint(old))
		if err := pollDetail(bound, 200*time.Millisecond, "the core to replace the frozen front", func() (bool, string) {
			var fronts []string
			next, frozen := false, false
			for _, p := range nodeProcs(n) {
				if !p.pod && p.isFront() {
					fronts = append(fronts, p.String())
					next, frozen = next || p.pid != old, frozen || p.pid == old
				}
			}
			return next && !frozen, strings.Join(fronts, "; ")
		}); err != nil {
			n.exec("kill", "-CONT", fmt.Sprint(old))
			t.Fatal(err)
		}
		replaced := time.Since(start)
		if _, err := n.tryExec("crictl", "--runtime-endpoint", "unix:///run/pleg-nri/cri.sock", "--timeout", "10s", "version"); err != nil {
			t.Errorf("crictl version through the new front: %v", err)
		}
		answered := time.Since(start)
		up, err := c.waitReadyIs(pod, "True", bound)
		if err != nil {
			t.Errorf("after the frozen front's replacement: %v", err)
		}
		figures = append(figures, fmt.Sprintf("front hung (SIGSTOP): replaced by the core after %s, the endpoint answered after %s, the pod Ready %s later",
			replaced.Round(100*time.Millisecond), answered.Round(100*time.Millisecond), up.Round(100*time.Millisecond)))
		t.Log(figures[len(figures)-1])
	})

	// A restart of containerd (an upgrade of it): a few seconds without /readyz; the pod stays Ready.
	t.Run("containerd-restarted", func(t *testing.T) {
		start := time.Now()
		n.exec("systemctl", "restart", "containerd.service")
		restart := time.Since(start)
		if _, err := c.waitReadyIs(pod, "False", 20*time.Second); err == nil {
			t.Errorf("the pod went not Ready after a restart of containerd (%s)", restart.Round(100*time.Millisecond))
		}
		figures = append(figures, fmt.Sprintf("containerd restarted (systemctl restart: %s): Ready throughout the 20 s after", restart.Round(100*time.Millisecond)))
	})

	// Never restarted: no liveness probe.
	if _, restarts := c.podReady(pod); restarts != "0" {
		t.Errorf("the installer pod's container restarted %s times", restarts)
	}
	// The kubelet's settings put back as kubeadm upgrade node leaves them (containerd's socket, no
	// gate): the pod goes not Ready and its log says why; with kubelet.reapplySwitch the installer
	// switches the kubelet again within its 30 s check.
	t.Run("kubelet-drift", func(t *testing.T) {
		unswitch := func() {
			n.exec("/usr/local/bin/pleg-nri", "kubelet-config", "--container-runtime-endpoint", "unix:///run/containerd/containerd.sock", "--evented-pleg", "remove")
		}
		switched := func() bool {
			_, err := n.tryExec("/usr/local/bin/pleg-nri", "kubelet-config", "--check", "--container-runtime-endpoint", "unix:///run/pleg-nri/cri.sock", "--evented-pleg", "true")
			return err == nil
		}
		unswitch()
		down, err := c.waitReadyIs(pod, "False", time.Minute)
		if err != nil {
			t.Fatalf("the kubelet's settings drifted: %v", err)
		}
		if err := pollDetail(45*time.Second, time.Second, "the installer's log to report the drift", func() (bool, string) {
			logs := c.kubectl("-n", "kube-system", "logs", pod)
			return strings.Contains(logs, "kubelet: drift from the switch: drift: /host/var/lib/kubelet/config.yaml: containerRuntimeEndpoint is unix:///run/containerd/containerd.sock"), logs
		}); err != nil {
			t.Error(err)
		}
		figures = append(figures, fmt.Sprintf("kubelet settings drifted: not Ready after %s", down.Round(100*time.Millisecond)))
		// Re-apply on: the upgrade's new pod switches the kubelet at its install; then a drift again is
		// re-applied by the staying installer.
		c.helm("upgrade", "pleg-nri", chartDir(), "--reuse-values", "--set", "kubelet.reapplySwitch=true", "--wait", "--timeout", "5m")
		c.kubectl("-n", "kube-system", "rollout", "status", "daemonset/pleg-nri", "--timeout=5m")
		if !switched() {
			t.Fatalf("the kubelet is not switched after the upgrade's install")
		}
		pod2 := c.installerPod()
		unswitch()
		start := time.Now()
		if err := pollDetail(75*time.Second, time.Second, "the installer to switch the kubelet again", func() (bool, string) {
			return switched(), ""
		}); err != nil {
			t.Fatal(err)
		}
		again := time.Since(start)
		up, err := c.waitReadyIs(pod2, "True", time.Minute)
		if err != nil {
			t.Error(err)
		}
		figures = append(figures, fmt.Sprintf("kubelet settings drifted with kubelet.reapplySwitch: switched again after %s, pod Ready %s later", again.Round(100*time.Millisecond), up.Round(100*time.Millisecond)))
		t.Log(figures[len(figures)-1])
		if err := pollDetail(2*time.Minute, 2*time.Second, "the restarted kubelet's event stream from pleg-nri", func() (bool, string) {
			out := n.sh("curl -s 127.0.0.1:9810/metrics | sed -n 's/^pleg_nri_subscribers //p'")
			return strings.TrimSpace(out) == "1", "pleg_nri_subscribers " + out
		}); err != nil {
			t.Error(err)
		}
	})

	t.Logf("TestHelmKindHealth: %s", strings.Join(figures, "; "))
	c.helm("uninstall", "pleg-nri", "--wait", "--timeout", "5m")
	// Uninstall removed the NRI timeouts: containerd's defaults again.
	dumpOut = n.exec("containerd", "config", "dump")
	if !strings.Contains(dumpOut, "plugin_request_timeout = '2s'") {
		t.Errorf("after uninstall containerd still has another plugin_request_timeout than its default 2s")
	}
	if _, err := n.tryExec("test", "-e", "/etc/containerd/conf.d/pleg-nri.toml"); err == nil {
		t.Errorf("/etc/containerd/conf.d/pleg-nri.toml is still on the node after uninstall")
	}
}

// promAnnotationsConfig is Prometheus' own example job for pods that ask to be scraped by annotations
// (documentation/examples/prometheus-kubernetes.yml, "kubernetes-pods"), discovering through the
// cluster's kubeconfig from outside it.
const promAnnotationsConfig = `global:
  scrape_interval: 2s
scrape_configs:
  - job_name: kubernetes-pods
    kubernetes_sd_configs:
      - role: pod
        kubeconfig_file: KUBECONFIG
    relabel_configs:
      - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape]
        action: keep
        regex: true
      - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_path]
        action: replace
        target_label: __metrics_path__
        regex: (.+)
      - source_labels: [__address__, __meta_kubernetes_pod_annotation_prometheus_io_port]
        action: replace
        regex: ([^:]+)(?::\d+)?;(\d+)
        replacement: $1:$2
        target_label: __address__
      - source_labels: [__meta_kubernetes_namespace]
        target_label: namespace
      - source_labels: [__meta_kubernetes_pod_name]
        target_label: pod
`

// promAnnotations runs the Prometheus of make prometheus (PLEG_NRI_PROMETHEUS) with
// promAnnotationsConfig and waits until its only target is the installer pod, up, with pleg-nri's
// metrics in the database.
func promAnnotations(t *testing.T, c *kindCluster, pod string) {
	bin := os.Getenv("PLEG_NRI_PROMETHEUS")
	if bin == "" {
		bin = filepath.Join(cacheDir(), "prometheus-v0.316.0", "prometheus")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no prometheus at %s (make prometheus): %v", bin, err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(strings.ReplaceAll(promAnnotationsConfig, "KUBECONFIG", c.kubeconfig)), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logf.Name())
			t.Logf("prometheus' log:\n%s", out)
		}
	})
	getJSON := func(path string, v any) error {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(v)
	}
	start := time.Now()
	err = pollDetail(2*time.Minute, time.Second, "prometheus to discover and scrape the installer pod through its annotations alone", func() (bool, string) {
		var ts struct {
			Data struct {
				ActiveTargets []struct {
					Labels    map[string]string `json:"labels"`
					ScrapeURL string            `json:"scrapeUrl"`
					Health    string            `json:"health"`
					LastError string            `json:"lastError"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		if err := getJSON("/api/v1/targets", &ts); err != nil {
			return false, err.Error()
		}
		var states []string
		for _, tg := range ts.Data.ActiveTargets {
			states = append(states, fmt.Sprintf("%s %s %s %s", tg.Labels["pod"], tg.ScrapeURL, tg.Health, tg.LastError))
		}
		detail := strings.Join(states, "; ")
		if len(ts.Data.ActiveTargets) != 1 {
			return false, detail
		}
		tg := ts.Data.ActiveTargets[0]
		if tg.Labels["pod"] != pod || tg.Health != "up" || !strings.HasSuffix(tg.ScrapeURL, ":9810/metrics") {
			return false, detail
		}
		var q struct {
			Data struct {
				Result []struct {
					Metric map[string]string `json:"metric"`
				} `json:"result"`
			} `json:"data"`
		}
		if err := getJSON("/api/v1/query?query="+url.QueryEscape(`pleg_nri_build_info{process="core"}`), &q); err != nil {
			return false, err.Error()
		}
		return len(q.Data.Result) == 1 && q.Data.Result[0].Metric["pod"] == pod, detail + fmt.Sprintf("; pleg_nri_build_info: %v", q.Data.Result)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("prometheus discovered and scraped %s through its annotations alone within %s", pod, time.Since(start).Round(time.Second))
}

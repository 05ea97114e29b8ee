package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// helmBin is the helm of make helm (PLEG_NRI_HELM), or the cache's.
func helmBin(t *testing.T) string {
	t.Helper()
	h := os.Getenv("PLEG_NRI_HELM")
	if h == "" {
		h = filepath.Join(cacheDir(), "helm-v3.22.0", "helm")
	}
	_, err := os.Stat(h)
	need(t, err == nil, "no helm at %s (make helm)", h)
	return h
}

func chartDir() string { return filepath.Join(repoRoot(), "deploy", "helm", "pleg-nri") }

// render runs helm template with args and returns the objects by kind/name.
func render(t *testing.T, args ...string) map[string]map[string]any {
	t.Helper()
	out := run(t, helmBin(t), append([]string{"template", "rel", chartDir(), "--namespace", "kube-system"}, args...)...)
	objs := map[string]map[string]any{}
	for _, doc := range strings.Split(out, "\n---\n") {
		var o map[string]any
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("helm template printed bad YAML: %v\n%s", err, doc)
		}
		if o == nil {
			continue
		}
		objs[o["kind"].(string)+"/"+get(o, "metadata", "name").(string)] = o
	}
	return objs
}

// get walks a decoded object by keys (string) and indexes (int).
func get(o any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := o.(map[string]any)
			o = m[k]
		case int:
			l, _ := o.([]any)
			if k >= len(l) {
				return nil
			}
			o = l[k]
		}
	}
	return o
}

// envOf returns a container's environment as a map.
func envOf(c any) map[string]string {
	env := map[string]string{}
	for _, e := range get(c, "env").([]any) {
		env[get(e, "name").(string)] = get(e, "value").(string)
	}
	return env
}

func TestHelmLint(t *testing.T) {
	out := run(t, helmBin(t), "lint", "--strict", chartDir())
	if !strings.Contains(out, "0 chart(s) failed") {
		t.Errorf("helm lint:\n%s", out)
	}
	// With the kubelet switch and the pre-registered mode too.
	run(t, helmBin(t), "lint", "--strict", chartDir(), "--set", "kubelet.switchEndpoint=true", "--set", "mode=nri")
}

// TestHelmTemplate checks what matters in the rendered chart: the DaemonSet is a host installer on
// every node (system-node-critical, tolerates every taint, host PID and network, privileged, the host's
// / mounted), it runs node.sh install with the configuration, the kubelet switch is off unless asked,
// and helm uninstall first runs node.sh uninstall on every node.
func TestHelmTemplate(t *testing.T) {
	objs := render(t)
	var kinds []string
	for k := range objs {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	if strings.Join(kinds, " ") != "ConfigMap/rel-pleg-nri DaemonSet/rel-pleg-nri Job/rel-pleg-nri-uninstall" {
		t.Fatalf("rendered %v", kinds)
	}
	ds := objs["DaemonSet/rel-pleg-nri"]
	pod := get(ds, "spec", "template", "spec")
	for path, want := range map[string]any{
		"priorityClassName": "system-node-critical", "hostPID": true, "hostNetwork": true,
		"automountServiceAccountToken": false,
	} {
		if got := get(pod, path); got != want {
			t.Errorf("DaemonSet pod %s = %v, want %v", path, got, want)
		}
	}
	if tol := get(pod, "tolerations"); len(tol.([]any)) != 1 || get(tol, 0, "operator") != "Exists" || get(tol, 0, "key") != nil {
		t.Errorf("tolerations %v, want one that tolerates every taint", tol)
	}
	if v := get(pod, "volumes", 0); get(v, "name") != "host" || get(v, "hostPath", "path") != "/" {
		t.Errorf("volume 0 = %v, want the host's /", v)
	}
	c := get(pod, "containers", 0)
	if get(c, "securityContext", "privileged") != true {
		t.Error("the installer is not privileged")
	}
	if cmd, _ := json.Marshal(get(c, "command")); string(cmd) != `["/bin/sh","/opt/pleg-nri/node.sh","install"]` {
		t.Errorf("command %s", cmd)
	}
	mounts, _ := json.Marshal(get(c, "volumeMounts"))
	if !strings.Contains(string(mounts), `"mountPath":"/host","name":"host"`) || !strings.Contains(string(mounts), `"mountPath":"/etc/pleg-nri-config"`) {
		t.Errorf("volumeMounts %s", mounts)
	}
	env := envOf(c)
	for k, want := range map[string]string{"HOST_ROOT": "/host", "PLEG_NRI_MODE": "systemd", "PLEG_NRI_SWITCH_KUBELET": "false",
		"PLEG_NRI_READYZ": "http://127.0.0.1:9810/readyz", "PLEG_NRI_CONFIG": "/etc/pleg-nri-config/config.yaml",
		"PLEG_NRI_RESTORE_ENDPOINT": "unix:///run/containerd/containerd.sock", "PLEG_NRI_ENDPOINT": "unix:///run/pleg-nri/cri.sock",
		"PLEG_NRI_RESTART_KUBELET_AFTER_RESTART": "false", "PLEG_NRI_IMAGE_ENDPOINT": "unix:///run/containerd/containerd.sock"} {
		if env[k] != want {
			t.Errorf("env %s=%q, want %q", k, env[k], want)
		}
	}
	// The kubelet's imageServiceEndpoint left alone (issue 58): empty, which node.sh does not default.
	if env := envOf(get(render(t, "--set", "kubelet.imageServiceEndpoint=")["DaemonSet/rel-pleg-nri"], "spec", "template", "spec", "containers", 0)); env["PLEG_NRI_IMAGE_ENDPOINT"] != "" {
		t.Errorf("kubelet.imageServiceEndpoint empty: env PLEG_NRI_IMAGE_ENDPOINT=%q", env["PLEG_NRI_IMAGE_ENDPOINT"])
	} else if _, ok := env["PLEG_NRI_IMAGE_ENDPOINT"]; !ok {
		t.Error("kubelet.imageServiceEndpoint empty: no PLEG_NRI_IMAGE_ENDPOINT, which node.sh would default to containerd's socket")
	}
	if get(c, "readinessProbe") == nil || get(c, "resources", "requests") == nil {
		t.Error("no readiness probe or resources")
	}
	// The configuration: only keys pleg-nri knows (those of nri.conf.example).
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(get(objs["ConfigMap/rel-pleg-nri"], "data", "config.yaml").(string)), &cfg); err != nil {
		t.Fatal(err)
	}
	known := exampleKeys(t)
	for k := range cfg {
		if !known[k] {
			t.Errorf("the ConfigMap has key %q, which pleg-nri does not know", k)
		}
	}
	// An upgrade's pace: one node at a time, each new pod ready minReadySeconds before the next.
	if got := get(ds, "spec", "minReadySeconds"); got != float64(0) {
		t.Errorf("minReadySeconds = %v, want 0 by default", got)
	}
	if got := get(render(t, "--set", "minReadySeconds=40")["DaemonSet/rel-pleg-nri"], "spec", "minReadySeconds"); got != float64(40) {
		t.Errorf("minReadySeconds = %v with --set minReadySeconds=40", got)
	}
	// A configuration change rolls the DaemonSet.
	sum := get(ds, "spec", "template", "metadata", "annotations", "checksum/config")
	if sum2 := get(render(t, "--set", "config.log-level=debug")["DaemonSet/rel-pleg-nri"], "spec", "template", "metadata", "annotations", "checksum/config"); sum == sum2 || sum == nil {
		t.Errorf("checksum/config %v does not change with the configuration (%v)", sum, sum2)
	}

	// The uninstall hook.
	job := objs["Job/rel-pleg-nri-uninstall"]
	if get(job, "metadata", "annotations", "helm.sh/hook") != "pre-delete" {
		t.Errorf("the uninstall Job is not a pre-delete hook: %v", get(job, "metadata", "annotations"))
	}
	jc := get(job, "spec", "template", "spec", "containers", 0)
	if cmd, _ := json.Marshal(get(jc, "command")); string(cmd) != `["/bin/sh","/opt/pleg-nri/node.sh","uninstall"]` {
		t.Errorf("uninstall command %s", cmd)
	}
	if get(job, "spec", "template", "spec", "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution", 0, "topologyKey") != "kubernetes.io/hostname" {
		t.Error("the uninstall pods are not one per node")
	}
	if get(job, "spec", "template", "spec", "priorityClassName") != "system-node-critical" || get(job, "spec", "template", "spec", "hostPID") != true {
		t.Error("the uninstall pod is not like the installer's")
	}
	job3 := render(t, "--set", "uninstall.nodeCount=3")["Job/rel-pleg-nri-uninstall"]
	if get(job3, "spec", "completions") != 3.0 || get(job3, "spec", "parallelism") != 3.0 {
		t.Errorf("uninstall.nodeCount=3: completions %v parallelism %v", get(job3, "spec", "completions"), get(job3, "spec", "parallelism"))
	}

	// The kubelet switch, only when asked; the pre-registered mode.
	on := envOf(get(render(t, "--set", "kubelet.switchEndpoint=true", "--set", "kubelet.eventedPLEG=false", "--set", "mode=nri",
		"--set", "config.listen=unix:///run/other/cri.sock")["DaemonSet/rel-pleg-nri"], "spec", "template", "spec", "containers", 0))
	for k, want := range map[string]string{"PLEG_NRI_SWITCH_KUBELET": "true", "PLEG_NRI_EVENTED_PLEG": "false", "PLEG_NRI_MODE": "nri",
		"PLEG_NRI_ENDPOINT": "unix:///run/other/cri.sock"} {
		if on[k] != want {
			t.Errorf("switched: env %s=%q, want %q", k, on[k], want)
		}
	}
}

// exampleKeys returns the keys of nri.conf.example (a unit test of cmd/pleg-nri ties them to the
// daemon's defaults, so they are every key pleg-nri knows).
func exampleKeys(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(), "nri.conf.example"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for k := range m {
		keys[k] = true
	}
	if len(keys) < 10 {
		t.Fatalf("nri.conf.example has only %v", keys)
	}
	return keys
}

// TestHelmValuesSchema: the schema knows every pleg-nri key and rejects what pleg-nri or the chart
// would fail on later.
func TestHelmValuesSchema(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir(), "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Config struct {
				Properties map[string]any
			}
		}
	}
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatal(err)
	}
	known := exampleKeys(t)
	for k := range known {
		if schema.Properties.Config.Properties[k] == nil {
			t.Errorf("values.schema.json has no config key %q", k)
		}
	}
	for k, p := range schema.Properties.Config.Properties {
		// A retired key stays in the schema, so that a release's values still install: pleg-nri ignores
		// it with a warning.
		if retired, _ := p.(map[string]any)["deprecated"].(bool); retired {
			if known[k] {
				t.Errorf("values.schema.json says config key %q is retired, and nri.conf.example still has it", k)
			}
			continue
		}
		if !known[k] {
			t.Errorf("values.schema.json has config key %q, which pleg-nri does not know", k)
		}
	}
	h := helmBin(t)
	for _, bad := range [][]string{
		{"--set", "mode=daemonset"},
		{"--set", "config.relist-priod=5s"},
		{"--set", "config.relist-period=often"},
		{"--set", "config.plugin-idx=7"},
		{"--set", "kubelet.switchEndpoint=yes"},
		{"--set", "config.metrics-address=null"},
		{"--set", "image.pullPolicy=Sometimes"},
		{"--set", "uninstall.nodeCount=-1"},
		{"--set", "minReadySeconds=-5"},
		{"--set", "kubelet.dropinDir=kubelet.conf.d"},
		{"--set", "unknownValue=1"},
	} {
		out, err := tryRun(h, append([]string{"template", "rel", chartDir()}, bad...)...)
		if err == nil || !strings.Contains(out, "schema") {
			t.Errorf("helm template %v was accepted: %v\n%s", bad, err, out)
		}
	}
	for _, good := range [][]string{
		{"--set", "config.relist-period=5s", "--set-string", "config.startup-replay=0", "--set-string", "config.plugin-idx=20"},
		{"--set", "config.subscriber-queue=4096", "--set", "config.log-level=debug"},
		{"--set", "kubelet.switchEndpoint=true", "--set", "kubelet.dropinDir=/etc/kubernetes/kubelet.conf.d"},
	} {
		if out, err := tryRun(h, append([]string{"template", "rel", chartDir()}, good...)...); err != nil {
			t.Errorf("helm template %v was refused: %v\n%s", good, err, out)
		}
	}
}

// TestHelmReadiness (issue 60): the installer pod is ready only while pleg-nri serves its node
// (node.sh health: the install done, the core's /readyz, a CRI Version call through the kubelet's
// endpoint; served by the installer for an HTTP probe), with probe settings that make a broken node's pod not Ready within 30 s; it has no
// liveness probe (restarting the installer repairs nothing: docs/operations.md).
func TestHelmReadiness(t *testing.T) {
	c := get(render(t)["DaemonSet/rel-pleg-nri"], "spec", "template", "spec", "containers", 0)
	probe := get(c, "readinessProbe")
	// An HTTP probe, which the kubelet makes itself (an exec probe goes through the front it checks),
	// to the installer's server of node.sh health on the node's loopback.
	if hg, _ := json.Marshal(get(probe, "httpGet")); string(hg) != `{"host":"127.0.0.1","path":"/cgi-bin/health","port":9811}` || get(probe, "exec") != nil {
		t.Errorf("readiness probe %v, want httpGet 127.0.0.1:9811/cgi-bin/health", probe)
	}
	if a := envOf(c)["PLEG_NRI_HEALTH_ADDRESS"]; a != "127.0.0.1:9811" {
		t.Errorf("PLEG_NRI_HEALTH_ADDRESS=%q, want the probe's 127.0.0.1:9811", a)
	}
	period, failures, timeout := get(probe, "periodSeconds").(float64), get(probe, "failureThreshold").(float64), get(probe, "timeoutSeconds").(float64)
	// The worst case from a fault to not Ready: a probe that just passed, then failureThreshold probes
	// each a period apart, the last taking its whole timeout.
	if worst := period*failures + timeout; worst > 30 {
		t.Errorf("readiness probe: period %vs x %v failures + timeout %vs = %vs, want a broken node not Ready within 30 s", period, failures, timeout, worst)
	}
	if failures < 2 || get(probe, "successThreshold") != 1.0 {
		t.Errorf("readiness probe: failureThreshold %v (a single blip must not flip it), successThreshold %v", failures, get(probe, "successThreshold"))
	}
	// Both checks of pleg-nri health fit in the probe's timeout.
	check, _ := strconv.Atoi(envOf(c)["PLEG_NRI_HEALTH_TIMEOUT"])
	if check < 1 || float64(2*check) >= timeout {
		t.Errorf("PLEG_NRI_HEALTH_TIMEOUT %q: two checks must fit in the probe's timeout %vs", envOf(c)["PLEG_NRI_HEALTH_TIMEOUT"], timeout)
	}
	if lp := get(c, "livenessProbe"); lp != nil {
		t.Errorf("the installer has a liveness probe %v: restarting it repairs nothing", lp)
	}
	// The drift check's re-apply: off unless asked.
	if v := envOf(c)["PLEG_NRI_REAPPLY_SWITCH"]; v != "false" {
		t.Errorf("PLEG_NRI_REAPPLY_SWITCH=%q by default", v)
	}
	if v := envOf(get(render(t, "--set", "kubelet.reapplySwitch=true")["DaemonSet/rel-pleg-nri"], "spec", "template", "spec", "containers", 0))["PLEG_NRI_REAPPLY_SWITCH"]; v != "true" {
		t.Errorf("PLEG_NRI_REAPPLY_SWITCH=%q with kubelet.reapplySwitch=true", v)
	}
	// The switch through the kubelet's drop-in directory: off unless asked, in the installer and in the
	// uninstall job (which undoes it).
	if v, ok := envOf(c)["PLEG_NRI_KUBELET_DROPIN_DIR"]; !ok || v != "" {
		t.Errorf("PLEG_NRI_KUBELET_DROPIN_DIR=%q (set: %v) by default, want empty", v, ok)
	}
	dropin := render(t, "--set", "kubelet.dropinDir=/etc/kubernetes/kubelet.conf.d")
	for _, c := range []any{get(dropin["DaemonSet/rel-pleg-nri"], "spec", "template", "spec", "containers", 0),
		get(dropin["Job/rel-pleg-nri-uninstall"], "spec", "template", "spec", "containers", 0)} {
		if v := envOf(c)["PLEG_NRI_KUBELET_DROPIN_DIR"]; v != "/etc/kubernetes/kubelet.conf.d" {
			t.Errorf("PLEG_NRI_KUBELET_DROPIN_DIR=%q with kubelet.dropinDir set", v)
		}
	}
	c2 := get(render(t, "--set", "readiness.periodSeconds=2", "--set", "readiness.failureThreshold=4", "--set", "readiness.checkTimeoutSeconds=1", "--set", "readiness.port=19811")["DaemonSet/rel-pleg-nri"],
		"spec", "template", "spec", "containers", 0)
	if get(c2, "readinessProbe", "periodSeconds") != 2.0 || get(c2, "readinessProbe", "failureThreshold") != 4.0 || envOf(c2)["PLEG_NRI_HEALTH_TIMEOUT"] != "1" ||
		get(c2, "readinessProbe", "httpGet", "port") != 19811.0 || envOf(c2)["PLEG_NRI_HEALTH_ADDRESS"] != "127.0.0.1:19811" {
		t.Errorf("readiness values not applied: %v, env %v", get(c2, "readinessProbe"), envOf(c2)["PLEG_NRI_HEALTH_TIMEOUT"])
	}
}

// TestHelmScrape (issue 60): the installer pods carry Prometheus' scrape annotations (and a named
// metrics port) where pleg-nri's metrics address is reachable beyond loopback, none where it is not;
// the PodMonitor is off by default, refused on a loopback address, and selects the installer pods on
// their metrics port with job="pleg-nri" and the node's name, as the shipped rules expect.
func TestHelmScrape(t *testing.T) {
	annotations := func(objs map[string]map[string]any) map[string]any {
		a, _ := get(objs["DaemonSet/rel-pleg-nri"], "spec", "template", "metadata", "annotations").(map[string]any)
		return a
	}
	ports := func(objs map[string]map[string]any) string {
		p, _ := json.Marshal(get(objs["DaemonSet/rel-pleg-nri"], "spec", "template", "spec", "containers", 0, "ports"))
		return string(p)
	}
	for _, addr := range []string{"", "127.0.0.1:9810", "localhost:9810", "127.0.0.2:9810"} {
		var args []string
		if addr != "" {
			args = []string{"--set", "config.metrics-address=" + addr}
		}
		objs := render(t, args...)
		if a := annotations(objs); a["prometheus.io/scrape"] != nil || a["prometheus.io/port"] != nil {
			t.Errorf("metrics-address %q (loopback): scrape annotations %v", addr, a)
		}
		if p := ports(objs); p != "null" {
			t.Errorf("metrics-address %q (loopback): ports %s", addr, p)
		}
		if _, ok := objs["PodMonitor/rel-pleg-nri"]; ok {
			t.Errorf("a PodMonitor by default")
		}
		out, err := tryRun(helmBin(t), append([]string{"template", "rel", chartDir(), "--set", "metrics.podMonitor.enabled=true"}, args...)...)
		if err == nil || !strings.Contains(out, "listens on loopback only") {
			t.Errorf("metrics-address %q (loopback) with a PodMonitor: %v\n%s", addr, err, out)
		}
	}
	for addr, port := range map[string]string{"0.0.0.0:9811": "9811", "10.0.0.2:9810": "9810", ":9812": "9812"} {
		objs := render(t, "--set", "config.metrics-address="+addr)
		a := annotations(objs)
		if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != port || a["prometheus.io/path"] != "/metrics" {
			t.Errorf("metrics-address %s: annotations %v, want scrape true, port %s, path /metrics", addr, a, port)
		}
		if p := ports(objs); p != `[{"containerPort":`+port+`,"name":"metrics","protocol":"TCP"}]` {
			t.Errorf("metrics-address %s: ports %s", addr, p)
		}
		if a := annotations(render(t, "--set", "config.metrics-address="+addr, "--set", "metrics.scrapeAnnotations=false")); a["prometheus.io/scrape"] != nil {
			t.Errorf("metrics.scrapeAnnotations=false: %v", a)
		}
	}

	objs := render(t, "--set", "config.metrics-address=0.0.0.0:9810", "--set", "metrics.podMonitor.enabled=true",
		"--set", "metrics.podMonitor.interval=15s", "--set", "metrics.podMonitor.labels.release=prom")
	pm, ok := objs["PodMonitor/rel-pleg-nri"]
	if !ok {
		t.Fatalf("no PodMonitor with metrics.podMonitor.enabled")
	}
	if pm["apiVersion"] != "monitoring.coreos.com/v1" || get(pm, "metadata", "labels", "release") != "prom" {
		t.Errorf("PodMonitor %v %v", pm["apiVersion"], get(pm, "metadata", "labels"))
	}
	// It selects the installer pods: its selector is the DaemonSet's, which the pods carry.
	sel, _ := json.Marshal(get(pm, "spec", "selector", "matchLabels"))
	dsSel, _ := json.Marshal(get(objs["DaemonSet/rel-pleg-nri"], "spec", "selector", "matchLabels"))
	if string(sel) != string(dsSel) {
		t.Errorf("PodMonitor selector %s, DaemonSet's %s", sel, dsSel)
	}
	ep := get(pm, "spec", "podMetricsEndpoints", 0)
	if get(ep, "port") != "metrics" || get(ep, "path") != "/metrics" || get(ep, "interval") != "15s" {
		t.Errorf("PodMonitor endpoint %v", ep)
	}
	relabel, _ := json.Marshal(get(ep, "relabelings"))
	if !strings.Contains(string(relabel), `{"replacement":"pleg-nri","targetLabel":"job"}`) ||
		!strings.Contains(string(relabel), `{"sourceLabels":["__meta_kubernetes_pod_node_name"],"targetLabel":"node"}`) {
		t.Errorf("PodMonitor relabelings %s, want job=pleg-nri and node", relabel)
	}
	if ep2 := get(render(t, "--set", "config.metrics-address=0.0.0.0:9810", "--set", "metrics.podMonitor.enabled=true")["PodMonitor/rel-pleg-nri"],
		"spec", "podMetricsEndpoints", 0); get(ep2, "interval") != nil {
		t.Errorf("PodMonitor interval %v without metrics.podMonitor.interval", get(ep2, "interval"))
	}
}

// TestHelmContainerdNRI (issue 60): containerd's NRI timeouts are off by default (empty: node.sh
// leaves containerd alone) and reach the installer and the uninstall pods when set.
func TestHelmContainerdNRI(t *testing.T) {
	objs := render(t)
	for _, k := range []string{"DaemonSet/rel-pleg-nri", "Job/rel-pleg-nri-uninstall"} {
		env := envOf(get(objs[k], "spec", "template", "spec", "containers", 0))
		if env["PLEG_NRI_CONTAINERD_NRI_REGISTRATION_TIMEOUT"] != "" || env["PLEG_NRI_CONTAINERD_NRI_REQUEST_TIMEOUT"] != "" ||
			env["PLEG_NRI_CONTAINERD_CONFIG"] != "/etc/containerd/config.toml" {
			t.Errorf("%s: by default %v", k, env)
		}
	}
	objs = render(t, "--set", "containerd.nri.pluginRegistrationTimeout=20s", "--set", "containerd.nri.pluginRequestTimeout=5s")
	env := envOf(get(objs["DaemonSet/rel-pleg-nri"], "spec", "template", "spec", "containers", 0))
	if env["PLEG_NRI_CONTAINERD_NRI_REGISTRATION_TIMEOUT"] != "20s" || env["PLEG_NRI_CONTAINERD_NRI_REQUEST_TIMEOUT"] != "5s" {
		t.Errorf("set: %v", env)
	}
	for _, bad := range []string{"containerd.nri.pluginRequestTimeout=5", "containerd.nri.pluginRegistrationTimeout=soon", "containerd.configPath=config.toml"} {
		if out, err := tryRun(helmBin(t), "template", "rel", chartDir(), "--set", bad); err == nil || !strings.Contains(out, "schema") {
			t.Errorf("helm template --set %s was accepted: %v\n%s", bad, err, out)
		}
	}
}

// TestHelmReuseValuesFromOlderChart (issue 60): helm upgrade --reuse-values keeps the previous
// release's values, not this chart's defaults, so values added since (readiness, metrics, containerd,
// kubelet.reapplySwitch) may be absent: the chart renders them with their defaults. It failed so in a
// TestHelmKind run: "at '/readiness': missing property 'port'".
func TestHelmReuseValuesFromOlderChart(t *testing.T) {
	absent := []string{"--set", "readiness=null", "--set", "metrics=null", "--set", "containerd=null", "--set", "kubelet.reapplySwitch=null"}
	objs := render(t, absent...)
	if _, ok := objs["PodMonitor/rel-pleg-nri"]; ok {
		t.Error("a PodMonitor without metrics values")
	}
	c := get(objs["DaemonSet/rel-pleg-nri"], "spec", "template", "spec", "containers", 0)
	probe, _ := json.Marshal(get(c, "readinessProbe"))
	if string(probe) != `{"failureThreshold":3,"httpGet":{"host":"127.0.0.1","path":"/cgi-bin/health","port":9811},"periodSeconds":5,"successThreshold":1,"timeoutSeconds":5}` {
		t.Errorf("readiness probe without readiness values: %s", probe)
	}
	env := envOf(c)
	for k, want := range map[string]string{"PLEG_NRI_HEALTH_ADDRESS": "127.0.0.1:9811", "PLEG_NRI_HEALTH_TIMEOUT": "2", "PLEG_NRI_REAPPLY_SWITCH": "false",
		"PLEG_NRI_CONTAINERD_CONFIG": "/etc/containerd/config.toml", "PLEG_NRI_CONTAINERD_NRI_REGISTRATION_TIMEOUT": "", "PLEG_NRI_CONTAINERD_NRI_REQUEST_TIMEOUT": ""} {
		if env[k] != want {
			t.Errorf("without the new values: env %s=%q, want %q", k, env[k], want)
		}
	}
	// The scrape annotations' default (on) holds without metrics values; an explicit off stays off.
	a := get(render(t, append(absent, "--set", "config.metrics-address=0.0.0.0:9810")...)["DaemonSet/rel-pleg-nri"], "spec", "template", "metadata", "annotations")
	if get(a, "prometheus.io/scrape") != "true" {
		t.Errorf("annotations without metrics values: %v", a)
	}
	a = get(render(t, "--set", "config.metrics-address=0.0.0.0:9810", "--set", "metrics.scrapeAnnotations=false")["DaemonSet/rel-pleg-nri"], "spec", "template", "metadata", "annotations")
	if get(a, "prometheus.io/scrape") != nil {
		t.Errorf("metrics.scrapeAnnotations=false: %v", a)
	}
}

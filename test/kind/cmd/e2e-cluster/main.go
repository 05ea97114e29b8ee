// Command e2e-cluster is make e2e-cluster's driver: a kind cluster of one control plane and two workers
// from the offline node image (test/kind/node-image.sh), run as a production cluster is:
//
//  1. pod networking across the nodes by nodenet (test/kind/cmd/nodenet, a DaemonSet: each node's CNI
//     configuration over its podCIDR, routes to the other nodes' podCIDRs), checked pod to pod across
//     the workers;
//  2. kubeadm's kube-proxy (built from the module proxy into the node image), checked with a pod on one
//     worker reaching a ClusterIP Service whose only endpoint is on the other, by address and by name;
//  3. pleg-nri installed on every node by the Helm chart with the kubelet switch on: on every node the
//     kubelet runs on pleg-nri's socket with EventedPLEG, holds its event stream, and counts no stream
//     error;
//  4. workloads on every node (test manifests in manifests.go): a crash-looping container, a
//     Deployment behind a Service, a Job, pods with probes; each must behave as it should;
//  5. a rolling helm upgrade to another image, node by node, then a helm rollback, each while pods
//     crash on every node: every node runs the version it should, its kubelet kept its event stream
//     (no error, no new connection), no container is duplicated, the workloads still behave;
//  6. a worker drained (kubectl drain) and uncordoned, and later a worker lost (its container killed)
//     and started again: pleg-nri stays, or comes back with the node before the kubelet, and the
//     kubelet's stream counts no error (a restarted node's new kubelet included);
//  7. helm uninstall: every kubelet back on containerd's socket without EventedPLEG, nothing of
//     pleg-nri left on a node or in the cluster.
//
// Crash to restart (package crashbench: pods whose container crashes once, times from containerd) is
// measured right after the install with kind's GenericPLEG, with EventedPLEG on containerd's own
// stream and with pleg-nri side by side (a setup per node at the same moments, rotated over the nodes
// in three rounds), and during the upgrade and the rollback; -report writes the figures per phase and
// per node, and the goals the side-by-side figures meet.
//
// The cluster is deleted at the end, whatever happened (PLEG_NRI_E2E_KEEP keeps it), and nothing of it
// may be left: no container, no volume, no network kind made.
//
// Run from the repository root, after test/kind/cluster.sh built what it needs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/internal/kindrun"
)

func main() {
	var o options
	flag.StringVar(&o.kind, "kind", "kind", "kind binary")
	flag.StringVar(&o.kubectl, "kubectl", "kubectl", "kubectl binary")
	flag.StringVar(&o.helm, "helm", "helm", "helm binary")
	flag.StringVar(&o.image, "image", "", "node image (test/kind/node-image.sh)")
	flag.StringVar(&o.nodenetTar, "nodenet-image-tar", "", "nodenet's image, saved by docker save (test/kind/hack/iptables-image.sh)")
	flag.StringVar(&o.nodenetImage, "nodenet-image", "", "nodenet's image name, as in -nodenet-image-tar")
	flag.StringVar(&o.plegNRITar, "pleg-nri-image-tar", "", "pleg-nri's image (make image)")
	flag.StringVar(&o.plegNRIImage, "pleg-nri-image", "", "pleg-nri's image name, as in -pleg-nri-image-tar")
	flag.StringVar(&o.upgradeTar, "upgrade-image-tar", "", "another pleg-nri image (another version of the binary) for the rolling upgrade")
	flag.StringVar(&o.upgradeImage, "upgrade-image", "", "its name, as in -upgrade-image-tar")
	flag.StringVar(&o.plegNRIBin, "pleg-nri-bin", "", "a static pleg-nri binary (its kubelet-config command switches the kubelets to containerd's stream)")
	flag.StringVar(&o.report, "report", "", "write the crash-to-restart figures of every phase there (markdown)")
	flag.StringVar(&o.version, "k8s-version", "", "the cluster's Kubernetes version, for the report")
	flag.StringVar(&o.chart, "chart", "deploy/helm/pleg-nri", "the Helm chart")
	flag.StringVar(&o.prometheus, "prometheus", "", "a prometheus binary: run it on the host, scraping the cluster, with the shipped rules (none: no Prometheus)")
	flag.StringVar(&o.scrapeConfig, "scrape-config", "deploy/prometheus/scrape-config.yaml", "the shipped scrape configuration")
	flag.StringVar(&o.rules, "rules", "deploy/prometheus/pleg-nri-rules.yaml", "the shipped alerting rules")
	flag.StringVar(&o.dashboard, "dashboard", "deploy/grafana/pleg-nri-dashboard.json", "the shipped dashboard")
	flag.StringVar(&o.name, "name", "pleg-nri-cluster", "the cluster's name")
	flag.StringVar(&o.conformance, "conformance", "", "a directory with upstream's e2e.test, ginkgo and agnhost at the cluster's version "+
		"(build-e2e-node.sh, E2E_SUITE=e2e): run its [sig-node] [Conformance] specs per setup instead of the rest")
	flag.StringVar(&o.conformanceReport, "conformance-report", "", "with -conformance: write the report there (markdown; the results beside it as .json)")
	flag.StringVar(&o.registry, "registry", "", "with -conformance: the registry binary (distribution's) to serve the built images to the specs that pull")
	flag.IntVar(&o.conformanceProcs, "conformance-procs", 4, "with -conformance: ginkgo's parallel processes")
	flag.DurationVar(&o.conformanceTimeout, "conformance-timeout", 2*time.Hour, "with -conformance: ginkgo's timeout per setup")
	flag.StringVar(&o.cache, "cache", "/var/cache/pleg-nri", "the dependency cache (the test images' inputs and archives)")
	flag.StringVar(&o.commit, "commit", "unknown", "the tree's commit, for the reports")
	flag.Parse()
	for f, v := range map[string]string{"-image": o.image, "-nodenet-image-tar": o.nodenetTar, "-nodenet-image": o.nodenetImage,
		"-pleg-nri-image-tar": o.plegNRITar, "-pleg-nri-image": o.plegNRIImage, "-upgrade-image-tar": o.upgradeTar,
		"-upgrade-image": o.upgradeImage, "-pleg-nri-bin": o.plegNRIBin} {
		if v == "" {
			fmt.Fprintf(os.Stderr, "e2e-cluster: %s is required\n", f)
			os.Exit(2)
		}
	}
	o.keep = os.Getenv("PLEG_NRI_E2E_KEEP") != ""
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "e2e-cluster: FAIL:", err)
		os.Exit(1)
	}
	fmt.Println("e2e-cluster: PASS")
}

type options struct {
	kind, kubectl, helm, image, nodenetTar, nodenetImage, plegNRITar, plegNRIImage, chart, name string
	upgradeTar, upgradeImage, plegNRIBin, report, version                                       string
	prometheus, scrapeConfig, rules, dashboard                                                  string
	conformance, conformanceReport, cache, commit, registry                                     string
	conformanceProcs                                                                            int
	conformanceTimeout                                                                          time.Duration
	keep                                                                                        bool
}

const (
	podSubnet     = "10.244.0.0/16"
	serviceSubnet = "10.96.0.0/16"
	busybox       = "docker.io/library/busybox:plegit"
)

// cluster is a running cluster and how to reach it.
type cluster struct {
	o          options
	kubeconfig string
	// nodes: the control plane first, then the workers (kind's names).
	nodes []string
	// reboots counts the restarts of each node's container (the node loss): each restarted the
	// node's pods' containers once.
	reboots map[string]int
}

func (c *cluster) k(ctx context.Context, args ...string) (string, error) {
	return cmd(ctx, c.o.kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
}

func (c *cluster) onNode(ctx context.Context, node string, args ...string) (string, error) {
	return cmd(ctx, "docker", append([]string{"exec", node}, args...)...)
}

func run(ctx context.Context, o options) (err error) {
	tmp, err := os.MkdirTemp("", "e2e-cluster-")
	if err != nil {
		return err
	}
	defer func() {
		if o.keep {
			// The kept nodes' /etc/cni/net.d are mounted from it: removing it takes their pod network.
			fmt.Printf("e2e-cluster: PLEG_NRI_E2E_KEEP: %s kept too (the nodes' CNI configurations are mounted from it): "+
				"remove it once the cluster is deleted\n", tmp)
			return
		}
		os.RemoveAll(tmp)
	}()
	c := &cluster{o: o, kubeconfig: filepath.Join(tmp, "kubeconfig"),
		nodes: []string{o.name + "-control-plane", o.name + "-worker", o.name + "-worker2"}, reboots: map[string]int{}}

	// kind makes the docker network "kind" and never removes it: remove it when this run made it.
	removeNet := kindrun.KindNetwork(ctx)
	defer func() {
		if !o.keep {
			err = errors.Join(err, removeNet())
		}
	}()

	// 1. The cluster.
	type node struct{ Role, CNIDir string }
	var nodes []node
	for i, n := range c.nodes {
		dir := filepath.Join(tmp, "cni", n)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		role := "worker"
		if i == 0 {
			role = "control-plane"
		}
		nodes = append(nodes, node{role, dir})
	}
	cfg, err := render(clusterConfig, map[string]any{"Nodes": nodes, "PodSubnet": podSubnet, "ServiceSubnet": serviceSubnet})
	if err != nil {
		return err
	}
	config := filepath.Join(tmp, "kind.yaml")
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		return err
	}
	start := time.Now()
	fmt.Printf("e2e-cluster: creating cluster %s (%d nodes)\n", o.name, len(c.nodes))
	_, err = cmd(ctx, o.kind, "create", "cluster", "--name", o.name, "--image", o.image, "--config", config,
		"--kubeconfig", c.kubeconfig, "--retain")
	defer func() {
		if err != nil {
			c.diagnose(ctx)
		}
		if o.keep {
			fmt.Printf("e2e-cluster: PLEG_NRI_E2E_KEEP: cluster %s kept (kubeconfig: kind get kubeconfig --name %s); "+
				"delete it with kind delete cluster --name %s\n", o.name, o.name, o.name)
			return
		}
		if derr := c.delete(ctx); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	if err != nil {
		return fmt.Errorf("kind create cluster: %w", err)
	}
	created := time.Since(start)
	fmt.Printf("e2e-cluster: kind create cluster: %s\n", created.Round(time.Second))

	// 2. Pod networking.
	for _, tar := range []string{o.nodenetTar, o.plegNRITar, o.upgradeTar} {
		if out, err := cmd(ctx, o.kind, "load", "image-archive", tar, "--name", o.name); err != nil {
			return fmt.Errorf("kind load image-archive %s: %w\n%s", tar, err, out)
		}
	}
	if err := c.apply(ctx, nodenetManifest, map[string]any{"Image": o.nodenetImage, "PodSubnet": podSubnet,
		"APIServerHost": c.nodes[0]}); err != nil {
		return fmt.Errorf("deploying nodenet: %w", err)
	}
	for _, n := range c.nodes {
		if _, err := c.k(ctx, "wait", "--for=condition=Ready", "node/"+n, "--timeout=240s"); err != nil {
			return fmt.Errorf("node %s is not Ready (nodenet writes its CNI configuration): %w", n, err)
		}
	}
	up := time.Since(start)
	fmt.Printf("e2e-cluster: all %d nodes Ready %s after the start\n", len(c.nodes), up.Round(time.Second))
	cidrs, err := c.checkPodCIDRs(ctx)
	if err != nil {
		return err
	}
	for _, d := range []string{"daemonset/nodenet", "daemonset/kube-proxy", "deployment/coredns"} {
		if _, err := c.k(ctx, "-n", "kube-system", "rollout", "status", d, "--timeout=240s"); err != nil {
			return fmt.Errorf("%s did not roll out: %w", d, err)
		}
	}

	// 3. Pod to pod across the workers, then a Service whose only endpoint is on the other worker.
	svc, err := c.checkService(ctx)
	if err != nil {
		return err
	}
	if o.conformance != "" {
		return c.conformance(ctx, tmp)
	}

	var phases []phase
	var notes []string
	defer func() {
		if werr := writeReport(o.report, o.version, phases, notes); werr != nil {
			err = errors.Join(err, werr)
		}
	}()

	// 4. pleg-nri on every node, the kubelets switched.
	upRepo, upTag, ok := strings.Cut(o.upgradeImage, ":")
	if repo, tag, _ := strings.Cut(o.plegNRIImage, ":"); !ok || upRepo != repo || upTag == tag {
		return fmt.Errorf("-upgrade-image %q is not another tag of %s", o.upgradeImage, repo)
	}
	installed, before, err := c.install(ctx)
	if err != nil {
		return err
	}
	// Crash to restart side by side: GenericPLEG, containerd's stream and pleg-nri, a node each,
	// rotated over the nodes; then every kubelet back on pleg-nri, whose streams the rest of the run
	// must keep.
	ph3, roundNotes, err := c.sideBySidePhases(ctx)
	phases = append(phases, ph3...)
	notes = append(notes, roundNotes...)
	if err != nil {
		return err
	}
	notes = append(notes, compareSetups(ph3)...)
	for _, n := range c.nodes {
		if before[n], err = c.waitStreaming(ctx, n); err != nil {
			return err
		}
	}
	version, err := c.onNode(ctx, c.nodes[0], "/usr/local/bin/pleg-nri", "version")
	if err != nil {
		return err
	}
	version = strings.TrimPrefix(version, "pleg-nri ")
	// Prometheus from here on: it must see no alert fire on the healthy cluster (installed, crashing pods,
	// an upgrade, a rollback), and data in every panel of the dashboard.
	var prom *promServer
	var promStart time.Time
	var psiStart pressureReading
	if o.prometheus != "" {
		if prom, err = c.startPrometheus(ctx, filepath.Join(tmp, "prometheus")); err != nil {
			return err
		}
		defer prom.stop()
		promStart = time.Now()
		if psiStart, err = readPressure(); err != nil {
			return err
		}
	}

	// 5. Workloads on every node.
	start = time.Now()
	if err := c.apply(ctx, workloads, map[string]any{"Nodes": c.nodes, "Busybox": busybox}); err != nil {
		return fmt.Errorf("applying the workloads: %w", err)
	}
	if err := c.checkWorkloads(ctx); err != nil {
		return err
	}
	fmt.Printf("e2e-cluster: workloads on %d nodes behaved in %s\n", len(c.nodes), time.Since(start).Round(time.Second))

	// 6. A rolling upgrade to another image, then a rollback, each while a crash batch runs.
	// The upgrade image's binary is of version upTag (test/kind/cluster.sh builds it so).
	ph, err := c.roll(ctx, "rolling upgrade", "crash-upgrade", upTag, before,
		"upgrade", "pleg-nri", o.chart, "--reuse-values", "--set-string", "image.tag="+upTag)
	phases = append(phases, ph)
	if err != nil {
		return err
	}
	notes = append(notes, compareRoll(ph3, ph, c.nodes))
	notes = append(notes, ph.slow...)
	ph, err = c.roll(ctx, "rollback", "crash-rollback", version, before, "rollback", "pleg-nri", "1")
	phases = append(phases, ph)
	if err != nil {
		return err
	}
	notes = append(notes, compareRoll(ph3, ph, c.nodes))
	notes = append(notes, ph.slow...)
	if err := c.checkWorkloads(ctx); err != nil {
		return fmt.Errorf("after the upgrade and the rollback: %w", err)
	}

	// A worker drained for maintenance and uncordoned: pleg-nri and the kubelet's stream stay.
	line, err := c.drain(ctx, c.nodes[1], before)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	notes = append(notes, line)

	// 7. The kubelets' streams at the end: no error, no new connection.
	var failures []string
	for _, n := range c.nodes {
		st, err := c.stream(ctx, n)
		if err != nil {
			return err
		}
		fmt.Printf("e2e-cluster: %s: at the end: %s\n", n, st)
		if !st.keeps(before[n]) {
			failures = append(failures, fmt.Sprintf("%s: the kubelet's event stream: %s at the end, %s after install; want 0 errors, "+
				"the same connections, 1 subscriber", n, st, before[n]))
		}
	}
	fmt.Printf("e2e-cluster: summary: cluster created in %s, all nodes Ready after %s; pod CIDRs %s; %s; "+
		"helm install %s\n", created.Round(time.Second), up.Round(time.Second), strings.Join(cidrs, " "), svc, installed.Round(time.Second))
	if prom != nil {
		// Two scrapes and evaluations more, so that the end of the run is in.
		time.Sleep(2 * promScrapeInterval)
		window := time.Since(promStart)
		psiEnd, err := readPressure()
		if err != nil {
			return err
		}
		pressure := psiStart.share(psiEnd)
		fmt.Printf("e2e-cluster: the machine's CPU pressure over the healthy window (%s): %.0f%% (a runnable task waited for a CPU that share of the time)\n",
			window.Round(time.Second), 100*pressure)
		notes = append(notes, fmt.Sprintf("The machine's CPU pressure over the %s Prometheus watched the healthy cluster: %.0f%%.", window.Round(time.Second), 100*pressure))
		fired, err := prom.firingSince(ctx, window)
		if err != nil {
			return err
		}
		if len(fired) == 0 {
			line := fmt.Sprintf("no alert of the shipped rules fired over the %s Prometheus watched the healthy cluster (workloads, crash batches, upgrade, rollback, drain)",
				window.Round(time.Second))
			fmt.Println("e2e-cluster:", line)
			notes = append(notes, line)
		} else {
			// What the alerts were about, so that a failure says it.
			for _, l := range append(prom.latencies(ctx, window), c.explainRepairs(ctx, prom, window)...) {
				fmt.Printf("e2e-cluster: %s\n", l)
			}
			bad, ok := judgeFiring(fired, pressure)
			for _, n := range ok {
				fmt.Printf("e2e-cluster: %s\n", n)
			}
			notes = append(notes, ok...)
			if len(bad) > 0 {
				failures = append(failures, fmt.Sprintf("alerts fired on the healthy cluster over %s (CPU pressure %.0f%%): %s",
					window.Round(time.Second), 100*pressure, strings.Join(bad, "; ")))
			}
		}
		// Faults on three nodes at once: each must fire its alert, and the cluster come back whole.
		// The dashboard is checked after them: some of its panels (evictions, stream ends) only have
		// data once such a thing happened.
		rulesFor, err := alertFor(o.rules)
		if err != nil {
			return err
		}
		if faults, err := c.injectFaults(ctx, prom, rulesFor, before); err != nil {
			failures = append(failures, err.Error())
		} else {
			for _, f := range faults {
				notes = append(notes, "fault: "+f.line(rulesFor[f.alert], promScrapeInterval))
			}
		}
		if line, err := c.checkDashboard(ctx, prom); err != nil {
			failures = append(failures, err.Error())
		} else {
			notes = append(notes, line)
		}
	}
	if len(failures) > 0 {
		return errors.New(strings.Join(failures, "\n"))
	}

	// A worker lost (its container killed) and started again: pleg-nri comes back with it, and the new
	// kubelet's stream has no error.
	if line, err = c.loseNode(ctx, c.nodes[2], before); err != nil {
		return fmt.Errorf("node loss: %w", err)
	}
	notes = append(notes, line)

	// 8. Uninstall: every kubelet back as kind made it, nothing of pleg-nri left.
	if line, err = c.uninstall(ctx); err != nil {
		return err
	}
	notes = append(notes, line)
	return nil
}

// install installs the chart on every node with the kubelet switch on (pleg-nri's metrics on the node's
// address when Prometheus scrapes them), waits for every pod of its DaemonSet, for every kubelet's event
// stream from pleg-nri and for every node Ready; it returns how long that took and each node's stream.
func (c *cluster) install(ctx context.Context) (time.Duration, map[string]streamState, error) {
	start := time.Now()
	repo, tag, ok := strings.Cut(c.o.plegNRIImage, ":")
	if !ok {
		return 0, nil, fmt.Errorf("-pleg-nri-image %q has no tag", c.o.plegNRIImage)
	}
	install := []string{"--kubeconfig", c.kubeconfig, "-n", "kube-system", "install", "pleg-nri", c.o.chart,
		"--set", "image.repository=" + repo, "--set-string", "image.tag=" + tag, "--set", "image.pullPolicy=Never",
		"--set", "kubelet.switchEndpoint=true", "--set", fmt.Sprintf("minReadySeconds=%d", rollMinReadySeconds),
		"--wait", "--timeout", "10m"}
	if c.o.prometheus != "" {
		// Prometheus scrapes each node's pleg-nri at the node's address (docs/operations.md).
		install = append(install, "--set", "config.metrics-address=0.0.0.0:9810")
	}
	if out, err := cmd(ctx, c.o.helm, install...); err != nil {
		return 0, nil, fmt.Errorf("helm install: %w\n%s", err, out)
	}
	// helm --wait counts a DaemonSet ready with maxUnavailable pods not ready: wait for every pod.
	if _, err := c.k(ctx, "-n", "kube-system", "rollout", "status", "daemonset/pleg-nri", "--timeout=10m"); err != nil {
		return 0, nil, fmt.Errorf("the pleg-nri DaemonSet did not roll out: %w", err)
	}
	installed := time.Since(start)
	fmt.Printf("e2e-cluster: helm install (pleg-nri on %d nodes, the kubelets switched): %s\n", len(c.nodes), installed.Round(time.Second))
	before := map[string]streamState{}
	for _, n := range c.nodes {
		st, err := c.waitStreaming(ctx, n)
		if err != nil {
			return 0, nil, err
		}
		before[n] = st
		fmt.Printf("e2e-cluster: %s: kubelet on pleg-nri with EventedPLEG: %s\n", n, st)
	}
	for _, n := range c.nodes {
		if _, err := c.k(ctx, "wait", "--for=condition=Ready", "node/"+n, "--timeout=180s"); err != nil {
			return 0, nil, fmt.Errorf("node %s is not Ready after the kubelet switch: %w", n, err)
		}
	}
	return installed, before, nil
}

// apply renders a manifest and applies it.
func (c *cluster) apply(ctx context.Context, t *template.Template, data any) error {
	s, err := render(t, data)
	if err != nil {
		return err
	}
	if err := c.applyText(ctx, s); err != nil {
		return fmt.Errorf("%s: %w", t.Name(), err)
	}
	return nil
}

// applyText applies a manifest.
func (c *cluster) applyText(ctx context.Context, manifest string) error {
	kc := exec.CommandContext(ctx, c.o.kubectl, "--kubeconfig", c.kubeconfig, "apply", "-f", "-")
	kc.Stdin = strings.NewReader(manifest)
	if out, err := kc.CombinedOutput(); err != nil {
		return fmt.Errorf("kubectl apply: %w\n%s", err, out)
	}
	return nil
}

// checkPodCIDRs checks every node got a podCIDR of its own from the pod subnet (the controller manager
// allocates them), and that nodenet routed every other node's podCIDR on each node.
func (c *cluster) checkPodCIDRs(ctx context.Context) ([]string, error) {
	out, err := c.k(ctx, "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.spec.podCIDR}={.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}`)
	if err != nil {
		return nil, err
	}
	cidr, ip := map[string]string{}, map[string]string{}
	seen := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Split(l, "=")
		if len(f) != 3 {
			continue
		}
		if f[1] == "" {
			return nil, fmt.Errorf("node %s has no podCIDR: is the controller manager allocating node CIDRs (kubeadm's networking.podSubnet)?", f[0])
		}
		if other, dup := seen[f[1]]; dup {
			return nil, fmt.Errorf("nodes %s and %s have the same podCIDR %s", other, f[0], f[1])
		}
		if !strings.HasPrefix(f[1], "10.244.") {
			return nil, fmt.Errorf("node %s's podCIDR %s is not in the pod subnet %s", f[0], f[1], podSubnet)
		}
		seen[f[1]] = f[0]
		cidr[f[0]], ip[f[0]] = f[1], f[2]
	}
	var list []string
	for _, n := range c.nodes {
		if cidr[n] == "" {
			return nil, fmt.Errorf("node %s is not in the cluster:\n%s", n, out)
		}
		list = append(list, n+"="+cidr[n])
		routes, err := c.onNode(ctx, n, "ip", "-4", "route", "show")
		if err != nil {
			return nil, err
		}
		for _, m := range c.nodes {
			if m == n {
				continue
			}
			if want := cidr[m] + " via " + ip[m]; !strings.Contains(routes, want) {
				return nil, fmt.Errorf("node %s has no route %s (nodenet):\n%s", n, want, routes)
			}
		}
	}
	fmt.Printf("e2e-cluster: pod CIDRs %s, each routed on the other nodes\n", strings.Join(list, " "))
	return list, nil
}

// checkService runs an HTTP server on the second worker and a client on the first: the client reaches
// the server's pod address (the pod network), then the Service's ClusterIP and its DNS name (kube-proxy,
// CoreDNS); the Service's only endpoint is the server, on the other worker.
func (c *cluster) checkService(ctx context.Context) (string, error) {
	server, client := c.nodes[2], c.nodes[1]
	if err := c.apply(ctx, serviceCheck, map[string]any{"ServerNode": server, "ClientNode": client, "Busybox": busybox}); err != nil {
		return "", err
	}
	for _, p := range []string{"server", "client"} {
		if _, err := c.k(ctx, "-n", "svc-check", "wait", "--for=condition=Ready", "pod/"+p, "--timeout=180s"); err != nil {
			return "", fmt.Errorf("the Service check's pod %s is not Ready: %w", p, err)
		}
	}
	podIP, err := c.k(ctx, "-n", "svc-check", "get", "pod", "server", "-o", "jsonpath={.status.podIP}")
	if err != nil {
		return "", err
	}
	clusterIP, err := c.k(ctx, "-n", "svc-check", "get", "service", "server", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		return "", err
	}
	eps, err := c.k(ctx, "-n", "svc-check", "get", "endpointslices", "-l", "kubernetes.io/service-name=server",
		"-o", `jsonpath={range .items[*].endpoints[*]}{.addresses[0]}@{.nodeName} {end}`)
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(eps) != podIP+"@"+server {
		return "", fmt.Errorf("the Service's endpoints are %q, want only the server %s on %s", eps, podIP, server)
	}
	// busybox's wget cannot resolve names (a static glibc binary: it crashes in name lookups, and with -T), its
	// nslookup has its own resolver: the name is checked with nslookup, the HTTP with addresses.
	var took []string
	for _, t := range []struct{ what, url, name string }{
		{what: "the server's pod address (pod network across nodes)", url: "http://" + podIP + ":8080/"},
		{what: "the Service's ClusterIP (kube-proxy)", url: "http://" + clusterIP + "/"},
		{what: "the Service's DNS name (CoreDNS behind its own Service)", name: "server.svc-check.svc.cluster.local"},
	} {
		start := time.Now()
		var last string
		err := testutil.PollEvery(ctx, 90*time.Second, time.Second, "the client on "+client+" to reach "+t.what, func() (bool, error) {
			if t.name != "" {
				out, err := c.k(ctx, "-n", "svc-check", "exec", "client", "--", "nslookup", t.name)
				last = out
				return err == nil && strings.Contains(out, clusterIP), err
			}
			out, err := c.k(ctx, "-n", "svc-check", "exec", "client", "--", "timeout", "5", "wget", "-q", "-O", "-", t.url)
			last = out
			return err == nil && strings.TrimSpace(out) == "server", err
		})
		if err != nil {
			return "", fmt.Errorf("%w (last answer: %q)", err, last)
		}
		took = append(took, fmt.Sprintf("%s%s in %s", t.url, t.name, time.Since(start).Round(100*time.Millisecond)))
	}
	s := fmt.Sprintf("Service check: a pod on %s reached the server on %s at %s", client, server, strings.Join(took, ", "))
	fmt.Println("e2e-cluster:", s)
	return s, nil
}

// streamState is a node's kubelet event stream as its metrics and pleg-nri's show it.
type streamState struct {
	connections, errors float64
	subscribers         int
}

// keeps says whether the stream is the one of b still: no error, no new connection, one subscriber.
func (s streamState) keeps(b streamState) bool {
	return s.errors == 0 && s.connections == b.connections && s.subscribers == 1
}

func (s streamState) String() string {
	return fmt.Sprintf("kubelet stream connections %v, errors %v; pleg-nri subscribers %d", s.connections, s.errors, s.subscribers)
}

// stream reads node's kubelet stream metrics (through the API server's node proxy) and pleg-nri's
// subscriber count (its metrics address, on the node).
func (c *cluster) stream(ctx context.Context, node string) (streamState, error) {
	var st streamState
	m, err := c.kubeletMetrics(ctx, node)
	if err != nil {
		return st, fmt.Errorf("reading the kubelet's metrics on %s: %w", node, err)
	}
	st.connections = metric(m, "kubelet_evented_pleg_connection_success_count")
	st.errors = metric(m, "kubelet_evented_pleg_connection_error_count")
	subs, err := c.onNode(ctx, node, "sh", "-c", "curl -fsS 127.0.0.1:9810/metrics | sed -n 's/^pleg_nri_subscribers //p'")
	if err != nil {
		return st, fmt.Errorf("reading pleg-nri's metrics on %s: %w", node, err)
	}
	if st.subscribers, err = strconv.Atoi(strings.TrimSpace(subs)); err != nil {
		return st, fmt.Errorf("pleg-nri's pleg_nri_subscribers on %s: %q", node, subs)
	}
	return st, nil
}

// kubeletMetrics is node's kubelet's /metrics, through the API server's node proxy.
func (c *cluster) kubeletMetrics(ctx context.Context, node string) (string, error) {
	return c.k(ctx, "get", "--raw", "/api/v1/nodes/"+node+"/proxy/metrics")
}

// waitStreaming checks node runs pleg-nri and its kubelet on pleg-nri's socket with EventedPLEG, and
// waits until the kubelet holds its event stream.
func (c *cluster) waitStreaming(ctx context.Context, node string) (streamState, error) {
	if st, err := c.onNode(ctx, node, "systemctl", "is-active", "pleg-nri"); err != nil || st != "active" {
		return streamState{}, fmt.Errorf("pleg-nri.service on %s is %q: %v", node, st, err)
	}
	kcfg, err := c.onNode(ctx, node, "cat", "/var/lib/kubelet/config.yaml")
	if err != nil {
		return streamState{}, err
	}
	if !strings.Contains(kcfg, "containerRuntimeEndpoint: unix:///run/pleg-nri/cri.sock") || !strings.Contains(kcfg, "EventedPLEG: true") {
		return streamState{}, fmt.Errorf("the kubelet on %s is not on pleg-nri's socket with EventedPLEG:\n%s", node, kcfg)
	}
	// The running kubelet's own flags, not only its file: it was restarted onto them.
	if ps, err := c.onNode(ctx, node, "sh", "-c", "tr '\\0' ' ' </proc/$(pgrep -o -x kubelet)/cmdline"); err != nil {
		return streamState{}, fmt.Errorf("the kubelet on %s is not running: %w", node, err)
	} else if strings.Contains(ps, "--container-runtime-endpoint") && !strings.Contains(ps, "/run/pleg-nri/cri.sock") {
		return streamState{}, fmt.Errorf("the kubelet on %s runs with another endpoint: %s", node, ps)
	}
	var st streamState
	err = testutil.PollEvery(ctx, 3*time.Minute, 2*time.Second, "the kubelet's event stream from pleg-nri on "+node, func() (bool, error) {
		var err error
		st, err = c.stream(ctx, node)
		return err == nil && st.connections >= 1 && st.subscribers == 1, err
	})
	if err != nil {
		return st, fmt.Errorf("%w: %s", err, st)
	}
	if st.errors != 0 {
		return st, fmt.Errorf("the kubelet on %s counted stream errors after install: %s", node, st)
	}
	return st, nil
}

// checkJobFailures fails on a Job pod whose container ran and failed. A pod the runtime could not
// start (reason StartError, exit code 128, never started: runc's "error setting cgroup config for
// procHooks process: unable to freeze" was seen on this loaded machine, as in kubernetes/kubernetes
// #131087) is the runtime's, not an event's, and the Job retries it (backoffLimit); each is printed.
func (c *cluster) checkJobFailures(ctx context.Context) error {
	out, err := c.k(ctx, "-n", "workloads", "get", "pods", "-l", "job-name", "-o",
		`jsonpath={range .items[?(@.status.phase=="Failed")]}{.metadata.name}{"\t"}{.spec.nodeName}{"\t"}{.status.containerStatuses[0].state.terminated.reason}{"\t"}{.status.containerStatuses[0].state.terminated.message}{"\n"}{end}`)
	if err != nil {
		return err
	}
	var failures []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		f := strings.SplitN(l, "\t", 4)
		for len(f) < 4 {
			f = append(f, "")
		}
		if f[2] != "StartError" {
			failures = append(failures, fmt.Sprintf("%s: Job pod %s failed (%s): %s", f[1], f[0], f[2], f[3]))
			continue
		}
		fmt.Printf("e2e-cluster: %s: Job pod %s was not started by the runtime (StartError: %s); the Job retried it\n", f[1], f[0], f[3])
	}
	if len(failures) > 0 {
		return errors.New(strings.Join(failures, "\n"))
	}
	return nil
}

// exitOrStartError accepts "<exit code> <reason>" with the exit code want, or a container the runtime
// could not start (reason StartError, exit code 128: runc's "unable to freeze" under this machine's
// load, kubernetes/kubernetes#131087), which is printed: the runtime's failure, not an event's; the
// exit code is still checked on the other nodes and at the other checks.
func exitOrStartError(node, want string) func(string) bool {
	return func(s string) bool {
		f := strings.Fields(s)
		if len(f) >= 1 && f[0] == want {
			return true
		}
		if len(f) == 2 && f[1] == "StartError" {
			fmt.Printf("e2e-cluster: %s: the crasher's last attempt was not started by the runtime (StartError, exit code %s), not an exit of its own\n", node, f[0])
			return true
		}
		return false
	}
}

// startErrors counts the attempts of pod's containers that the runtime failed to create or start:
// the kubelet's Failed events for it whose message is an OCI runtime failure, each as often as it
// repeated. On a kind node of cgroup v1 pressed for CPU, runc fails now and then with "unable to
// freeze" (its freezer, under load); the kubelet counts such an attempt as a restart.
func (c *cluster) startErrors(ctx context.Context, pod string) (int, error) {
	out, err := c.k(ctx, "-n", "workloads", "get", "events", "--field-selector", "involvedObject.name="+pod+",reason=Failed",
		"-o", `jsonpath={range .items[*]}{.count}{"\t"}{.message}{"\n"}{end}`)
	if err != nil {
		return 0, err
	}
	return countStartErrors(out), nil
}

// countStartErrors sums the counts of the lines ("<count>\t<message>") whose message is an OCI
// runtime's failure to create or start a container; a line without a count counts once.
func countStartErrors(events string) int {
	n := 0
	for _, line := range strings.Split(events, "\n") {
		count, msg, _ := strings.Cut(line, "\t")
		if !strings.Contains(msg, "OCI runtime create failed") && !strings.Contains(msg, "OCI runtime start failed") {
			continue
		}
		v, err := strconv.Atoi(count)
		if err != nil || v < 1 {
			v = 1
		}
		n += v
	}
	return n
}

// checkWorkloads waits for every node's workloads to show what they should.
func (c *cluster) checkWorkloads(ctx context.Context) error {
	atLeast := func(n int) func(string) bool {
		return func(s string) bool { v, err := strconv.Atoi(s); return err == nil && v >= n }
	}
	atMost := func(n int) func(string) bool {
		return func(s string) bool { v, err := strconv.Atoi(s); return err == nil && v <= n }
	}
	is := func(want string) func(string) bool { return func(s string) bool { return s == want } }
	for i, n := range c.nodes {
		// The Deployments' pods are made asynchronously: find them first.
		pods := map[string]string{}
		for _, app := range []string{"crasher", "web"} {
			name, err := c.waitValue(ctx, n+": the "+app+" pod to be created", fmt.Sprintf("pod -l app=%s,node=%d", app, i),
				"{.items[*].metadata.name}", func(s string) bool { return s != "" && !strings.Contains(s, " ") })
			if err != nil {
				return err
			}
			pods[app] = name
		}
		checks := []struct {
			what, target, jsonpath string
			ok                     func(string) bool
		}{
			{"the crasher to be restarted twice", "pod/" + pods["crasher"], "{.status.containerStatuses[0].restartCount}", atLeast(2)},
			{"the crasher's last exit code to be 3", "pod/" + pods["crasher"],
				"{.status.containerStatuses[0].lastState.terminated.exitCode} {.status.containerStatuses[0].lastState.terminated.reason}",
				exitOrStartError(n, "3")},
			{"web to be Ready", "pod/" + pods["web"], `{.status.conditions[?(@.type=="Ready")].status}`, is("True")},
			{"the Job to complete", fmt.Sprintf("job/job-%d", i), `{.status.conditions[?(@.type=="Complete")].status}`, is("True")},
			{"the probed pod to be Ready", fmt.Sprintf("pod/probes-%d", i), `{.status.conditions[?(@.type=="Ready")].status}`, is("True")},
			{"the liveness-failing container to be restarted", fmt.Sprintf("pod/liveness-%d", i), "{.status.containerStatuses[0].restartCount}", atLeast(1)},
			{"the never-ready pod to run", fmt.Sprintf("pod/unready-%d", i), "{.status.phase}", is("Running")},
		}
		for _, ck := range checks {
			if _, err := c.waitValue(ctx, n+": "+ck.what, ck.target, ck.jsonpath, ck.ok); err != nil {
				return err
			}
		}
		// What must not have happened. A node's restart restarts each of its containers once: that many
		// restarts are the node's, not a probe's.
		// An attempt the runtime failed to start counts as a restart too: it is the runtime's (runc
		// on a node pressed for CPU), printed, and allowed for that pod.
		reboots := c.reboots[n]
		restarts := func(pod string) (string, func(string) bool, error) {
			failed, err := c.startErrors(ctx, pod)
			if err != nil {
				return "", nil, err
			}
			if failed > 0 {
				fmt.Printf("e2e-cluster: %s: pod %s: %d attempts the runtime failed to start (runc create), each a restart not the event source's\n", n, pod, failed)
			}
			return fmt.Sprintf("at most %d (%d node restarts, %d failed starts)", reboots+failed, reboots, failed), atMost(reboots + failed), nil
		}
		type noRestart struct {
			what, target, jsonpath, want string
			ok                           func(string) bool
		}
		nots := []noRestart{
			{"the never-ready pod's Ready", fmt.Sprintf("pod/unready-%d", i), `{.status.conditions[?(@.type=="Ready")].status}`, "False", is("False")},
		}
		for _, r := range []struct{ what, pod string }{
			{"the never-ready pod's restarts", fmt.Sprintf("unready-%d", i)},
			{"the probed pod's restarts", fmt.Sprintf("probes-%d", i)},
			{"web's restarts", pods["web"]},
		} {
			want, ok, err := restarts(r.pod)
			if err != nil {
				return err
			}
			nots = append(nots, noRestart{r.what, "pod/" + r.pod, "{.status.containerStatuses[0].restartCount}", want, ok})
		}
		for _, ck := range nots {
			got, err := c.k(ctx, "-n", "workloads", "get", ck.target, "-o", "jsonpath="+ck.jsonpath)
			if err != nil {
				return err
			}
			if !ck.ok(got) {
				return fmt.Errorf("%s: %s is %q, want %s", n, ck.what, got, ck.want)
			}
		}
	}
	if err := c.checkJobFailures(ctx); err != nil {
		return err
	}
	// The web Service has one ready endpoint per node; a pod on every node reaches it.
	if err := testutil.PollEvery(ctx, 2*time.Minute, time.Second, "the web Service's endpoints on every node", func() (bool, error) {
		out, err := c.k(ctx, "-n", "workloads", "get", "endpointslices", "-l", "kubernetes.io/service-name=web",
			"-o", `jsonpath={range .items[*].endpoints[?(@.conditions.ready==true)]}{.nodeName} {end}`)
		if err != nil {
			return false, nil
		}
		got := strings.Fields(out)
		sort.Strings(got)
		want := append([]string(nil), c.nodes...)
		sort.Strings(want)
		return strings.Join(got, " ") == strings.Join(want, " "), nil
	}); err != nil {
		return err
	}
	clusterIP, err := c.k(ctx, "-n", "workloads", "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		return err
	}
	for i, n := range c.nodes {
		pod := fmt.Sprintf("probes-%d", i)
		var last string
		if err := testutil.PollEvery(ctx, time.Minute, time.Second, "a pod on "+n+" to reach the web Service", func() (bool, error) {
			out, err := c.k(ctx, "-n", "workloads", "exec", pod, "--", "timeout", "5", "wget", "-q", "-O", "-", "http://"+clusterIP+"/index.html")
			last = out
			if err != nil || !strings.HasPrefix(strings.TrimSpace(out), "web-") {
				return false, err
			}
			out, err = c.k(ctx, "-n", "workloads", "exec", pod, "--", "nslookup", "web.workloads.svc.cluster.local")
			last = out
			return err == nil && strings.Contains(out, clusterIP), err
		}); err != nil {
			return fmt.Errorf("%w (last answer: %q)", err, last)
		}
	}
	return nil
}

// waitValue polls `kubectl -n workloads get TARGET -o jsonpath=JSONPATH` until ok says yes (up to 4
// minutes) and returns the value; on a timeout the error has the last value and the namespace's pods.
func (c *cluster) waitValue(ctx context.Context, what, target, jsonpath string, ok func(string) bool) (string, error) {
	var last string
	err := testutil.PollEvery(ctx, 4*time.Minute, time.Second, what, func() (bool, error) {
		out, err := c.k(ctx, append(append([]string{"-n", "workloads", "get"}, strings.Fields(target)...), "-o", "jsonpath="+jsonpath)...)
		last = out
		return err == nil && ok(out), err
	})
	if err != nil {
		pods, _ := c.k(ctx, "-n", "workloads", "get", "pods", "-o", "wide")
		return last, fmt.Errorf("%w (last value %q)\n%s", err, last, pods)
	}
	return last, nil
}

var metricLine = map[string]*regexp.Regexp{}

// metric returns a metric's value in a Prometheus text exposition (0 when it is absent: a counter never
// incremented is not exposed).
func metric(text, name string) float64 {
	re, ok := metricLine[name]
	if !ok {
		re = regexp.MustCompile(`(?m)^` + name + `(?:\{[^}]*\})? ([0-9.e+]+)$`)
		metricLine[name] = re
	}
	m := re.FindStringSubmatch(text)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// diagnose prints what helps to understand a failure: the pods, the nodes' kubelet, pleg-nri and
// containerd logs.
func (c *cluster) diagnose(ctx context.Context) {
	if out, err := c.k(ctx, "get", "nodes,pods", "-A", "-o", "wide"); err == nil {
		fmt.Fprintf(os.Stderr, "---- kubectl get nodes,pods -A ----\n%s\n", out)
	}
	// The events say why a container restarted (a probe, a back-off, a kill) where 30 lines of a
	// kubelet's journal do not reach.
	if out, err := c.k(ctx, "get", "events", "-A", "--sort-by=.lastTimestamp"); err == nil {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) > 80 {
			lines = lines[len(lines)-80:]
		}
		fmt.Fprintf(os.Stderr, "---- kubectl get events -A (the last 80) ----\n%s\n", strings.Join(lines, "\n"))
	}
	for _, n := range c.nodes {
		for _, unit := range []string{"kubelet", "pleg-nri", "containerd"} {
			logs, _ := c.onNode(ctx, n, "journalctl", "--no-pager", "-n", "30", "-u", unit)
			fmt.Fprintf(os.Stderr, "---- %s: journalctl -u %s ----\n%s\n", n, unit, logs)
		}
	}
	if out, err := c.k(ctx, "-n", "kube-system", "logs", "-l", "app=nodenet", "--prefix", "--tail=20"); err == nil {
		fmt.Fprintf(os.Stderr, "---- nodenet ----\n%s\n", out)
	}
}

// delete deletes the cluster and checks that none of its containers or volumes is left.
func (c *cluster) delete(ctx context.Context) error {
	if err := kindrun.DeleteCluster(ctx, c.o.kind, c.o.name, c.kubeconfig); err != nil {
		return err
	}
	fmt.Printf("e2e-cluster: cluster %s deleted, nothing left\n", c.o.name)
	return nil
}

// cmd runs a command and returns its combined output.
var cmd = kindrun.Cmd

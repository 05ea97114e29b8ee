package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/conformance"
)

// TestConformanceKind (issue 61) runs `pleg-nri conformance` inside a kind node, where the chart
// installed pleg-nri and switched the kubelet to it: once against containerd's own socket and once
// against pleg-nri's endpoint, each with containerd restarted by systemd for the restart check (the
// node's real units and containerd configuration: the systemd cgroup driver), the kubelet stopped
// meanwhile (it would kill the suite's pods), and the slow consumer's 20 pods (160 events, past
// containerd's queue of 100 per subscriber, as the integration tests run it). pleg-nri must fail no
// check and skip neither the restart check nor the late subscriber; containerd's results are logged
// beside pleg-nri's, as a table for docs/conformance.md (also written to PLEG_NRI_CONFORMANCE_KIND_OUT
// if set). The cleanup is the suite's: no pod of either run is left on the node.
func TestConformanceKind(t *testing.T) {
	e := kindSetup(t)
	c := startKindCluster(t, e, "pleg-nri-conf-")
	n := &node{t: t, name: c.node}
	tag := imageTag(t, e.imageTar)
	repo, version, _ := strings.Cut(tag, ":")
	c.helm("install", "pleg-nri", chartDir(), "--set", "image.repository="+repo, "--set-string", "image.tag="+version, "--set", "image.pullPolicy=Never",
		"--set", "kubelet.switchEndpoint=true", "--wait", "--timeout", "5m")
	c.kubectl("-n", "kube-system", "rollout", "status", "daemonset/pleg-nri", "--timeout=5m")

	// The kubelet stops for the runs: its housekeeping kills every running pod it has not seen, as an
	// orphan, within a second or two (kubelet 1.37.2 pkg/kubelet/kubelet_pods.go, HandlePodCleanups:
	// "Clean up containers for orphaned pod we had not seen before"), and the suite's pods are such
	// pods. The node's pods go on running meanwhile; the kubelet starts again at the end.
	n.exec("systemctl", "stop", "kubelet")
	t.Cleanup(func() { n.exec("systemctl", "start", "kubelet") })

	endpoints := []struct{ name, endpoint string }{
		{"containerd 2.4.2", "unix:///run/containerd/containerd.sock"},
		{"pleg-nri", "unix://" + kindRunDir + "/cri.sock"},
	}
	reports := make([]conformance.Report, len(endpoints))
	for i, ep := range endpoints {
		start := time.Now()
		// The report on stdout, the command's log in a file: the JSON must parse whatever it logs.
		out, err := n.tryExec("sh", "-c", fmt.Sprintf("/usr/local/bin/pleg-nri conformance --runtime-endpoint %s --json "+
			"--runtime-stop-command 'systemctl stop containerd' --runtime-start-command 'systemctl start containerd' --slow-pods 20 "+
			"--timeout 8m 2>/tmp/conformance-%d.log", ep.endpoint, i))
		if jerr := json.Unmarshal([]byte(out), &reports[i]); jerr != nil {
			log, _ := n.tryExec("cat", fmt.Sprintf("/tmp/conformance-%d.log", i))
			t.Fatalf("conformance against %s: %v (exit: %v)\n%s\nits log:\n%s", ep.name, jerr, err, out, log)
		}
		t.Logf("conformance against %s (%s): %d passed, %d failed, %d skipped in %s (exit: %v)", ep.name, ep.endpoint,
			reports[i].Count(conformance.Pass), reports[i].Count(conformance.Fail), reports[i].Count(conformance.Skip),
			time.Since(start).Round(time.Second), err)
		if reports[i].Cleanup != "" {
			t.Errorf("%s: the suite's cleanup failed: %s", ep.name, reports[i].Cleanup)
		}
		if left := strings.TrimSpace(n.exec("sh", "-c", "crictl pods -q --label "+conformance.RunLabel+"="+reports[i].RunID)); left != "" {
			t.Errorf("%s: the run left pods on the node: %s", ep.name, left)
		}
	}
	for _, r := range reports[1].Results {
		if r.Outcome == conformance.Fail || r.Outcome == conformance.Skip && (r.ID == "runtime-restart" || r.ID == "late-subscriber") {
			t.Errorf("pleg-nri: %s: %s: %s (%s)", r.ID, r.Outcome, r.Failure, r.Name)
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "| check | %s | %s |\n| --- | --- | --- |\n", endpoints[0].name, endpoints[1].name)
	cell := func(r conformance.Result) string {
		s := string(r.Outcome)
		if r.Figure != "" {
			s += ": " + r.Figure
		}
		if r.Failure != "" {
			s += " (" + r.Failure + ")"
		}
		return strings.ReplaceAll(s, "|", `\|`)
	}
	for _, r := range reports[1].Results {
		other := "not run"
		for _, o := range reports[0].Results {
			if o.ID == r.ID {
				other = cell(o)
			}
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", r.ID, other, cell(r))
	}
	t.Logf("side by side in a kind node (Kubernetes 1.37.2, the kubelet switched to pleg-nri and stopped for the runs):\n%s", b.String())
	if out := os.Getenv("PLEG_NRI_CONFORMANCE_KIND_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

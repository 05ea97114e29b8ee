package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// npdImage is the image deploy/npd/npd-daemonset.yaml names. Without a registry the test builds it:
// make npd's node-problem-detector on the Debian base image of the tests (upstream's image is Debian
// based too), tagged with that name so that the shipped manifest is applied as it is.
const npdImage = "registry.k8s.io/node-problem-detector/node-problem-detector:v1.34.0"

// buildNPDImage builds npdImage from the node-problem-detector binary npd and returns a docker save
// tarball of it.
func buildNPDImage(t *testing.T, npd string) string {
	t.Helper()
	out, err := exec.Command("bash", filepath.Join(repoRoot(), "test", "images", "debian-base.sh")).Output()
	if err != nil {
		t.Fatalf("test/images/debian-base.sh: %v", err)
	}
	base := strings.TrimSpace(string(out))
	dir := t.TempDir()
	data, err := os.ReadFile(npd)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "node-problem-detector"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	dockerfile := "FROM " + base + "\nCOPY node-problem-detector /node-problem-detector\nENTRYPOINT [\"/node-problem-detector\"]\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	// The classic builder: it never asks a registry about the base image.
	build := exec.Command("docker", "build", "-q", "-t", npdImage, dir)
	build.Env = append(os.Environ(), "DOCKER_BUILDKIT=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("docker build %s: %v\n%s", npdImage, err, out)
	}
	tar := filepath.Join(dir, "npd.tar")
	run(t, "docker", "save", "-o", tar, npdImage)
	return tar
}

// nodeCondition is one condition of a node's status.
type nodeCondition struct {
	Type, Status, Reason, Message string
	LastTransitionTime            time.Time
}

// condition returns the node's condition of type typ, or false if it has none.
func (c *kindCluster) condition(typ string) (nodeCondition, bool) {
	c.t.Helper()
	var conds []nodeCondition
	if err := json.Unmarshal([]byte(c.kubectl("get", "node", c.node, "-o", "jsonpath={.status.conditions}")), &conds); err != nil {
		c.t.Fatal(err)
	}
	for _, cond := range conds {
		if cond.Type == typ {
			return cond, true
		}
	}
	return nodeCondition{}, false
}

// TestHelmKindNPD (issue 60) runs deploy/npd as an operator would, in a kind cluster with the chart
// installed (the kubelet switched to pleg-nri): the shipped monitor and script in a ConfigMap and the
// shipped DaemonSet, applied unchanged, with the real node-problem-detector (make npd, v1.34.0) in an
// image of that name. The node gets the condition PlegNRIUnhealthy False; with pleg-nri's core
// stopped it turns True with reason PlegNRINotServing and the failed check as its message (kubectl
// describe node shows it), and False again once the core is back. The times are from the fault and
// the repair to the condition's change in the API server, with the shipped 10 s check interval.
func TestHelmKindNPD(t *testing.T) {
	e := kindSetup(t)
	npd := os.Getenv("PLEG_NRI_NPD")
	if npd == "" {
		t.Fatal("PLEG_NRI_NPD is not set (make test-deploy-kind sets it to make npd's node-problem-detector)")
	}
	if _, err := os.Stat(npd); err != nil {
		t.Fatalf("no node-problem-detector (make npd): %v", err)
	}
	npdTar := buildNPDImage(t, npd)
	c := startKindCluster(t, e, "pleg-nri-npd-")
	n := &node{t: t, name: c.node}
	c.kindCmd("load", "image-archive", npdTar, "--name", c.name)
	tag := imageTag(t, e.imageTar)
	repo, version, _ := strings.Cut(tag, ":")
	c.helm("install", "pleg-nri", chartDir(), "--set", "image.repository="+repo, "--set-string", "image.tag="+version, "--set", "image.pullPolicy=Never",
		"--set", "kubelet.switchEndpoint=true", "--wait", "--timeout", "5m")
	c.kubectl("-n", "kube-system", "rollout", "status", "daemonset/pleg-nri", "--timeout=5m")

	npdDir := filepath.Join(repoRoot(), "deploy", "npd")
	c.kubectl("-n", "kube-system", "create", "configmap", "pleg-nri-npd",
		"--from-file="+filepath.Join(npdDir, "pleg-nri-monitor.json"), "--from-file="+filepath.Join(npdDir, "check-pleg-nri.sh"))
	// The test cluster has no kube-proxy (kindConfig: kubeProxyMode none), so the kubernetes Service's
	// address, which NPD's in-cluster client takes from KUBERNETES_SERVICE_HOST, leads nowhere: the
	// test points it at the API server itself (in its certificate: kubeadm's advertise address), the
	// one change to the shipped DaemonSet. A cluster with kube-proxy, or a CNI that replaces it, needs
	// nothing of the kind.
	apiserver := strings.TrimSpace(c.kubectl("get", "node", c.name+"-control-plane", "-o", `jsonpath={.status.addresses[?(@.type=="InternalIP")].address}`))
	manifest, err := os.ReadFile(filepath.Join(npdDir, "npd-daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const nodeNameEnv = "                  fieldPath: spec.nodeName\n"
	if !strings.Contains(string(manifest), nodeNameEnv) {
		t.Fatalf("deploy/npd/npd-daemonset.yaml has no NODE_NAME env from spec.nodeName")
	}
	patched := filepath.Join(t.TempDir(), "npd-daemonset.yaml")
	if err := os.WriteFile(patched, []byte(strings.Replace(string(manifest), nodeNameEnv, nodeNameEnv+
		"            - name: KUBERNETES_SERVICE_HOST\n              value: \""+apiserver+"\"\n"+
		"            - name: KUBERNETES_SERVICE_PORT\n              value: \"6443\"\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	c.kubectl("apply", "-f", patched)
	c.kubectl("-n", "kube-system", "rollout", "status", "daemonset/pleg-nri-npd", "--timeout=3m")
	t.Logf("NPD's pods: %s", c.kubectl("-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=pleg-nri-npd", "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.metadata.creationTimestamp} {.status.phase} {.spec.containers[0].env}{"\n"}{end}`))

	const bound = time.Minute
	// waitCondition polls the node's PlegNRIUnhealthy until it has status and returns it and how long
	// that took from since.
	waitCondition := func(status string, since time.Time) (nodeCondition, time.Duration) {
		t.Helper()
		var got nodeCondition
		if err := pollDetail(bound, 250*time.Millisecond, "PlegNRIUnhealthy "+status, func() (bool, string) {
			cond, ok := c.condition("PlegNRIUnhealthy")
			got = cond
			return ok && cond.Status == status, fmt.Sprintf("%+v (the NPD pod's log: %.1500s)", cond, c.kubectl("-n", "kube-system", "logs", "daemonset/pleg-nri-npd", "--tail", "20"))
		}); err != nil {
			t.Fatal(err)
		}
		return got, time.Since(since)
	}

	cond, took := waitCondition("False", time.Now())
	if cond.Reason != "PlegNRIServing" || cond.Message != "pleg-nri serves this node" {
		t.Errorf("PlegNRIUnhealthy False with reason %q, message %q; want PlegNRIServing, \"pleg-nri serves this node\"", cond.Reason, cond.Message)
	}
	t.Logf("PlegNRIUnhealthy False %s after the NPD DaemonSet rolled out", took.Round(100*time.Millisecond))

	stopped := time.Now()
	n.exec("systemctl", "stop", "pleg-nri.service")
	cond, raised := waitCondition("True", stopped)
	if cond.Reason != "PlegNRINotServing" || !strings.Contains(cond.Message, "FAIL") {
		t.Errorf("PlegNRIUnhealthy True with reason %q, message %q; want PlegNRINotServing and the failed check", cond.Reason, cond.Message)
	}
	if !cond.LastTransitionTime.IsZero() && cond.LastTransitionTime.Before(stopped.Add(-time.Second).Truncate(time.Second)) {
		t.Errorf("PlegNRIUnhealthy True since %s, before the core was stopped at %s", cond.LastTransitionTime, stopped)
	}
	describe := c.kubectl("describe", "node", c.node)
	if !strings.Contains(describe, "PlegNRIUnhealthy") || !strings.Contains(describe, "PlegNRINotServing") {
		t.Errorf("kubectl describe node does not show the condition:\n%s", describe)
	}
	t.Logf("core stopped: PlegNRIUnhealthy True after %s: %s", raised.Round(100*time.Millisecond), cond.Message)

	started := time.Now()
	n.exec("systemctl", "start", "pleg-nri.service")
	cond, cleared := waitCondition("False", started)
	if cond.Reason != "PlegNRIServing" {
		t.Errorf("PlegNRIUnhealthy False with reason %q after the repair, want PlegNRIServing", cond.Reason)
	}
	t.Logf("TestHelmKindNPD: core stopped: PlegNRIUnhealthy True after %s; started again: False after %s (shipped invoke_interval 10s)",
		raised.Round(100*time.Millisecond), cleared.Round(100*time.Millisecond))

	c.kubectl("delete", "-f", filepath.Join(npdDir, "npd-daemonset.yaml"), "--wait")
	c.kubectl("-n", "kube-system", "delete", "configmap", "pleg-nri-npd")
	c.helm("uninstall", "pleg-nri", "--wait", "--timeout", "5m")
}

package deploy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

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

// TestHelmKind installs the chart into a kind cluster (Kubernetes 1.37.2) with the kubelet switch on,
// checks the kubelet runs on pleg-nri with its event stream, upgrades to another image (the kubelet's
// fast path is still on after it), and uninstalls (the kubelet is back on containerd, pleg-nri gone).
func TestHelmKind(t *testing.T) {
	e := kindSetup(t)
	tmp := t.TempDir()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "pleg-nri-helm-" + hex.EncodeToString(b)
	node := name + "-control-plane"
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
	start := time.Now()
	// kind makes the docker network "kind" and never removes it: the test removes it if it made it.
	removeNetwork := kindrun.KindNetwork(context.Background())
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := tryRun("docker", "exec", node, "sh", "-c", "journalctl --no-pager -n 80 -u pleg-nri -u kubelet")
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
	kubectl := func(args ...string) string {
		t.Helper()
		return run(t, e.kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	}
	helm := func(args ...string) string {
		t.Helper()
		return run(t, e.helm, append([]string{"--kubeconfig", kubeconfig, "-n", "kube-system"}, args...)...)
	}
	onNode := func(args ...string) string {
		t.Helper()
		return run(t, "docker", append([]string{"exec", node}, args...)...)
	}

	// The image, and an upgrade of it (another version of the binary).
	tag := imageTag(t, e.imageTar)
	kindCmd("load", "image-archive", e.imageTar, "--name", name)
	upTar := filepath.Join(tmp, "upgrade.tar")
	build := exec.Command("bash", filepath.Join(repoRoot(), "deploy", "image", "build.sh"), "pleg-nri:kind-upgrade", upTar)
	build.Env = append(os.Environ(), "VERSION=kind-upgrade")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the upgrade image: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = tryRun("docker", "rmi", "pleg-nri:kind-upgrade") })
	kindCmd("load", "image-archive", upTar, "--name", name)
	repo, version, _ := strings.Cut(tag, ":")

	// Install, switching the kubelet.
	start = time.Now()
	helm("install", "pleg-nri", chartDir(), "--set", "image.repository="+repo, "--set", "image.tag="+version,
		"--set", "image.pullPolicy=Never", "--set", "kubelet.switchEndpoint=true", "--wait", "--timeout", "5m")
	// helm --wait counts a DaemonSet ready with maxUnavailable pods not ready: wait for every pod.
	kubectl("-n", "kube-system", "rollout", "status", "daemonset/pleg-nri", "--timeout=5m")
	t.Logf("helm install (pleg-nri ready, the kubelet switched): %s", time.Since(start).Round(time.Second))
	if st := strings.TrimSpace(onNode("systemctl", "is-active", "pleg-nri")); st != "active" {
		t.Fatalf("pleg-nri.service on the node: %s", st)
	}
	if kcfg := onNode("cat", "/var/lib/kubelet/config.yaml"); !strings.Contains(kcfg, "containerRuntimeEndpoint: unix:///run/pleg-nri/cri.sock") || !strings.Contains(kcfg, "EventedPLEG: true") {
		t.Fatalf("the kubelet's configuration:\n%s", kcfg)
	}
	streaming := func() (bool, string) {
		ok, errs := kubeletMetric(t, kubectl, node, "kubelet_evented_pleg_connection_success_count"),
			kubeletMetric(t, kubectl, node, "kubelet_evented_pleg_connection_error_count")
		subs := strings.TrimSpace(onNode("sh", "-c", "curl -s 127.0.0.1:9810/metrics | sed -n 's/^pleg_nri_subscribers //p'"))
		return ok >= 1 && errs < 5 && subs == "1", "kubelet stream connections " + strconv.FormatFloat(ok, 'f', -1, 64) +
			", errors " + strconv.FormatFloat(errs, 'f', -1, 64) + ", pleg-nri subscribers " + subs
	}
	if err := pollDetail(3*time.Minute, 2*time.Second, "the kubelet's event stream from pleg-nri after install", streaming); err != nil {
		t.Fatal(err)
	}
	kubectl("wait", "--for=condition=Ready", "node/"+node, "--timeout=3m")
	connBefore := kubeletMetric(t, kubectl, node, "kubelet_evented_pleg_connection_success_count")

	// Upgrade to the other image: the new binary runs, the kubelet stays switched and streaming.
	start = time.Now()
	helm("upgrade", "pleg-nri", chartDir(), "--reuse-values", "--set", "image.tag=kind-upgrade", "--wait", "--timeout", "5m")
	kubectl("-n", "kube-system", "rollout", "status", "daemonset/pleg-nri", "--timeout=5m")
	t.Logf("helm upgrade: %s", time.Since(start).Round(time.Second))
	// The binary on the node, and the core that serves (the front is kept across the upgrade).
	if v := onNode("/usr/local/bin/pleg-nri", "version"); !strings.HasPrefix(v, "pleg-nri kind-upgrade\n") || !strings.Contains(v, ", version kind-upgrade\n") {
		t.Errorf("after the upgrade the node runs %q", v)
	}
	if kcfg := onNode("cat", "/var/lib/kubelet/config.yaml"); !strings.Contains(kcfg, "containerRuntimeEndpoint: unix:///run/pleg-nri/cri.sock") {
		t.Errorf("the upgrade switched the kubelet back:\n%s", kcfg)
	}
	// The kubelet's fast path must still be on, its stream never ended: pleg-nri's front, which serves
	// the kubelet's socket, outlives the restart of pleg-nri (docs/restarts.md), so the kubelet counted no
	// stream error and did not connect again (chart default: no kubelet restart).
	if err := pollDetail(time.Minute, 2*time.Second, "the kubelet's event stream after the upgrade", streaming); err != nil {
		t.Error(err)
	}
	errs := kubeletMetric(t, kubectl, node, "kubelet_evented_pleg_connection_error_count")
	connAfter := kubeletMetric(t, kubectl, node, "kubelet_evented_pleg_connection_success_count")
	t.Logf("after the upgrade: kubelet stream connections %v -> %v, errors %v (it gives up at 5)", connBefore, connAfter, errs)
	if errs != 0 || connAfter != connBefore {
		t.Errorf("the upgrade ended the kubelet's event stream: connections %v -> %v, errors %v, want unchanged and 0",
			connBefore, connAfter, errs)
	}

	// Uninstall: the kubelet back on containerd first, then pleg-nri gone.
	start = time.Now()
	helm("uninstall", "pleg-nri", "--wait", "--timeout", "5m")
	t.Logf("helm uninstall: %s", time.Since(start).Round(time.Second))
	kcfg := onNode("cat", "/var/lib/kubelet/config.yaml")
	if !strings.Contains(kcfg, "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock") || strings.Contains(kcfg, "EventedPLEG") {
		t.Errorf("the kubelet's configuration after uninstall:\n%s", kcfg)
	}
	if out, err := tryRun("docker", "exec", node, "systemctl", "cat", "pleg-nri.service"); err == nil {
		t.Errorf("pleg-nri.service is still on the node:\n%s", out)
	}
	kubectl("wait", "--for=condition=Ready", "node/"+node, "--timeout=3m")
}

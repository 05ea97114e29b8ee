package containerdit

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// repoRoot is the repository's root directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// run runs a command and fails the test with its output if it fails.
func runCmd(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestImage loads the image of `make image` (PLEG_NRI_IMAGE_TAR, set by make integration and make test-deploy) into docker
// and into the harness's containerd with `ctr images import`, and runs `pleg-nri version` from it in
// both: as a docker container, and as a CRI container of a pod.
func TestImage(t *testing.T) {
	tarball := os.Getenv("PLEG_NRI_IMAGE_TAR")
	if tarball == "" {
		t.Skip("SKIP (loud): PLEG_NRI_IMAGE_TAR is not set: make integration and make test-deploy build the image first and set it")
	}
	logOnFailure(t)
	var manifest []struct{ RepoTags []string }
	tmp := t.TempDir()
	runCmd(t, tmp, "tar", "-xf", tarball, "manifest.json")
	data, err := os.ReadFile(filepath.Join(tmp, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &manifest); err != nil || len(manifest) != 1 || len(manifest[0].RepoTags) != 1 {
		t.Fatalf("manifest.json of %s: %v %s", tarball, err, data)
	}
	tag := manifest[0].RepoTags[0]
	// Its first line is the binary's; the running core's and front's follow, if any.
	version, _, _ := strings.Cut(runCmd(t, "", plegNRIBinary, "version"), "\n")
	version = strings.TrimPrefix(version, "pleg-nri ")

	// docker load, then run it.
	_ = exec.Command("docker", "rmi", "-f", tag).Run()
	if out := runCmd(t, "", "docker", "load", "-i", tarball); !strings.Contains(out, tag) {
		t.Errorf("docker load: %s", out)
	}
	out := strings.TrimSpace(runCmd(t, "", "docker", "run", "--rm", "--network", "none", tag, "version"))
	if !strings.HasPrefix(out, "pleg-nri ") || out == "pleg-nri dev" {
		t.Errorf("docker run %s version: %q", tag, out)
	}
	t.Logf("docker run %s version: %s (the test's own build: %s)", tag, out, version)
	// What the Helm chart's pods run: the node agent and the host files, with a shell.
	runCmd(t, "", "docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", tag, "-c",
		"test -x /opt/pleg-nri/node.sh && test -x /opt/pleg-nri/install.sh && test -f /opt/pleg-nri/systemd/pleg-nri.service && "+
			"test -f /opt/pleg-nri/systemd/kubelet.service.d/10-pleg-nri.conf && test -f /opt/pleg-nri/nri/10-pleg-nri.conf && "+
			"test -f /opt/pleg-nri/config.yaml && nsenter --help 2>&1 | grep -q Usage && nc --help 2>&1 | grep -q Usage")

	// ctr images import into the harness's containerd, then a CRI container from it.
	ref := "docker.io/library/" + tag
	imp := runCmd(t, "", filepath.Join(env.BinDir, "ctr"), "--address", env.Address, "-n", "k8s.io", "images", "import", tarball)
	t.Logf("ctr images import: %s", strings.TrimSpace(imp))
	t.Cleanup(func() {
		_ = exec.Command(filepath.Join(env.BinDir, "ctr"), "--address", env.Address, "-n", "k8s.io", "images", "rm", ref).Run()
	})
	c := newCRI(t, env.Address)
	podID, podCfg := c.runPod("image")
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "version"},
		Image:    &runtimeapi.ImageSpec{Image: ref},
		Args:     []string{"version"},
		LogPath:  "version.log",
		Linux:    &runtimeapi.LinuxContainerConfig{},
	}
	ctr := c.create(podID, podCfg, cfg)
	c.start(ctr)
	st := c.waitState(ctr, runtimeapi.ContainerState_CONTAINER_EXITED)
	if st.ExitCode != 0 {
		t.Errorf("pleg-nri version in the image exited %d", st.ExitCode)
	}
	logData, err := os.ReadFile(filepath.Join(podCfg.LogDirectory, "version.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logData), " stdout F "+out+"\n") {
		t.Errorf("the CRI container's log %q, want the line %q", logData, out)
	}
}

// TestMakeInstallPreregistered runs `make install INSTALL_MODE=nri PREFIX=<temp>` and checks the
// pre-registered layout it makes; those files, put in the harness containerd's plugin_path and
// plugin_config_path, then run pre-registered: containerd launches and configures the installed
// binary, which serves events.
func TestMakeInstallPreregistered(t *testing.T) {
	logOnFailure(t)
	root := repoRoot(t)
	prefix := t.TempDir()
	dir := t.TempDir()
	conf := filepath.Join(dir, "test.conf")
	socket, metrics := filepath.Join(dir, "cri.sock"), freeLoopbackAddr(t)
	confText := fmt.Sprintf("listen: unix://%s\nmetrics-address: %s\ncontainerd-address: %s\nruntime-endpoint: unix://%s\nnri-socket: %s\nstate-dir: %s\n",
		socket, metrics, env.Address, env.Address, env.NRISocket, filepath.Join(dir, "state"))
	if err := os.WriteFile(conf, []byte(confText), 0o644); err != nil {
		t.Fatal(err)
	}
	out := runCmd(t, root, "make", "-s", "install", "INSTALL_MODE=nri", "PREFIX="+prefix, "INSTALL_CONFIG="+conf)
	t.Logf("make install:\n%s", out)
	plugin, pconf := filepath.Join(prefix, "opt/nri/plugins/10-pleg-nri"), filepath.Join(prefix, "etc/nri/conf.d/10-pleg-nri.conf")
	var files []string
	_ = filepath.Walk(prefix, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			files = append(files, strings.TrimPrefix(p, prefix))
		}
		return nil
	})
	if strings.Join(files, " ") != "/etc/nri/conf.d/10-pleg-nri.conf /opt/nri/plugins/10-pleg-nri" {
		t.Errorf("make install INSTALL_MODE=nri made %v", files)
	}
	if fi, err := os.Stat(plugin); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("plugin %s: %v %v", plugin, fi, err)
	}
	// The defaults, without INSTALL_CONFIG, into another prefix: the shipped pre-registered config.
	prefix2 := t.TempDir()
	runCmd(t, root, "make", "-s", "install", "INSTALL_MODE=nri", "PREFIX="+prefix2)
	shipped, _ := os.ReadFile(filepath.Join(root, "deploy/nri/10-pleg-nri.conf"))
	if got, _ := os.ReadFile(filepath.Join(prefix2, "etc/nri/conf.d/10-pleg-nri.conf")); string(got) != string(shipped) {
		t.Errorf("the default pre-registered config is not deploy/nri/10-pleg-nri.conf:\n%s", got)
	}
	runCmd(t, root, "make", "-s", "uninstall", "INSTALL_MODE=nri", "PREFIX="+prefix2)
	if _, err := os.Stat(filepath.Join(prefix2, "opt/nri/plugins/10-pleg-nri")); !os.IsNotExist(err) {
		t.Errorf("make uninstall left the plugin: %v", err)
	}

	// The installed files, pre-registered with the harness's containerd.
	data, err := os.ReadFile(plugin)
	if err != nil {
		t.Fatal(err)
	}
	cdata, err := os.ReadFile(pconf)
	if err != nil {
		t.Fatal(err)
	}
	ev, _ := runPreRegistered(t, data, string(cdata), socket, metrics)
	if ev == nil {
		t.Fatal("no event through the installed pre-registered plugin")
	}
}

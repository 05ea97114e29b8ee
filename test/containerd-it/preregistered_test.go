package containerdit

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// TestPreRegistered: pleg-nri installed as containerd's pre-registered plugin (10-pleg-nri in its
// plugin_path, its config in plugin_config_path) is launched by containerd, configured through NRI's
// Configure, serves its CRI endpoint from that config, and streams events.
func TestPreRegistered(t *testing.T) {
	logOnFailure(t)
	dir, err := os.MkdirTemp("", "plegnri-pre-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket, metrics := filepath.Join(dir, "cri.sock"), freeLoopbackAddr(t)
	conf := fmt.Sprintf("listen: unix://%s\nmetrics-address: %s\ncontainerd-address: %s\nruntime-endpoint: unix://%s\nnri-socket: %s\nstate-dir: %s\nlog-level: debug\n",
		socket, metrics, env.Address, env.Address, env.NRISocket, filepath.Join(dir, "state"))
	data, err := os.ReadFile(plegNRIBinary)
	if err != nil {
		t.Fatal(err)
	}
	runPreRegistered(t, data, conf, socket, metrics)
}

// runPreRegistered installs binary as the harness containerd's pre-registered plugin 10-pleg-nri with
// conf as its configuration, restarts containerd (which launches it), waits for its /readyz on
// metrics, and checks a container's STOPPED reaches its CRI endpoint at socket; it returns that event.
func runPreRegistered(t *testing.T, data []byte, conf, socket, metrics string) *runtimeapi.ContainerEventResponse {
	t.Helper()
	pluginPath := filepath.Join(env.NRIPluginDir, "10-pleg-nri")
	confPath := filepath.Join(env.NRIConfDir, "10-pleg-nri.conf")
	if err := os.WriteFile(pluginPath, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Remove(pluginPath)
		os.Remove(confPath)
		// containerd never stops a pre-registered plugin: end it like an operator would.
		for _, pid := range pidsOf(pluginPath) {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
	})
	// containerd launches pre-registered plugins when it starts.
	if err := env.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	err := harness.WaitFor(context.Background(), 20*time.Second, "the pre-registered pleg-nri's /readyz", func() (bool, error) {
		resp, err := http.Get("http://" + metrics + "/readyz")
		if err != nil {
			return false, err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("%s", strings.TrimSpace(string(body)))
	})
	if err != nil {
		t.Fatal(err)
	}
	if pids := pidsOf(pluginPath); len(pids) != 1 {
		t.Fatalf("pre-registered pleg-nri processes: %v, want exactly one launched by containerd", pids)
	}
	ours := recordEvents(t, socket)
	c := newCRI(t, socket)
	podID, podCfg := c.runPod("prereg")
	ctr := c.create(podID, podCfg, containerConfig("app", "exit 4"))
	c.start(ctr)
	ev := ours.wait(t, ctr, evStopped)
	if st := statusOf(ev, ctr); st.GetExitCode() != 4 {
		t.Errorf("STOPPED status through the pre-registered plugin: %v", st)
	}
	c.stopPod(podID)
	c.removePod(podID)
	ours.wait(t, podID, evDeleted)
	return ev
}

// pidsOf lists the live processes whose executable is path.
func pidsOf(path string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && exe == path {
			pids = append(pids, pid)
		}
	}
	return pids
}

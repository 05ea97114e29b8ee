package containerdit

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/pleg"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/plegnri"
)

// TestPreRegistered: pleg-nri installed as containerd's pre-registered plugin (10-pleg-nri in its
// plugin_path, its config in plugin_config_path) is launched by containerd, configured through NRI's
// Configure, serves its CRI endpoint from that config (through the front it starts), and streams
// events. Then containerd restarts, three ways: stopped, with the plugin killed as NRI's Adaptation.Stop
// does (SIGKILL of the plugin's process, not of its group; a unit with KillMode=control-group would kill
// the whole cgroup, front included: see docs/restarts.md); stopped, the plugin left running (containerd
// 2.4 does not stop its plugins at shutdown: the plugin reconnects to the NRI socket, and the one the
// new containerd launches finds it and exits); and SIGKILLed. Each time a container exits while
// containerd is down; the subscriber's stream, opened before, stays open, gets that exit's STOPPED, and
// at the end holds each transition of the test's pods exactly once; the front is the same process all
// along.
func TestPreRegistered(t *testing.T) {
	logOnFailure(t)
	dir := testutil.ShortTempDir(t, "plegnri-pre-")
	socket, metrics := filepath.Join(dir, "cri.sock"), freeLoopbackAddr(t)
	conf := fmt.Sprintf("listen: unix://%s\nmetrics-address: %s\ncontainerd-address: %s\nruntime-endpoint: unix://%s\nnri-socket: %s\nstate-dir: %s\nlog-level: debug\n",
		socket, metrics, env.Address, env.Address, env.NRISocket, filepath.Join(dir, "state"))
	data, err := os.ReadFile(plegNRIBinary)
	if err != nil {
		t.Fatal(err)
	}
	_, ours := runPreRegistered(t, data, conf, socket, metrics)
	pluginPath := filepath.Join(env.NRIPluginDir, "10-pleg-nri")
	front, err := plegnri.FrontPID(dir)
	if err != nil {
		t.Fatal(err)
	}
	cores := func() []int { return slices.DeleteFunc(pidsOf(pluginPath), func(pid int) bool { return pid == front }) }
	if pids := cores(); len(pids) != 1 {
		t.Fatalf("pre-registered pleg-nri processes besides the front (%d): %v, want exactly one launched by containerd", front, pids)
	}
	if pgid, _ := syscall.Getpgid(front); pgid != front {
		t.Errorf("the front (pid %d) is in process group %d, want its own", front, pgid)
	}
	// containerd restarts; the stream goes on.
	prefix := "prereg-gap-" + randomSuffix()
	direct := newFastCRI(t)
	gapPod, gapCfg := direct.runPod(prefix)
	t.Cleanup(func() { removeTestPods(t, direct.rt, prefix) })
	for i, how := range []string{"stop, plugin killed", "stop", "kill"} {
		old := cores()
		gap := direct.create(gapPod, gapCfg, containerConfig(fmt.Sprintf("gap-%d", i), "sleep 3600"))
		direct.start(gap)
		pid := containerPid(t, gap)
		// The core may be SIGKILLed: once its checkpoint holds the new container running, nothing of
		// it is sent again (before, CREATED and STARTED would be, at-least-once).
		waitCheckpoint(t, filepath.Join(dir, "state", "checkpoint"), gap, pleg.PhaseRunning)
		stop := env.Stop
		if how == "kill" {
			stop = env.Kill
		}
		if err := stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if how == "stop, plugin killed" {
			for _, pid := range old {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		// The container exits while containerd is down.
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill the gap container's process %d: %v", pid, err)
		}
		time.Sleep(500 * time.Millisecond)
		if err := env.Start(context.Background()); err != nil {
			t.Fatalf("%s: %v", how, err)
		}
		ev := ours.wait(t, gap, evStopped)
		// containerd reports an exit it did not see (it was down) as 255, reason Unknown.
		if st := statusOf(ev, gap); st.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Errorf("%s: STOPPED of the container that exited while containerd was down: %v", how, st)
		}
		if err := ours.Err(); err != nil {
			t.Fatalf("%s: the stream ended: %v", how, err)
		}
		if now, err := plegnri.FrontPID(dir); err != nil || now != front {
			t.Fatalf("%s: the front is %d (%v), was %d", how, now, err, front)
		}
		// One core runs (the old one reconnected, or the new one containerd launched).
		err := harness.WaitFor(context.Background(), 20*time.Second, "one pleg-nri core", func() (bool, error) {
			return len(cores()) == 1, fmt.Errorf("cores: %v", cores())
		})
		if err != nil {
			t.Fatalf("%s: %v", how, err)
		}
		t.Logf("containerd %s: cores before %v, after %v; front %d", how, old, cores(), front)
	}
	rs := func() runtimeState { return readRuntime(t, prefix, nil) }
	rec := func() map[string]map[runtimeapi.ContainerEventType]int { return counts(ours.Events(), prefix) }
	if problems := waitLives(t, rec, rs, true, nil); len(problems) > 0 {
		t.Errorf("the stream against containerd's final state (%d problems):\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
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

// waitCheckpoint waits until the checkpoint at path holds object id at phase want or beyond.
func waitCheckpoint(t *testing.T, path, id string, want pleg.Phase) {
	t.Helper()
	err := harness.WaitFor(context.Background(), 10*time.Second, "the checkpoint to hold "+short(id), func() (bool, error) {
		ck, err := pleg.ReadCheckpoint(path)
		if err != nil {
			return false, err
		}
		for _, o := range ck.Objects {
			if o.ID == id && o.Phase >= want {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// runPreRegistered installs data as the harness containerd's pre-registered plugin 10-pleg-nri with conf as
// its configuration, restarts containerd (which launches it), waits for its /readyz on metrics, and checks
// that a container's STOPPED reaches its CRI endpoint at socket (served by the front it starts, whose run
// directory is socket's). It returns that event and the recorder of the stream. The cleanup stops the
// plugin's processes and its front, and fails the test if one is left.
func runPreRegistered(t *testing.T, data []byte, conf, socket, metrics string) (*runtimeapi.ContainerEventResponse, *eventRecorder) {
	t.Helper()
	dir := filepath.Dir(socket)
	pluginPath := filepath.Join(env.NRIPluginDir, "10-pleg-nri")
	confPath := filepath.Join(env.NRIConfDir, "10-pleg-nri.conf")
	if err := os.WriteFile(pluginPath, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Stop them before removing the binary: /proc/PID/exe of a removed file reads "... (deleted)".
		// containerd never stops a pre-registered plugin: end it like an operator would, front included.
		for _, pid := range pidsOf(pluginPath) {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
		if err := plegnri.StopFrontIn(dir); err != nil {
			t.Error(err)
		}
		// What is left after 10 s fails the test below.
		_ = harness.WaitFor(context.Background(), 10*time.Second, "the plugin's processes to end", func() (bool, error) {
			return len(pidsOf(pluginPath)) == 0, nil
		})
		if left := pidsOf(pluginPath); len(left) > 0 {
			for _, pid := range left {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Errorf("pre-registered pleg-nri processes left (killed): %v", left)
		}
		os.Remove(pluginPath)
		os.Remove(confPath)
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "front.log"))
			t.Logf("front log:\n%s", b)
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
	return ev, ours
}

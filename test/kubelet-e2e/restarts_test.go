package kubelete2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/internal/testutil/plegnribin"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
)

// gapPod is a pod whose one container "waiter" exits 7 once the test drops a file named exit in the
// pod's emptyDir, then runs on after its restart (a container restarted for the first time is not
// backed off by the kubelet: each step of the test needs a pod of its own).
func gapPod(name string) kubelet.Pod {
	return kubelet.Pod{Name: name, Containers: []kubelet.Container{{Name: "waiter", State: true, Script: `[ -e /state/done ] && exec sleep 3600
while [ ! -e /state/exit ]; do sleep 0.05; done; touch /state/done; exit 7`}}}
}

// restartLagLimit tells the event path from the kubelet's fallback: after pleg-nri or containerd is
// back, the kubelet must have received the STOPPED of the container that exited while it was down, and
// restarted it, within it. Without the event a 1.35/1.36 kubelet notices at its next relist, up to 300 s
// later with EventedPLEG on; the event path takes well under a second on a quiet machine (medians 39-215
// ms, docs/restarts.md) and 1.2 s was seen at a load of 10 with two suites on two cores. How soon is a
// figure the test logs (restart lags, per step), not a bound it asserts: a 1 s bound failed under load.
// On 1.37, which relists every second anyway, the receipt of the STOPPED in the kubelet's log is what
// tells the event path.
const restartLagLimit = 30 * time.Second

// kubeletCacheWait is how long a 1.35 or 1.36 kubelet's pod worker can hold a sync after an event that
// arrived while it was syncing the pod: the next sync waits for a cache entry newer than the end of
// the one in progress (podCache.GetNewerThan(uid, lastSyncTime), pkg/kubelet/pod_workers.go), the
// event's entry is older, and only the evented PLEG's global cache timestamp, renewed every 5 s
// (globalCacheUpdatePeriod, pkg/kubelet/pleg/evented.go), releases it. Any event source meets this;
// 1.37 renews the cache with its relists every second.
const kubeletCacheWait = 5 * time.Second

// TestRestartsKeepFastPath restarts pleg-nri 5 times (SIGTERM, SIGKILL, an upgrade to a different
// binary and back) and containerd 5 times (SIGTERM, SIGKILL) under a running kubelet (setup 3) while a
// pod crash-loops, and in each restart a container exits while the process is down. The kubelet's event
// stream (through pleg-nri's front) never fails: evented_pleg_connection_error_count stays 0 and the
// kubelet never reconnects or falls back to relisting; each exit in a gap reaches the kubelet as a
// STOPPED (its log) after pleg-nri (its /readyz) or containerd (its CRI) is back, and the kubelet
// restarts the container, both within restartLagLimit, far below the kubelet's own fallback, and the
// lags are logged (on 1.35/1.36, when the STOPPED came in during a sync of the pod, the kubelet holds
// the pod up to kubeletCacheWait more: its own hold, shown by its log); no two containers of one name
// ever run at once in a pod (the node's duplicate watcher); and at the end the kubelet still acts on
// events.
func TestRestartsKeepFastPath(t *testing.T) {
	restartsKeepFastPath(t, []string{"pleg-nri SIGTERM", "containerd SIGTERM", "pleg-nri SIGKILL", "containerd SIGKILL",
		"pleg-nri upgrade", "containerd SIGTERM", "pleg-nri SIGTERM", "containerd SIGKILL", "pleg-nri downgrade",
		"containerd SIGTERM"})
}

// TestSoakRestartsKillsKeepFastPath (PLEG_NRI_SOAK=1, issue 56): the same with PLEG_NRI_SOAK_KILLS (10)
// SIGKILLs of pleg-nri's core and as many of containerd, alternating, under the kubelet.
func TestSoakRestartsKillsKeepFastPath(t *testing.T) {
	kills := soakKills(t)
	var steps []string
	for range kills {
		steps = append(steps, "pleg-nri SIGKILL", "containerd SIGKILL")
	}
	restartsKeepFastPath(t, steps)
}

// soakKills skips a soak test unless PLEG_NRI_SOAK=1 (make soak), and returns how many times it kills
// each process: PLEG_NRI_SOAK_KILLS, 10 by default.
func soakKills(t *testing.T) int {
	t.Helper()
	if os.Getenv("PLEG_NRI_SOAK") != "1" {
		t.Skip("a soak test: PLEG_NRI_SOAK=1 (make soak) runs it")
	}
	kills := 10
	if v := os.Getenv("PLEG_NRI_SOAK_KILLS"); v != "" {
		if _, err := fmt.Sscan(v, &kills); err != nil || kills < 1 {
			t.Fatalf("PLEG_NRI_SOAK_KILLS=%q: want a positive number", v)
		}
	}
	return kills
}

func restartsKeepFastPath(t *testing.T, steps []string) {
	upgraded := plegnribin.Binary(t, plegnribin.Upgraded)
	n := startNode(t, setupEventedPlegNRI)
	// containerd must run again when the test ends, whatever happens.
	t.Cleanup(func() {
		if !env.Running() {
			if err := env.Start(context.Background()); err != nil {
				t.Errorf("restart containerd: %v", err)
			}
		}
	})
	crasher := kubelet.Pod{Name: "crasher", Containers: []kubelet.Container{{Name: "crash", Script: "sleep 1; exit 1"}}}
	if err := n.k.WritePod(crasher); err != nil {
		t.Fatal(err)
	}
	for i := range steps {
		if err := n.k.WritePod(gapPod(fmt.Sprintf("gap%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	pods := make([]*kubelet.PodStatus, len(steps))
	for i := range steps {
		pods[i] = n.waitPod(fmt.Sprintf("gap%d", i), "running", running)
	}
	front, err := n.p.FrontPID()
	if err != nil {
		t.Fatal(err)
	}
	before := n.plegMetrics()
	t.Logf("before the restarts: %s", before)

	ctx := context.Background()
	var lags []time.Duration
	for i, step := range steps {
		p := pods[i]
		pid := n.waiterPID(p)
		exited := strings.TrimPrefix(p.Container("waiter").ContainerID, "containerd://")
		// Where the logs stand before the step: a step that is too slow logs what each wrote during it.
		plegLog, kubeletLog, containerdLog := len(n.p.Log()), fileSize(n.k.LogPath), env.LogSize()
		var back time.Time
		switch {
		case strings.HasPrefix(step, "pleg-nri"):
			switch step {
			case "pleg-nri SIGKILL":
				n.p.Kill()
			case "pleg-nri upgrade":
				n.p.Stop()
				n.p.SetBinary(upgraded)
			case "pleg-nri downgrade":
				n.p.Stop()
				n.p.SetBinary(plegNRIBinary)
			default:
				n.p.Stop()
			}
			n.triggerExit(p, pid)
			if err := n.p.Start(ctx); err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			back = time.Now()
		default:
			stop := env.Stop
			if step == "containerd SIGKILL" {
				stop = env.Kill
			}
			if err := stop(ctx); err != nil {
				t.Fatal(err)
			}
			n.triggerExit(p, pid)
			if err := env.Start(ctx); err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			back = time.Now()
		}
		p = n.waitPod(fmt.Sprintf("gap%d", i), "waiter restarted once and running", restartedTo("waiter", 1))
		// containerd reports an exit it did not see (it was down) as 255, reason Unknown.
		if last := p.Container("waiter").LastState.Terminated; last == nil || (strings.HasPrefix(step, "pleg-nri") && last.ExitCode != 7) {
			t.Errorf("%s: last state of the waiter: %s, want terminated (with exit code 7 if containerd saw it)", step, describePod(p))
		}
		// When the kubelet made the new container, by containerd's record.
		var created time.Time
		for _, c := range n.containers(p.Metadata.UID) {
			if c.GetMetadata().GetName() == "waiter" && c.GetMetadata().GetAttempt() == 1 {
				created = time.Unix(0, c.GetCreatedAt())
			}
		}
		if created.IsZero() {
			t.Fatalf("%s: no second attempt of the waiter in containerd", step)
		}
		lag := created.Sub(back)
		lags = append(lags, lag)
		allowed := restartLagLimit
		// A 1.37 kubelet can restart the container before the STOPPED comes (its relist runs every
		// second): wait for the receipt until a little past the limit, so a late one is told with its time.
		var got receipt
		err := testutil.Poll(ctx, time.Until(back.Add(restartLagLimit))+2*time.Second, "the kubelet to receive the STOPPED", func() (bool, error) {
			var err error
			got, err = stoppedReceipt(n.k.LogPath, kubeletLog, exited, p.Metadata.Namespace+"/"+p.Metadata.Name)
			return err == nil, err
		})
		switch {
		case err != nil:
			t.Errorf("%s: %v", step, err)
		case got.at.Sub(back) > restartLagLimit:
			t.Errorf("%s: the kubelet received the STOPPED of the container that exited in the gap %s after the restart, more than %s",
				step, got.at.Sub(back).Round(time.Millisecond), restartLagLimit)
		case got.midSync && !eventsTriggerRelist():
			allowed = max(allowed, got.at.Sub(back)+kubeletCacheWait+restartLagLimit)
			if lag > time.Second {
				t.Logf("%s: the STOPPED reached the kubelet %s after the restart, during a sync of the pod: its next sync waited for its cache (up to %s)",
					step, got.at.Sub(back).Round(time.Millisecond), kubeletCacheWait)
			}
		}
		if lag > allowed {
			t.Errorf("%s: the kubelet restarted the container that exited in the gap %s after the restart, more than %s",
				step, lag.Round(time.Millisecond), allowed.Round(time.Millisecond))
			t.Logf("%s: back at %s; pleg-nri's log during the step:\n%s", step, back.UTC().Format(time.RFC3339Nano), n.p.Log()[plegLog:])
			t.Logf("%s: containerd's log during the step:\n%s", step, env.LogSince(containerdLog))
			t.Logf("%s: the kubelet's log during the step (pod %s):\n%s", step, p.Metadata.Name, grepSince(n.k.LogPath, kubeletLog, p.Metadata.UID, p.Metadata.Name))
		}
		m := n.plegMetrics()
		t.Logf("step %d (%s): STOPPED received %s and container restarted %s after the restart; %s", i+1, step,
			got.at.Sub(back).Round(time.Millisecond), lag.Round(time.Millisecond), m)
		if m.ConnError != 0 || m.ConnSuccess != before.ConnSuccess {
			t.Errorf("%s: the kubelet's event stream failed or reconnected: before %s; now %s", step, before, m)
		}
		if now, err := n.p.FrontPID(); err != nil || now != front {
			t.Errorf("%s: the front is pid %d (%v), was %d", step, now, err, front)
		}
	}

	// The fast path is still on: one more exit comes as an event the kubelet acts on.
	after := n.plegMetrics()
	if err := n.k.WritePod(gapPod("last")); err != nil {
		t.Fatal(err)
	}
	last := n.waitPod("last", "running", running)
	n.triggerExit(last, n.waiterPID(last))
	n.waitPod("last", "waiter restarted once and running", restartedTo("waiter", 1))
	final := n.plegMetrics()
	t.Logf("after the restarts: %s", final)
	// The kubelet gives up on its stream only after 5 ends of it (1.35/1.36: relisting every second from then
	// on; 1.37: "disabling container-termination fast path"): with none, and the same connection all along,
	// it never did. (Its relist count is no measure here: a 1.37 kubelet relists a pod on each STOPPED.)
	if final.ConnError != 0 || final.ConnSuccess != before.ConnSuccess {
		t.Errorf("the kubelet's event stream failed or reconnected: before %s; after %s", before, final)
	}
	if n := n.k.CountLog("disabling container-termination fast path"); n > 0 {
		t.Errorf("the kubelet disabled its container-termination fast path")
	}
	t.Logf("kubelet relists since before the restarts: %g", final.Relists-before.Relists)
	// (The events-received metric exists in every kubelet version; the log line of a STOPPED differs.)
	if final.EventsReceived <= after.EventsReceived {
		t.Errorf("the kubelet received no event after the restarts: %s, then %s", after, final)
	}
	sorted := append([]time.Duration(nil), lags...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	t.Logf("restart lags (back -> new container created): %v; median %s, max %s", lags,
		sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
	// The crasher restarts (sleep 1; exit 1): with containerd killed every second or two its first start
	// can take the whole run, so it is given restartLagLimit after the last step.
	if err := testutil.Poll(ctx, restartLagLimit, "the crasher to restart", func() (bool, error) {
		return n.crashes("crasher") >= 1, nil
	}); err != nil {
		t.Errorf("the crasher never restarted: %v", err)
	}
}

// crashes returns the restart count the kubelet reports for a one-container pod.
func (n *node) crashes(name string) int32 {
	n.t.Helper()
	p, err := n.k.Pod(name)
	if err != nil || p == nil || len(p.Status.ContainerStatuses) == 0 {
		return 0
	}
	return p.Status.ContainerStatuses[0].RestartCount
}

// fileSize is the size of the file at path, 0 when it cannot be read.
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// grepSince returns the lines of the file at path from offset on that contain one of what.
func grepSince(path string, offset int64, what ...string) string {
	data, err := os.ReadFile(path)
	if err != nil || offset > int64(len(data)) {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	var out []string
	for _, line := range strings.Split(string(data[offset:]), "\n") {
		for _, w := range what {
			if strings.Contains(line, w) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// receipt is when the kubelet logged receiving an event, and whether a sync of the event's pod was in
// progress then.
type receipt struct {
	at      time.Time
	midSync bool
}

// stoppedReceipt finds, in the kubelet's log from offset on, the first STOPPED it received for the
// container id ("container event received", --v=4), and whether the pod ("namespace/name") was between
// "SyncPod enter" and "SyncPod exit" then.
func stoppedReceipt(path string, offset int64, id, pod string) (receipt, error) {
	data, err := os.ReadFile(path)
	if err != nil || offset > int64(len(data)) {
		return receipt{}, fmt.Errorf("cannot read the kubelet's log %s: %v", path, err)
	}
	// The kubelet logs the event in protobuf text, whose spacing varies on purpose.
	event := regexp.MustCompile(`"container event received" resp="container_id:\\"` + regexp.QuoteMeta(id) + `\\"\s+container_event_type:CONTAINER_STOPPED_EVENT\s`)
	enter, exit := `"SyncPod enter" pod="`+pod+`"`, `"SyncPod exit" pod="`+pod+`"`
	inSync := false
	for _, line := range strings.Split(string(data[offset:]), "\n") {
		switch {
		case strings.Contains(line, enter):
			inSync = true
		case strings.Contains(line, exit):
			inSync = false
		case event.MatchString(line):
			at, err := klogTime(line)
			if err != nil {
				return receipt{}, err
			}
			return receipt{at: at, midSync: inSync}, nil
		}
	}
	return receipt{}, fmt.Errorf("the kubelet's log has no STOPPED received for container %s", id)
}

// klogTime is the time of a klog line ("I1124 19:31:49.596023 ..."), in this year and the local zone.
func klogTime(line string) (time.Time, error) {
	if len(line) < 21 {
		return time.Time{}, fmt.Errorf("not a klog line: %q", line)
	}
	t, err := time.ParseInLocation("0102 15:04:05.000000", line[1:21], time.Local)
	if err != nil {
		return time.Time{}, fmt.Errorf("not a klog line: %q: %w", line, err)
	}
	return t.AddDate(time.Now().Year(), 0, 0), nil
}

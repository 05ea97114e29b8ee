package kubelete2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/nodebench"
)

// The deletion benchmark (make bench-deletion), per setup, with static pods of one container that exits
// at once on SIGTERM, and the time from a pod's manifest removal to its sandbox not ready in containerd
// (the kubelet's terminating sync stopped it):
//   - fresh: deletionPods pods one after the other, each deleted as soon as the kubelet reports it
//     running, so right after a sync of the pod, as a pod replaced during a rollout or deleted while it
//     starts (upstream's `should not hang in termination if terminated during initialization`);
//   - idle: deletionPods pods running for deletionSettle, deleted deletionSpacing apart (not a divisor of
//     the kubelet's 1 s relist or of its evented PLEG's 5 s cache tick).
//
// On kubelets 1.35 and 1.36 with EventedPLEG, each sync of a pod first waits for a pod status newer than
// the end of its previous sync, or for the 5 s cache tick (docs/internals.md, "The cache tick"): a fresh
// pod's deletion waits, an idle one's does not (the tick came since its last sync).
const (
	deletionPods    = 24
	deletionSpacing = 430 * time.Millisecond
	// deletionSettle lets the idle pods' start-up syncs end, and a cache tick pass, before their deletion.
	deletionSettle = 10 * time.Second
	deletionPoll   = 20 * time.Millisecond
	// deletionReportEnv names the markdown file BenchmarkPodDeletion writes; the JSON goes beside it.
	deletionReportEnv = "PLEG_NRI_KUBELET_DELETION_MD"
)

// setupPlegNRITick is pleg-nri as docs/operations.md sets it up for kubelets 1.35 and 1.36.
var setupPlegNRITick = setup{Name: "EventedPLEG on pleg-nri (refresh-after-stop, cache-tick 1s)", Evented: true, PlegNRI: true,
	RefreshAfterStop: true, CacheTick: time.Second}

// deletionSample is one pod's deletion: when its manifest was removed, and when containerd first showed
// its sandbox not ready (nanoseconds since the epoch).
type deletionSample struct {
	Pod              string
	Fresh            bool
	Removed, Stopped int64
	// StoppedMs is the time from the removal to the sandbox not ready, in milliseconds.
	StoppedMs float64
}

type deletionRun struct {
	Setup   string           `json:"setup"`
	Samples []deletionSample `json:"samples"`
	Load    string           `json:"load_at_end"`
}

// BenchmarkPodDeletion measures, per setup, the time from a static pod's manifest removal to its
// sandbox stopped in containerd, for fresh and for idle pods.
func BenchmarkPodDeletion(b *testing.B) {
	setups := append(slices.Clone(allSetups), setupPlegNRITick)
	var runs []deletionRun
	for _, s := range setups {
		b.Run(strings.NewReplacer(" ", "_", ",", "").Replace(s.Name), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				runs = append(runs, runDeletion(b, s))
			}
		})
	}
	path := os.Getenv(deletionReportEnv)
	if path == "" || len(runs) < len(setups) {
		return
	}
	if err := os.WriteFile(path, []byte(deletionMarkdown(runs)), 0o644); err != nil {
		b.Fatal(err)
	}
	js, err := json.MarshalIndent(struct {
		Kubelet string        `json:"kubelet"`
		Date    string        `json:"date"`
		CPUs    int           `json:"cpus"`
		Runs    []deletionRun `json:"runs"`
	}{kubeletVersion, time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), runs}, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(strings.TrimSuffix(path, ".md")+".json", js, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Logf("wrote %s", path)
}

func deletionPod(kind string, i int) kubelet.Pod {
	return kubelet.Pod{Name: fmt.Sprintf("%s%02d", kind, i), HostNetwork: true,
		Containers: []kubelet.Container{{Name: "main", Script: "trap 'exit 0' TERM; sleep 3600 & wait"}}}
}

func runDeletion(b *testing.B, s setup) deletionRun {
	b.StopTimer()
	n := startNode(b, s, nodeOptions{quiet: true, noDupWatch: true})
	var samples []deletionSample
	// Fresh: each pod deleted as soon as the kubelet reports it running.
	for i := range deletionPods {
		p := deletionPod("fresh", i)
		if err := n.k.WritePod(p); err != nil {
			b.Fatal(err)
		}
		var uid string
		deadline := time.Now().Add(podWaitTimeout)
		for uid == "" {
			st, err := n.k.Pod(p.Name)
			if err != nil {
				b.Fatal(err)
			}
			if st != nil {
				if ok, _ := running(st); ok {
					uid = st.Metadata.UID
					break
				}
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s: not running within %s: %s", p.Name, podWaitTimeout, describePod(st))
			}
			time.Sleep(deletionPoll)
		}
		sm := deletionSample{Pod: p.Name, Fresh: true, Removed: time.Now().UnixNano()}
		if err := n.k.RemovePod(p.Name); err != nil {
			b.Fatal(err)
		}
		sm.Stopped = n.waitSandboxNotReady(b, uid)
		samples = append(samples, sm)
	}
	// Idle: every pod running for deletionSettle, then deleted deletionSpacing apart.
	uids := make([]string, deletionPods)
	for i := range deletionPods {
		if err := n.k.WritePod(deletionPod("idle", i)); err != nil {
			b.Fatal(err)
		}
	}
	for i := range deletionPods {
		uids[i] = n.waitPod(deletionPod("idle", i).Name, "running", running).Metadata.UID
	}
	time.Sleep(deletionSettle)
	w := watchSandboxes(b, n, uids, deletionPoll)
	idle := make([]deletionSample, deletionPods)
	start := time.Now()
	for i := range deletionPods {
		time.Sleep(time.Until(start.Add(time.Duration(i) * deletionSpacing)))
		idle[i] = deletionSample{Pod: deletionPod("idle", i).Name, Removed: time.Now().UnixNano()}
		if err := n.k.RemovePod(idle[i].Pod); err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(podWaitTimeout)
	for !w.allStopped() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	w.stop()
	for i := range idle {
		if idle[i].Stopped = w.stoppedAt(uids[i]); idle[i].Stopped == 0 {
			b.Fatalf("%s: sandbox not stopped within %s of its deletion", idle[i].Pod, podWaitTimeout)
		}
	}
	samples = append(samples, idle...)
	for i := range samples {
		samples[i].StoppedMs = float64(samples[i].Stopped-samples[i].Removed) / 1e6
	}
	for _, fresh := range []bool{true, false} {
		q := nodebench.QuantilesOf(deletionLatencies([]deletionRun{{Samples: samples}}, fresh))
		b.Logf("%s: %s pods, manifest removed -> sandbox stopped p50 %s p90 %s", s.Name, phaseName(fresh), nodebench.Cell(q.P50), nodebench.Cell(q.P90))
	}
	return deletionRun{Setup: s.Name, Samples: samples, Load: loadAvg()}
}

func phaseName(fresh bool) string {
	if fresh {
		return "fresh"
	}
	return "idle"
}

// waitSandboxNotReady polls containerd until a sandbox of the pod uid is not ready (or none is left),
// and returns when.
func (n *node) waitSandboxNotReady(tb testing.TB, uid string) int64 {
	deadline := time.Now().Add(podWaitTimeout)
	for time.Now().Before(deadline) {
		sandboxes := n.sandboxes(uid)
		now := time.Now().UnixNano()
		if len(sandboxes) == 0 {
			return now // stopped and removed between two polls
		}
		for _, sb := range sandboxes {
			if sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
				return now
			}
		}
		time.Sleep(deletionPoll)
	}
	tb.Fatalf("pod %s: sandbox not stopped within %s of its deletion", uid, podWaitTimeout)
	return 0
}

func deletionLatencies(runs []deletionRun, fresh bool) []float64 {
	var out []float64
	for _, r := range runs {
		for _, s := range r.Samples {
			if s.Fresh == fresh {
				out = append(out, s.StoppedMs)
			}
		}
	}
	return out
}

// sandboxWatch polls containerd's sandboxes of a set of pods and keeps, per pod uid, when one was
// first seen not ready (or none was left).
type sandboxWatch struct {
	mu      sync.Mutex
	stopped map[string]int64
	pods    int // how many pods it watches
	cancel  context.CancelFunc
	done    chan struct{}
}

// watchSandboxes starts a sandboxWatch of the pods uids, which lists containerd's sandboxes every period.
func watchSandboxes(tb testing.TB, n *node, uids []string, period time.Duration) *sandboxWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &sandboxWatch{stopped: map[string]int64{}, pods: len(uids), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := n.cri.ListPodSandbox(cctx, &runtimeapi.ListPodSandboxRequest{})
			ccancel()
			now := time.Now().UnixNano()
			if err == nil {
				ready, seen := map[string]bool{}, map[string]bool{}
				for _, sb := range resp.GetItems() {
					uid := sb.GetLabels()[podUIDLabel]
					seen[uid] = true
					ready[uid] = ready[uid] || sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY
				}
				w.mu.Lock()
				for _, uid := range uids {
					if w.stopped[uid] == 0 && (!seen[uid] || !ready[uid]) {
						w.stopped[uid] = now
					}
				}
				w.mu.Unlock()
			} else if ctx.Err() == nil {
				tb.Logf("ListPodSandbox: %v", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *sandboxWatch) allStopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.stopped) == w.pods
}

func (w *sandboxWatch) stoppedAt(uid string) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped[uid]
}

func (w *sandboxWatch) stop() { w.cancel(); <-w.done }

// deletionMarkdown renders the runs as docs/kubelet-deletion-<version>.md.
func deletionMarkdown(runs []deletionRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# A static pod's deletion, by PLEG setup (kubelet %s)\n\n", kubeletVersion)
	fmt.Fprintf(&b, "Made by `make bench-deletion KUBELET_VERSION=%s` (`go test -run '^$' -bench BenchmarkPodDeletion -benchtime 1x ./test/kubelet-e2e/`) on %s UTC, %d CPUs.\n", kubeletVersion, time.Now().UTC().Format("2006-01-02 15:04"), runtime.NumCPU())
	fmt.Fprintf(&b, "Per setup, its own kubelet on the same containerd; host-network static pods of one busybox container that exits at once on SIGTERM. "+
		"*Fresh*: %d pods one after the other, each deleted (manifest removed) as soon as the kubelet reports it running, right after a sync of the pod. "+
		"*Idle*: %d pods running for %s, deleted %s apart. "+
		"Each figure is the time from the manifest's removal to the pod's sandbox not ready in containerd (polled every %s): the kubelet's terminating sync stopped it.\n\n",
		deletionPods, deletionPods, deletionSettle, deletionSpacing, deletionPoll)
	b.WriteString("| setup | fresh pods | fresh p50 | fresh p90 | fresh max | idle pods | idle p50 | idle p90 | idle max | load at end |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	var setups []string
	for _, r := range runs {
		if !slices.Contains(setups, r.Setup) {
			setups = append(setups, r.Setup)
		}
	}
	for _, name := range setups {
		var of []deletionRun
		load := ""
		for _, r := range runs {
			if r.Setup == name {
				of, load = append(of, r), r.Load
			}
		}
		fresh, idle := deletionLatencies(of, true), deletionLatencies(of, false)
		qf, qi := nodebench.QuantilesOf(fresh), nodebench.QuantilesOf(idle)
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %d | %s | %s | %s | %s |\n", name, len(fresh),
			nodebench.Cell(qf.P50), nodebench.Cell(qf.P90), nodebench.Ms(nodebench.Max(fresh)), len(idle), nodebench.Cell(qi.P50), nodebench.Cell(qi.P90), nodebench.Ms(nodebench.Max(idle)), load)
	}
	return b.String()
}

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
)

// The deletion benchmark (make bench-deletion): deletionPods pods of one container that exits at once on
// SIGTERM are deleted one after the other, deletionSpacing apart (not a divisor of the kubelet's 1 s
// relist or of its evented PLEG's 5 s cache tick, so the deletions fall at every phase of both), and
// containerd is watched for when each pod's sandbox is stopped (the kubelet's terminating sync is done)
// and removed. On kubelets 1.35 and 1.36 with EventedPLEG, each sync of a pod first waits for a pod
// status newer than the end of its previous sync (docs/internals.md, "The cache tick").
const (
	deletionPods    = 24
	deletionSpacing = 430 * time.Millisecond
	// deletionSettle lets the pods' start-up syncs end before the first deletion.
	deletionSettle = 10 * time.Second
	deletionPoll   = 20 * time.Millisecond
	// deletionReportEnv names the markdown file BenchmarkPodDeletion writes; the JSON goes beside it.
	deletionReportEnv = "PLEG_NRI_KUBELET_DELETION_MD"
)

// setupPlegNRITick is pleg-nri as docs/operations.md sets it up for kubelets 1.35 and 1.36.
var setupPlegNRITick = setup{Name: "EventedPLEG on pleg-nri (refresh-after-stop, cache-tick 1s)", Evented: true, PlegNRI: true,
	RefreshAfterStop: true, CacheTick: time.Second}

// deletionSample is one pod's deletion: when its manifest was removed, and when containerd first showed
// its sandbox not ready and then no longer had it (nanoseconds since the epoch; 0: not seen).
type deletionSample struct {
	Pod                    string
	Removed, Stopped, Gone int64
	// StoppedMs and GoneMs are the times from the removal, in milliseconds.
	StoppedMs, GoneMs float64
}

type deletionRun struct {
	Setup   string           `json:"setup"`
	Samples []deletionSample `json:"samples"`
	Load    string           `json:"load_at_end"`
}

// BenchmarkPodDeletion measures, per setup, the time from a static pod's manifest removal to its
// sandbox stopped and removed in containerd.
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

func runDeletion(b *testing.B, s setup) deletionRun {
	b.StopTimer()
	n := startNode(b, s, nodeOptions{quiet: true, noDupWatch: true})
	pod := func(i int) kubelet.Pod {
		return kubelet.Pod{Name: fmt.Sprintf("del%02d", i), HostNetwork: true,
			Containers: []kubelet.Container{{Name: "main", Script: "trap 'exit 0' TERM; sleep 3600 & wait"}}}
	}
	uids := make([]string, deletionPods)
	for i := range deletionPods {
		if err := n.k.WritePod(pod(i)); err != nil {
			b.Fatal(err)
		}
	}
	for i := range deletionPods {
		uids[i] = n.waitPod(pod(i).Name, "running", running).Metadata.UID
	}
	time.Sleep(deletionSettle)

	w := watchSandboxes(b, n, uids)
	b.StartTimer()
	samples := make([]deletionSample, deletionPods)
	start := time.Now()
	for i := range deletionPods {
		time.Sleep(time.Until(start.Add(time.Duration(i) * deletionSpacing)))
		samples[i] = deletionSample{Pod: pod(i).Name, Removed: time.Now().UnixNano()}
		if err := n.k.RemovePod(pod(i).Name); err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(podWaitTimeout)
	for !w.allGone() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	b.StopTimer()
	w.stop()
	for i := range samples {
		sm := &samples[i]
		sm.Stopped, sm.Gone = w.times(uids[i])
		if sm.Stopped == 0 || sm.Gone == 0 {
			b.Fatalf("%s: sandbox stopped at %d, removed at %d: not seen within %s", sm.Pod, sm.Stopped, sm.Gone, podWaitTimeout)
		}
		sm.StoppedMs, sm.GoneMs = float64(sm.Stopped-sm.Removed)/1e6, float64(sm.Gone-sm.Removed)/1e6
	}
	stopped, gone := deletionLatencies([]deletionRun{{Samples: samples}})
	b.Logf("%s: manifest removed -> sandbox stopped p50 %s p90 %s; -> removed p50 %s p90 %s (%d pods)", s.Name,
		qCell(quantilesOf(stopped).P50), qCell(quantilesOf(stopped).P90), qCell(quantilesOf(gone).P50), qCell(quantilesOf(gone).P90), len(samples))
	return deletionRun{Setup: s.Name, Samples: samples, Load: loadAvg()}
}

func deletionLatencies(runs []deletionRun) (stopped, gone []float64) {
	for _, r := range runs {
		for _, s := range r.Samples {
			stopped = append(stopped, s.StoppedMs)
			gone = append(gone, s.GoneMs)
		}
	}
	return stopped, gone
}

// sandboxWatch polls containerd's sandboxes of a set of pods and keeps, per pod uid, when one was
// first seen not ready and when none was left.
type sandboxWatch struct {
	mu            sync.Mutex
	stopped, gone map[string]int64
	cancel        context.CancelFunc
	done          chan struct{}
}

func watchSandboxes(tb testing.TB, n *node, uids []string) *sandboxWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &sandboxWatch{stopped: map[string]int64{}, gone: map[string]int64{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(deletionPoll)
		defer t.Stop()
		for {
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := n.cri.ListPodSandbox(cctx, &runtimeapi.ListPodSandboxRequest{})
			ccancel()
			now := time.Now().UnixNano()
			if err == nil {
				state := map[string]runtimeapi.PodSandboxState{}
				for _, sb := range resp.GetItems() {
					uid := sb.GetLabels()[podUIDLabel]
					if st, ok := state[uid]; !ok || st != runtimeapi.PodSandboxState_SANDBOX_READY {
						state[uid] = sb.GetState()
					}
				}
				w.mu.Lock()
				for _, uid := range uids {
					st, ok := state[uid]
					if ok && st == runtimeapi.PodSandboxState_SANDBOX_NOTREADY && w.stopped[uid] == 0 {
						w.stopped[uid] = now
					}
					if !ok && w.gone[uid] == 0 {
						if w.stopped[uid] == 0 {
							w.stopped[uid] = now // stopped and removed between two polls
						}
						w.gone[uid] = now
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

func (w *sandboxWatch) allGone() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.gone) == deletionPods
}

func (w *sandboxWatch) times(uid string) (stopped, gone int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped[uid], w.gone[uid]
}

func (w *sandboxWatch) stop() { w.cancel(); <-w.done }

// deletionMarkdown renders the runs as docs/kubelet-deletion-<version>.md.
func deletionMarkdown(runs []deletionRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# A static pod's deletion, by PLEG setup (kubelet %s)\n\n", kubeletVersion)
	fmt.Fprintf(&b, "Made by `make bench-deletion KUBELET_VERSION=%s` (`go test -run '^$' -bench BenchmarkPodDeletion -benchtime 1x ./test/kubelet-e2e/`) on %s UTC, %d CPUs.\n", kubeletVersion, time.Now().UTC().Format("2006-01-02 15:04"), runtime.NumCPU())
	fmt.Fprintf(&b, "Per setup, its own kubelet on the same containerd runs %d host-network static pods of one busybox container that exits at once on SIGTERM; "+
		"%s after all run, their manifests are removed one after the other, %s apart, and containerd's sandboxes are polled every %s. "+
		"*Stopped*: the manifest's removal to the pod's sandbox not ready (the kubelet's terminating sync stopped it). "+
		"*Removed*: to the sandbox gone from containerd (the kubelet's clean-up after the terminated sync).\n\n",
		deletionPods, deletionSettle, deletionSpacing, deletionPoll)
	b.WriteString("| setup | pods | stopped p50 | stopped p90 | stopped max | removed p50 | removed p90 | removed max | load at end |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
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
		stopped, gone := deletionLatencies(of)
		qs, qg := quantilesOf(stopped), quantilesOf(gone)
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", name, len(stopped),
			qCell(qs.P50), qCell(qs.P90), msCell(maxOf(stopped)), qCell(qg.P50), qCell(qg.P90), msCell(maxOf(gone)), load)
	}
	return b.String()
}

// qCell renders a quantile (nil: no sample).
func qCell(v *float64) string {
	if v == nil {
		return "-"
	}
	return msCell(*v)
}

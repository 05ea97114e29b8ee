package kubelete2e

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
)

// The crash-restart workload: benchPods pods of benchContainers containers, each of which crashes
// (exit 1) exactly once, benchSpacing after the one before it; benchRounds rounds of the three setups
// in turn, so that a load change on the shared machine hits every setup alike. Only a container's first restart comes
// without the kubelet's crash-loop back-off (every later one waits until at least 1 s after the exit,
// even with the shortest back-off the kubelet allows), so each container crashes once and the samples
// are many containers, not many crashes of one. One container per pod: each exit then finds its pod's
// worker idle, so the time measured is the kubelet noticing the exit and acting on it, not a pod worker
// still busy with a sibling's restart.
const (
	benchRounds     = 3
	benchPods       = 8
	benchContainers = 1
	// benchFirstExit is how long the first container runs before it exits: all containers have started
	// by then on a loaded machine.
	benchFirstExit = 10 * time.Second
	// benchSpacing separates two exits; not a divisor of the 1 s relist period, so the exits fall at
	// every phase of GenericPLEG's relist.
	benchSpacing = 530 * time.Millisecond
	// benchReportEnv names the markdown file BenchmarkCrashRestart writes (make bench-kubelet).
	benchReportEnv = "PLEG_NRI_KUBELET_BENCH_MD"
)

// restartSample is one crash and the kubelet's replacement of the crashed container, from containerd's
// statuses (nanoseconds since the epoch).
type restartSample struct {
	Container                    string
	FinishedAt, Created, Started int64
}

func (s restartSample) createdMs() float64 { return float64(s.Created-s.FinishedAt) / 1e6 }
func (s restartSample) startedMs() float64 { return float64(s.Started-s.FinishedAt) / 1e6 }

// benchRun is one round of one setup.
type benchRun struct {
	Setup   setup
	Round   int
	Samples []restartSample
	// Before and After are the kubelet's PLEG metrics when the pods were written and when the last
	// replacement ran.
	Before, After plegMetrics
	// Load is the machine's load average when the run ended.
	Load string
	// HeldReads and HeldSeconds are pleg-nri's status reads held until containerd caught up with the
	// events (pleg_nri_stale_read_hold_seconds count and sum; setup 3 only).
	HeldReads, HeldSeconds float64
}

// BenchmarkCrashRestart measures, for each setup, the time from a container's exit (its finished_at)
// to the creation and the start of the container the kubelet replaces it with (their created_at and
// started_at), over benchRounds*benchPods*benchContainers crash-restarts. With
// PLEG_NRI_KUBELET_BENCH_MD set it writes the table there (make bench-kubelet writes
// docs/kubelet-bench.md).
func BenchmarkCrashRestart(b *testing.B) {
	var runs []*benchRun
	for round := 1; round <= benchRounds; round++ {
		for _, s := range allSetups {
			b.Run(fmt.Sprintf("round%d_%s", round, strings.ReplaceAll(s.Name, " ", "_")), func(b *testing.B) {
				var r *benchRun
				for i := 0; i < b.N; i++ {
					r = runCrashBench(b, s)
				}
				r.Round = round
				created, started := r.latencies()
				b.ReportMetric(benchreport.Median(created), "p50-created-ms")
				b.ReportMetric(benchreport.Quantile(created, 0.9), "p90-created-ms")
				b.ReportMetric(benchreport.Median(started), "p50-started-ms")
				runs = append(runs, r)
			})
		}
	}
	if path := os.Getenv(benchReportEnv); path != "" && len(runs) == benchRounds*len(allSetups) {
		if err := os.WriteFile(path, []byte(benchMarkdown(runs)), 0o644); err != nil {
			b.Fatal(err)
		}
		b.Logf("wrote %s", path)
	}
}

func (r *benchRun) latencies() (created, started []float64) {
	for _, s := range r.Samples {
		created = append(created, s.createdMs())
		started = append(started, s.startedMs())
	}
	return created, started
}

// latenciesOf merges the samples of every round of setup s.
func latenciesOf(runs []*benchRun, s setup) (created, started []float64) {
	for _, r := range runs {
		if r.Setup == s {
			c, st := r.latencies()
			created, started = append(created, c...), append(started, st...)
		}
	}
	return created, started
}

// crashName names the k-th crashing container: c00, c01, ...
func crashName(k int) string { return fmt.Sprintf("c%02d", k) }

func runCrashBench(b *testing.B, s setup) *benchRun {
	b.StopTimer()
	n := startNode(b, s, nodeOptions{quiet: true})
	// containerd replays to its stream's first subscriber the events of the pods the previous setup
	// left (kept 5 minutes): let them arrive before the run starts.
	time.Sleep(2 * time.Second)
	r := &benchRun{Setup: s, Before: n.plegMetrics()}
	for i := 0; i < benchPods; i++ {
		p := kubelet.Pod{Name: fmt.Sprintf("crash%d", i)}
		for j := 0; j < benchContainers; j++ {
			k := i*benchContainers + j
			delay := benchFirstExit + time.Duration(k)*benchSpacing
			p.Containers = append(p.Containers, kubelet.Container{Name: crashName(k), State: true, Script: fmt.Sprintf(
				`[ -e /state/%[1]s ] && exec sleep 3600; touch /state/%[1]s; sleep %.3f; exit 1`, crashName(k), delay.Seconds())})
		}
		if err := n.k.WritePod(p); err != nil {
			b.Fatal(err)
		}
	}
	b.StartTimer()
	for i := 0; i < benchPods; i++ {
		name := fmt.Sprintf("crash%d", i)
		pod := n.waitPod(name, "every container restarted once and running", func(p *kubelet.PodStatus) (bool, error) {
			if len(p.Status.ContainerStatuses) != benchContainers {
				return false, nil
			}
			for _, c := range p.Status.ContainerStatuses {
				if ok, err := restartedTo(c.Name, 1)(p); !ok || err != nil {
					return false, err
				}
			}
			return true, nil
		})
		byName := map[string][]int{}
		ctrs := n.containers(pod.Metadata.UID)
		for i, c := range ctrs {
			byName[c.GetMetadata().GetName()] = append(byName[c.GetMetadata().GetName()], i)
		}
		for name, idx := range byName {
			if len(idx) != 2 {
				b.Fatalf("pod %s: containerd has %d containers named %s, want the crashed one and its replacement", name, len(idx), name)
			}
			old, repl := ctrs[idx[0]], ctrs[idx[1]]
			if old.GetMetadata().GetAttempt() != 0 || repl.GetMetadata().GetAttempt() != 1 || old.GetExitCode() != 1 {
				b.Fatalf("pod %s container %s: attempts %d (exit %d) and %d, want 0 (exit 1) and 1", name, name,
					old.GetMetadata().GetAttempt(), old.GetExitCode(), repl.GetMetadata().GetAttempt())
			}
			r.Samples = append(r.Samples, restartSample{Container: name, FinishedAt: old.GetFinishedAt(),
				Created: repl.GetCreatedAt(), Started: repl.GetStartedAt()})
		}
	}
	b.StopTimer()
	r.After = n.plegMetrics()
	r.Load = loadAvg()
	if n.p != nil {
		r.HeldReads, _ = n.p.Metric("pleg_nri_stale_read_hold_seconds_count")
		r.HeldSeconds, _ = n.p.Metric("pleg_nri_stale_read_hold_seconds_sum")
	}
	created, started := r.latencies()
	b.Logf("%s: %d restarts; exit -> created p50 %.0f ms p90 %.0f ms max %.0f ms; exit -> started p50 %.0f ms; kubelet: %s",
		s.Name, len(r.Samples), benchreport.Median(created), benchreport.Quantile(created, 0.9), maxOf(created),
		benchreport.Median(started), r.After)
	return r
}

func maxOf(v []float64) float64 {
	m := math.NaN()
	for _, x := range v {
		if math.IsNaN(m) || x > m {
			m = x
		}
	}
	return m
}

func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func commandOutput(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}

// benchMarkdown renders docs/kubelet-bench.md from the runs, in the order of allSetups.
func benchMarkdown(runs []*benchRun) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# A real kubelet: crash to restart, by PLEG")
	p("")
	p("Made by `make bench-kubelet` (`go test -run '^$' -bench BenchmarkCrashRestart -benchtime 1x ./test/kubelet-e2e/`) on %s.",
		time.Now().UTC().Format("2006-01-02 15:04 MST"))
	p("Kubelet `%s` (built from the Go module proxy, unmodified, standalone: static pods, no API server), containerd %s, %d CPUs, kernel %s.",
		commandOutput(kubeletBinary, "--version"), strings.Fields(commandOutput(env.BinDir+"/containerd", "--version") + " ? ? ?")[2],
		runtime.NumCPU(), commandOutput("uname", "-r"))
	p("")
	p("Each setup runs its own kubelet against the same containerd; %d rounds of the three setups in turn, %d pods of %d",
		benchRounds, benchPods, benchContainers)
	p("busybox container(s) per round. Each container exits 1 once (the first %s after it started, each next one %s",
		benchFirstExit, benchSpacing)
	p("later) and the kubelet restarts it: a container's first restart has no crash-loop back-off. From containerd's")
	p("statuses, in nanoseconds: the crashed container's `finished_at` to its replacement's `created_at` (the kubelet")
	p("noticed the exit and acted) and `started_at` (the replacement runs).")
	p("")
	p("| setup | restarts | exit → created p50 | p90 | max | exit → started p50 | p90 | max |")
	p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	p50 := map[string]float64{}
	for _, s := range allSetups {
		created, started := latenciesOf(runs, s)
		p50[s.Name] = benchreport.Median(created)
		p("| %s | %d | %s | %s | %s | %s | %s | %s |", s.Name, len(created),
			msCell(benchreport.Median(created)), msCell(benchreport.Quantile(created, 0.9)), msCell(maxOf(created)),
			msCell(benchreport.Median(started)), msCell(benchreport.Quantile(started, 0.9)), msCell(maxOf(started)))
	}
	p("")
	generic, direct, ours := p50[setupGeneric.Name], p50[setupEventedDirect.Name], p50[setupEventedPlegNRI.Name]
	p("Goals, at p50 of exit → created:")
	p("")
	p("- %s is %.2fx faster than %s (goal: at least 10x): %s.", setupEventedPlegNRI.Name, generic/ours, setupGeneric.Name,
		met(generic/ours >= 10))
	p("- %s takes %s, %s takes %s (goal: no slower): %s.", setupEventedPlegNRI.Name, msCell(ours), setupEventedDirect.Name,
		msCell(direct), met(ours <= direct))
	p("")
	p("Each round, and what its kubelet's metrics said from the pods' creation to the last replacement:")
	p("")
	p("| round | setup | exit → created p50 | evented_pleg_connection_success_count | evented_pleg_connection_error_count | relists during the run | events received during the run (before it) | event created → handled by the kubelet, mean | pleg-nri reads held (s) | load at end |")
	p("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, r := range runs {
		created, _ := r.latencies()
		held := "-"
		if r.Setup.PlegNRI {
			held = fmt.Sprintf("%g (%.2f)", r.HeldReads, r.HeldSeconds)
		}
		events := r.After.EventsReceived - r.Before.EventsReceived
		delivery := math.NaN()
		if events > 0 {
			delivery = (r.After.EventLatency - r.Before.EventLatency) / events * 1000
		}
		p("| %d | %s | %s | %g | %g | %g | %g (%g) | %s | %s | %s |", r.Round, r.Setup.Name, msCell(benchreport.Median(created)),
			r.After.ConnSuccess, r.After.ConnError, r.After.Relists-r.Before.Relists,
			events, r.Before.EventsReceived, msCell(delivery), held, r.Load)
	}
	p("")
	p("Events received are the observations of `kubelet_evented_pleg_connection_latency_seconds`. Those before the run,")
	p("with containerd's stream, are containerd replaying to its stream's first subscriber the events of the previous")
	p("setup's pods (removed while nobody listened; containerd keeps them for 5 minutes). Reads held: the status reads")
	p("pleg-nri held until containerd's answer caught up with the events it had sent (`pleg_nri_stale_read_hold_seconds`")
	p("count and sum). Event created → handled: the mean of `kubelet_evented_pleg_connection_latency_seconds`, from the")
	p("event's `created_at` (containerd: once it has handled the exit; pleg-nri: as soon as it learns of it) to the")
	p("kubelet's handling. The kubelets run with --v=2 and pleg-nri at log level info, as in production.")
	p("")
	p("Every sample, exit → created, sorted:")
	p("")
	for _, s := range allSetups {
		created, _ := latenciesOf(runs, s)
		slices.Sort(created)
		cells := make([]string, len(created))
		for i, v := range created {
			cells[i] = fmt.Sprintf("%.0f", v)
		}
		p("- %s (ms): %s", s.Name, strings.Join(cells, ", "))
	}
	p("")
	p("The machine is shared with other tests: expect noise. GenericPLEG finds an exit at its next relist (every second), so")
	p("its latency spreads over about a second; the evented setups act on the STOPPED event.")
	p("")
	p("One crashing container per pod keeps each pod's worker idle when its exit comes. With several containers per pod")
	p("crashing in turn, the kubelet's pod worker is still busy with one restart when the next exit arrives, and both")
	p("evented setups wait longer (the kubelet's pod worker waits for a cached status newer than its last sync). pleg-nri")
	p("sends STOPPED before containerd's CRI says the container exited; the kubelet's on-demand relist after a restart")
	p("(PLEGOnDemandRelist, on in 1.36) then reads containerd's stale RUNNING, which pleg-nri now holds until containerd")
	p("catches up (TestSlowExitHandling).")
	return b.String()
}

func msCell(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	if v < 10 {
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.0f ms", v)
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

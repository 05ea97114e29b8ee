package kubelete2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/nodebench"
)

// The crash-restart workload: benchPods pods of benchContainers containers, each of which crashes
// (exit 1) exactly once, benchSpacing after the one before it; benchRounds rounds of the setups in
// turn, so that a load change on the shared machine hits every setup alike. Only a container's first restart comes
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
	// benchReportEnv names the markdown file BenchmarkCrashRestart writes (make bench-kubelet); the
	// JSON goes beside it (same name, .json).
	benchReportEnv = "PLEG_NRI_KUBELET_BENCH_MD"
	// benchFreshnessEnv adds setups: pleg-nri with each read-freshness mode it lists ("off"),
	// to compare them with the default in the same run.
	benchFreshnessEnv = "PLEG_NRI_KUBELET_BENCH_FRESHNESS"
	// benchBaselineEnv adds setups: pleg-nri, as configured for the kubelet, run from each binary it lists
	// (paths, comma-separated): another commit's build, to compare two commits side by side in one run,
	// interleaved (docs/development.md).
	benchBaselineEnv = "PLEG_NRI_KUBELET_BENCH_BASELINE"
	// benchControlsEnv=0 leaves out the control setups (benchControls).
	benchControlsEnv = "PLEG_NRI_KUBELET_BENCH_CONTROLS"
	// benchRoundsEnv and benchPodsEnv make a shorter (or longer) run than benchRounds rounds of
	// benchPods pods, e.g. a smoke run of every setup.
	benchRoundsEnv = "PLEG_NRI_KUBELET_BENCH_ROUNDS"
	benchPodsEnv   = "PLEG_NRI_KUBELET_BENCH_PODS"
)

// The control setups: pleg-nri attached to containerd (its NRI plugin registered, containerd's task
// events subscribed, its status reads, a subscriber of its stream standing in for the kubelet's) while
// the kubelet runs EventedPLEG on containerd's own stream and endpoint, with its checkpoint and with no
// state-dir. Against EventedPLEG on containerd they measure what pleg-nri's own work adds to
// containerd's handling of the exit and to the replacement's create and start; against EventedPLEG on
// pleg-nri, what its events give the kubelet.
var (
	setupAttached        = setup{Name: "EventedPLEG on containerd, pleg-nri attached", Evented: true, Attached: true}
	setupAttachedNoState = setup{Name: "EventedPLEG on containerd, pleg-nri attached, no state-dir", Evented: true, Attached: true,
		NoStateDir: true}
	benchControls = []setup{setupAttached, setupAttachedNoState}
)

// benchShape returns the rounds and the pods per round of BenchmarkCrashRestart: benchRounds and
// benchPods unless benchRoundsEnv and benchPodsEnv say otherwise.
func benchShape(tb testing.TB) (rounds, pods int) {
	rounds, pods = benchRounds, benchPods
	for _, v := range []struct {
		env string
		to  *int
	}{{benchRoundsEnv, &rounds}, {benchPodsEnv, &pods}} {
		if s := os.Getenv(v.env); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				tb.Fatalf("%s=%q: want a positive number", v.env, s)
			}
			*v.to = n
		}
	}
	return rounds, pods
}

// benchSetups are the setups of BenchmarkCrashRestart: allSetups, benchControls (unless
// benchControlsEnv=0), and pleg-nri with the read-freshness modes benchFreshnessEnv lists and the
// binaries benchBaselineEnv lists.
func benchSetups(tb testing.TB) []setup {
	out := slices.Clone(allSetups)
	if os.Getenv(benchControlsEnv) != "0" {
		out = append(out, benchControls...)
	}
	for _, key := range []struct {
		env, name string
		set       func(*setup, string)
	}{
		{benchFreshnessEnv, "read-freshness", func(s *setup, v string) { s.Freshness = v }},
		{benchBaselineEnv, "binary", func(s *setup, v string) { s.Binary = v }},
	} {
		for _, v := range strings.Split(os.Getenv(key.env), ",") {
			if v = strings.TrimSpace(v); v != "" {
				s := setupEventedPlegNRI
				s.Name = fmt.Sprintf("%s (%s %s)", s.Name, key.name, v)
				key.set(&s, v)
				out = append(out, s)
			}
		}
	}
	tb.Logf("bench setups on kubelet %s: %d", kubeletVersion, len(out))
	return out
}

// restartSample is one crash and the kubelet's replacement of the crashed container, from containerd's
// statuses (nanoseconds since the epoch).
type restartSample struct {
	Container                    string
	FinishedAt, Created, Started int64
	// ContainerdDone is the created_at of containerd's own STOPPED event for the crashed container:
	// when containerd had handled the exit (its CRI status updated); 0 when it was not seen.
	ContainerdDone int64
	// PlegNRIEmitted and PlegNRIReceived are, in the setups pleg-nri is attached in, the created_at of
	// pleg-nri's STOPPED for the crashed container and when the bench's subscriber of its stream
	// (through the front, as the kubelet's) received it; 0 in the other setups or when not seen.
	PlegNRIEmitted, PlegNRIReceived int64
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
	// OverlaidReads are pleg-nri's status reads answered with the stop already sent
	// (pleg_nri_overlaid_reads_total).
	OverlaidReads float64
	// KubeletCPU and PlegNRICPU are the CPU seconds (user+system) the kubelet and pleg-nri used from the
	// pods' creation to the last replacement running; Wall is that time.
	KubeletCPU, PlegNRICPU float64
	Wall                   time.Duration
}

// BenchmarkCrashRestart measures, for each setup, the time from a container's exit (its finished_at)
// to the creation and the start of the container the kubelet replaces it with (their created_at and
// started_at), over benchRounds*benchPods*benchContainers crash-restarts. With
// PLEG_NRI_KUBELET_BENCH_MD set it writes the table there (make bench-kubelet writes
// docs/kubelet-bench.md).
func BenchmarkCrashRestart(b *testing.B) {
	var runs []*benchRun
	setups := benchSetups(b)
	rounds, pods := benchShape(b)
	for round := 1; round <= rounds; round++ {
		for _, s := range setups {
			b.Run(fmt.Sprintf("round%d_%s", round, strings.ReplaceAll(s.Name, " ", "_")), func(b *testing.B) {
				var r *benchRun
				for i := 0; i < b.N; i++ {
					r = runCrashBench(b, s, pods)
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
	if path := os.Getenv(benchReportEnv); path != "" && len(runs) == rounds*len(setups) {
		if err := os.WriteFile(path, []byte(benchMarkdown(runs, setups, rounds, pods)), 0o644); err != nil {
			b.Fatal(err)
		}
		js, err := benchJSON(runs, setups, rounds)
		if err != nil {
			b.Fatal(err)
		}
		jsonPath := strings.TrimSuffix(path, ".md") + ".json"
		if err := os.WriteFile(jsonPath, js, 0o644); err != nil {
			b.Fatal(err)
		}
		b.Logf("wrote %s and %s", path, jsonPath)
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

func runCrashBench(b *testing.B, s setup, pods int) *benchRun {
	b.StopTimer()
	n := startNode(b, s, nodeOptions{quiet: true})
	// containerd replays to its stream's first subscriber the events of the pods the previous setup
	// left (kept 5 minutes): let them arrive before the run starts.
	time.Sleep(2 * time.Second)
	r := &benchRun{Setup: s, Before: n.plegMetrics()}
	watch := watchContainerdStops(b, n)
	// Where pleg-nri is attached, a subscriber of its stream stands in for the kubelet's: pleg-nri
	// sends its events as it would to the kubelet, and its STOPPED is timed.
	var plegNRIWatch *stopWatch
	if s.Attached {
		plegNRIWatch = watchStops(b, dialCRI(b, n.p.Socket), "pleg-nri")
	}
	kubeletCPU, plegNRICPU := processCPU(n.k.PID), 0.0
	if n.p != nil {
		plegNRICPU = processCPU(n.p.PID)
	}
	for i := 0; i < pods; i++ {
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
	for i := 0; i < pods; i++ {
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
			// pleg-nri's replacement can come before containerd has handled the exit (its status says
			// RUNNING until then): wait for containerd's own record of the exit.
			if old.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
				old = n.waitExited(old.GetId())
			}
			if old.GetMetadata().GetAttempt() != 0 || repl.GetMetadata().GetAttempt() != 1 || old.GetExitCode() != 1 {
				b.Fatalf("pod %s container %s: attempts %d (exit %d) and %d, want 0 (exit 1) and 1", name, name,
					old.GetMetadata().GetAttempt(), old.GetExitCode(), repl.GetMetadata().GetAttempt())
			}
			x := restartSample{Container: name, FinishedAt: old.GetFinishedAt(), Created: repl.GetCreatedAt(), Started: repl.GetStartedAt()}
			x.ContainerdDone, _ = watch.stopped(old.GetId())
			if plegNRIWatch != nil {
				x.PlegNRIEmitted, x.PlegNRIReceived = plegNRIWatch.stopped(old.GetId())
			}
			r.Samples = append(r.Samples, x)
		}
	}
	b.StopTimer()
	r.After = n.plegMetrics()
	r.Wall = r.After.At.Sub(r.Before.At)
	r.KubeletCPU = processCPU(n.k.PID) - kubeletCPU
	r.Load = loadAvg()
	if n.p != nil {
		r.PlegNRICPU = processCPU(n.p.PID) - plegNRICPU
		r.OverlaidReads, _ = n.p.Metric("pleg_nri_overlaid_reads_total")
	}
	created, started := r.latencies()
	b.Logf("%s: %d restarts; exit -> created p50 %.0f ms p90 %.0f ms max %.0f ms; exit -> started p50 %.0f ms; kubelet: %s",
		s.Name, len(r.Samples), benchreport.Median(created), benchreport.Quantile(created, 0.9), nodebench.Max(created),
		benchreport.Median(started), r.After)
	return r
}

// waitExited waits until containerd's status of container id says it exited, and returns it.
func (n *node) waitExited(id string) *runtimeapi.ContainerStatus {
	n.t.Helper()
	var st *runtimeapi.ContainerStatus
	err := harness.WaitFor(context.Background(), podWaitTimeout, "containerd to record the exit of "+id, func() (bool, error) {
		st = n.containerStatus(id)
		return st.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED, nil
	})
	if err != nil {
		n.t.Fatal(err)
	}
	return st
}

// stopWatch records, from an event stream (a subscriber of the bench's), when the STOPPED of each
// container was sent and received.
type stopWatch struct {
	mu sync.Mutex
	// at is the created_at of the first STOPPED of each container id, received when it reached the
	// watcher (ns since the epoch).
	at, received map[string]int64
	// status is the container's own status in that STOPPED, where the event carries it (containerd's
	// does): what the stream said of an exit the kubelet may since have removed.
	status map[string]*runtimeapi.ContainerStatus
}

// watchContainerdStops watches containerd's own stream, in every setup: containerd sends a container's
// STOPPED once it has handled the exit and updated the container's CRI status.
func watchContainerdStops(tb testing.TB, n *node) *stopWatch {
	return watchStops(tb, n.cri, "containerd")
}

// dialCRI returns a client of the CRI endpoint at socket, closed when the test ends.
func dialCRI(tb testing.TB, socket string) runtimeapi.RuntimeServiceClient {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return runtimeapi.NewRuntimeServiceClient(conn)
}

// watchStops subscribes to the event stream of cri (what names it in errors) until the test ends.
func watchStops(tb testing.TB, cri runtimeapi.RuntimeServiceClient, what string) *stopWatch {
	w := &stopWatch{at: map[string]int64{}, received: map[string]int64{}, status: map[string]*runtimeapi.ContainerStatus{}}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := cri.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		cancel()
		tb.Fatalf("%s GetContainerEvents: %v", what, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ev, err := stream.Recv()
			if err != nil {
				return
			}
			if ev.GetContainerEventType() == runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
				now := time.Now().UnixNano()
				w.mu.Lock()
				if _, seen := w.at[ev.GetContainerId()]; !seen {
					w.at[ev.GetContainerId()], w.received[ev.GetContainerId()] = ev.GetCreatedAt(), now
					for _, c := range ev.GetContainersStatuses() {
						if c.GetId() == ev.GetContainerId() {
							w.status[c.GetId()] = c
						}
					}
				}
				w.mu.Unlock()
			}
		}
	}()
	tb.Cleanup(func() {
		cancel()
		<-done
	})
	return w
}

// stopped returns the created_at of container id's first STOPPED and when the watcher received it (0s
// when it did not).
func (w *stopWatch) stopped(id string) (createdAt, received int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.at[id], w.received[id]
}

// stoppedStatus returns the container's status in its first STOPPED (nil when the event had none).
func (w *stopWatch) stoppedStatus(id string) *runtimeapi.ContainerStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status[id]
}

// processCPU returns the CPU seconds (user+system) process pid used so far (0 when it is gone).
func processCPU(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	// After the command: state is field 3 of stat; utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0
	}
	var utime, stime float64
	fmt.Sscan(f[11], &utime)
	fmt.Sscan(f[12], &stime)
	return (utime + stime) / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times (100 on every Linux this runs on).
const clockTicks = 100

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

// stagesOf merges, over every round of setup s, the time from a replacement's creation to its start.
func stagesOf(runs []*benchRun, s setup) []float64 {
	var out []float64
	for _, r := range runs {
		if r.Setup == s {
			for _, x := range r.Samples {
				out = append(out, float64(x.Started-x.Created)/1e6)
			}
		}
	}
	return out
}

// containerdStagesOf merges, over every round of setup s, the time from the exit to containerd's own
// STOPPED (containerd done with the exit) and from then to the replacement's creation (negative: the
// kubelet created the replacement while containerd was still handling the exit).
func containerdStagesOf(runs []*benchRun, s setup) (done, doneToCreated []float64) {
	for _, r := range runs {
		if r.Setup == s {
			for _, x := range r.Samples {
				if x.ContainerdDone != 0 {
					done = append(done, float64(x.ContainerdDone-x.FinishedAt)/1e6)
					doneToCreated = append(doneToCreated, float64(x.Created-x.ContainerdDone)/1e6)
				}
			}
		}
	}
	return done, doneToCreated
}

// cpuOf sums the CPU seconds and the wall time of setup s's rounds.
func cpuOf(runs []*benchRun, s setup) (kubelet, plegNRI float64, wall time.Duration) {
	for _, r := range runs {
		if r.Setup == s {
			kubelet, plegNRI, wall = kubelet+r.KubeletCPU, plegNRI+r.PlegNRICPU, wall+r.Wall
		}
	}
	return kubelet, plegNRI, wall
}

// benchJSON renders the figures of the markdown as JSON (docs/kubelet-bench-<version>.json).
func benchJSON(runs []*benchRun, setups []setup, rounds int) ([]byte, error) {
	type setupJSON struct {
		Name string `json:"name"`
		// ReadFreshness is pleg-nri's mode ("" when pleg-nri is not in the setup, "default" for its
		// default).
		ReadFreshness string `json:"read_freshness,omitempty"`
		// Attached: pleg-nri runs while the kubelet uses containerd's endpoint (a control setup);
		// NoStateDir: pleg-nri has no state-dir.
		Attached        bool                `json:"plegnri_attached_only,omitempty"`
		NoStateDir      bool                `json:"plegnri_no_state_dir,omitempty"`
		N               int                 `json:"n"`
		ExitToCreatedMs nodebench.Quantiles `json:"exit_to_created_ms"`
		// ExitToContainerdDoneMs is the exit to containerd's own STOPPED (containerd done with the exit),
		// ContainerdDoneToCreatedMs from then to the replacement's creation.
		ExitToContainerdDoneMs    nodebench.Quantiles `json:"exit_to_containerd_done_ms"`
		ContainerdDoneToCreatedMs nodebench.Quantiles `json:"containerd_done_to_created_ms"`
		ExitToStartedMs           nodebench.Quantiles `json:"exit_to_started_ms"`
		CreatedToStarted          nodebench.Quantiles `json:"created_to_started_ms"`
		// CPU seconds per minute of the runs' wall time.
		KubeletCPUPerMin float64  `json:"kubelet_cpu_seconds_per_minute"`
		PlegNRICPUPerMin *float64 `json:"plegnri_cpu_seconds_per_minute,omitempty"`
		OverlaidReads    *float64 `json:"plegnri_overlaid_reads,omitempty"`
		// ExitToPlegNRIEmittedMs and ExitToPlegNRIReceivedMs (attached setups): the exit to pleg-nri's
		// STOPPED's created_at and to its receipt by the bench's subscriber of pleg-nri's stream.
		ExitToPlegNRIEmittedMs  *nodebench.Quantiles `json:"exit_to_plegnri_emitted_ms,omitempty"`
		ExitToPlegNRIReceivedMs *nodebench.Quantiles `json:"exit_to_plegnri_received_ms,omitempty"`
	}
	out := struct {
		Kubelet    string      `json:"kubelet"`
		Containerd string      `json:"containerd"`
		Date       string      `json:"date"`
		CPUs       int         `json:"cpus"`
		Rounds     int         `json:"rounds"`
		Loads      []string    `json:"load_at_end_of_each_run"`
		Setups     []setupJSON `json:"setups"`
		// Controls compare the control setups with the others, where they ran.
		Controls []nodebench.ComparisonJSON `json:"controls,omitempty"`
	}{Kubelet: kubeletVersion, Containerd: strings.Fields(commandOutput(env.BinDir+"/containerd", "--version") + " ? ? ?")[2],
		Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Rounds: rounds}
	for _, r := range runs {
		out.Loads = append(out.Loads, r.Load)
	}
	for _, s := range setups {
		created, started := latenciesOf(runs, s)
		kcpu, pcpu, wall := cpuOf(runs, s)
		done, doneToCreated := containerdStagesOf(runs, s)
		j := setupJSON{Name: s.Name, N: len(created), ExitToCreatedMs: nodebench.QuantilesOf(created), ExitToStartedMs: nodebench.QuantilesOf(started),
			ExitToContainerdDoneMs: nodebench.QuantilesOf(done), ContainerdDoneToCreatedMs: nodebench.QuantilesOf(doneToCreated),
			CreatedToStarted: nodebench.QuantilesOf(stagesOf(runs, s)), KubeletCPUPerMin: math.Round(kcpu/wall.Minutes()*1000) / 1000}
		if s.runsPlegNRI() {
			j.Attached, j.NoStateDir = s.Attached, s.NoStateDir
			j.ReadFreshness = s.Freshness
			if j.ReadFreshness == "" {
				j.ReadFreshness = "default"
			}
			perMin := math.Round(pcpu/wall.Minutes()*1000) / 1000
			j.PlegNRICPUPerMin = &perMin
			var overlaid float64
			for _, r := range runs {
				if r.Setup == s {
					overlaid += r.OverlaidReads
				}
			}
			j.OverlaidReads = &overlaid
		}
		if s.Attached {
			emitted, received := nodebench.QuantilesOf(plegNRIStagesOf(runs, s, false)), nodebench.QuantilesOf(plegNRIStagesOf(runs, s, true))
			j.ExitToPlegNRIEmittedMs, j.ExitToPlegNRIReceivedMs = &emitted, &received
		}
		out.Setups = append(out.Setups, j)
	}
	for _, c := range controlComparisons(runs, setups) {
		out.Controls = append(out.Controls, c.JSON())
	}
	return json.MarshalIndent(out, "", "  ")
}

// benchMarkdown renders docs/kubelet-bench-<version>.md from the runs, in the order of setups.
func benchMarkdown(runs []*benchRun, setups []setup, rounds, pods int) string {
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
	p("Each setup runs its own kubelet against the same containerd; %d rounds of the %d setups in turn, %d pods of %d",
		rounds, len(setups), pods, benchContainers)
	p("busybox container(s) per round. Each container exits 1 once (the first %s after it started, each next one %s",
		benchFirstExit, benchSpacing)
	p("later) and the kubelet restarts it: a container's first restart has no crash-loop back-off. From containerd's")
	p("statuses, in nanoseconds: the crashed container's `finished_at` to its replacement's `created_at` (the kubelet")
	p("noticed the exit and acted) and `started_at` (the replacement runs).")
	p("")
	p("| setup | restarts | exit → created p50 | p90 | max | exit → started p50 | p90 | max | created → started p50 | p90 | kubelet CPU s/min | pleg-nri CPU s/min |")
	p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	p50 := map[string]float64{}
	for _, s := range setups {
		created, started := latenciesOf(runs, s)
		stage := stagesOf(runs, s)
		kcpu, pcpu, wall := cpuOf(runs, s)
		pcell := "-"
		if s.runsPlegNRI() {
			pcell = fmt.Sprintf("%.2f", pcpu/wall.Minutes())
		}
		p50[s.Name] = benchreport.Median(created)
		p("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %.2f | %s |", s.Name, len(created),
			nodebench.Ms(benchreport.Median(created)), nodebench.Ms(benchreport.Quantile(created, 0.9)), nodebench.Ms(nodebench.Max(created)),
			nodebench.Ms(benchreport.Median(started)), nodebench.Ms(benchreport.Quantile(started, 0.9)), nodebench.Ms(nodebench.Max(started)),
			nodebench.Ms(benchreport.Median(stage)), nodebench.Ms(benchreport.Quantile(stage, 0.9)), kcpu/wall.Minutes(), pcell)
	}
	p("")
	generic, direct, ours := p50[setupGeneric.Name], p50[setupEventedDirect.Name], p50[setupEventedPlegNRI.Name]
	dCreated, dStarted := latenciesOf(runs, setupEventedDirect)
	oCreated, oStarted := latenciesOf(runs, setupEventedPlegNRI)
	dS50, dS90 := benchreport.Median(dStarted), benchreport.Quantile(dStarted, 0.9)
	oS50, oS90 := benchreport.Median(oStarted), benchreport.Quantile(oStarted, 0.9)
	p("Goals (%s with its default read-freshness):", setupEventedPlegNRI.Name)
	p("")
	p("- exit → created p50: %s, %.2fx sooner than %s (goal: at least 10x): %s.", nodebench.Ms(ours), generic/ours, setupGeneric.Name,
		met(generic/ours >= 10))
	p("- exit → created p50: %s against %s's %s, %.2f of it (goal: at most half): %s.", nodebench.Ms(ours), setupEventedDirect.Name,
		nodebench.Ms(direct), ours/direct, met(ours <= direct/2))
	p("- exit → started p50: %s against %s (goal: at least 20 ms sooner): %s; p90: %s against %s (goal: sooner): %s.",
		nodebench.Ms(oS50), nodebench.Ms(dS50), met(oS50 <= dS50-20), nodebench.Ms(oS90), nodebench.Ms(dS90), met(oS90 < dS90))
	p("- %s minus %s, with 95 %% bootstrap intervals (an interval holding 0 cannot tell a gain from this run's noise): "+
		"exit → created p50 %s; exit → started p50 %s, p90 %s.", setupEventedPlegNRI.Name, setupEventedDirect.Name,
		benchreport.QuantileDiff(oCreated, dCreated, 0.5), benchreport.QuantileDiff(oStarted, dStarted, 0.5),
		benchreport.QuantileDiff(oStarted, dStarted, 0.9))
	// Another commit's build of pleg-nri (benchBaselineEnv) against this one: no worse is an interval that
	// holds 0 or lies below it.
	for _, s := range setups {
		if s.Binary == "" {
			continue
		}
		bCreated, bStarted := latenciesOf(runs, s)
		p("- %s minus %s, the same: exit → created p50 %s, p90 %s; exit → started p50 %s, p90 %s.", setupEventedPlegNRI.Name, s.Name,
			benchreport.QuantileDiff(oCreated, bCreated, 0.5), benchreport.QuantileDiff(oCreated, bCreated, 0.9),
			benchreport.QuantileDiff(oStarted, bStarted, 0.5), benchreport.QuantileDiff(oStarted, bStarted, 0.9))
	}
	p("")
	p("Where the time goes, p50 of each stage per setup (containerd done: the `created_at` of containerd's own STOPPED for")
	p("the crashed container, read by the bench from containerd's stream in every setup; containerd sends it once it has")
	p("handled the exit and updated the CRI status):")
	p("")
	p("| setup | exit → containerd done | containerd done → created | exit → created | created → started | exit → started |")
	p("| --- | ---: | ---: | ---: | ---: | ---: |")
	for _, s := range setups {
		created, started := latenciesOf(runs, s)
		done, doneToCreated := containerdStagesOf(runs, s)
		p("| %s | %s | %s | %s | %s | %s |", s.Name, nodebench.Ms(benchreport.Median(done)), nodebench.Ms(benchreport.Median(doneToCreated)),
			nodebench.Ms(benchreport.Median(created)), nodebench.Ms(benchreport.Median(stagesOf(runs, s))), nodebench.Ms(benchreport.Median(started)))
	}
	p("")
	p("Each round, and what its kubelet's metrics said from the pods' creation to the last replacement:")
	p("")
	p("| round | setup | exit → created p50 | evented_pleg_connection_success_count | evented_pleg_connection_error_count | relists during the run | pod relists | events received during the run (before it) | event created → handled by the kubelet, mean | reads overlaid | load at end |")
	p("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, r := range runs {
		created, _ := r.latencies()
		overlaid := "-"
		if r.Setup.runsPlegNRI() {
			overlaid = fmt.Sprintf("%g", r.OverlaidReads)
		}
		events := r.After.EventsReceived - r.Before.EventsReceived
		delivery := math.NaN()
		if events > 0 {
			delivery = (r.After.EventLatency - r.Before.EventLatency) / events * 1000
		}
		p("| %d | %s | %s | %g | %g | %g | %g | %g (%g) | %s | %s | %s |", r.Round, r.Setup.Name, nodebench.Ms(benchreport.Median(created)),
			r.After.ConnSuccess, r.After.ConnError, r.After.Relists-r.Before.Relists, r.After.PodRelists-r.Before.PodRelists,
			events, r.Before.EventsReceived, nodebench.Ms(delivery), overlaid, r.Load)
	}
	p("")
	p("Events received are the observations of `kubelet_evented_pleg_connection_latency_seconds`. Those before the run,")
	p("with containerd's stream, are containerd replaying to its stream's first subscriber the events of the previous")
	p("setup's pods (removed while nobody listened; containerd keeps them for 5 minutes). Reads overlaid: the status")
	p("reads pleg-nri answered with the stop it had sent while containerd's answer still showed the container running")
	p("(`pleg_nri_overlaid_reads_total`). Event created → handled: the mean of `kubelet_evented_pleg_connection_latency_seconds`, from the")
	p("event's `created_at` (containerd: once it has handled the exit; pleg-nri: as soon as it learns of it) to the")
	p("kubelet's handling. The kubelets run with --v=2 and pleg-nri at log level info, as in production.")
	p("")
	p("Every sample, exit → created, sorted:")
	p("")
	for _, s := range setups {
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
	p("sends STOPPED before containerd's CRI says the container exited; the kubelet then reads the pod through pleg-nri")
	p("(1.37: the relist the STOPPED requests; 1.36: its on-demand relist after a sync), and what it gets for the exited")
	p("container while containerd is behind depends on pleg-nri's `read-freshness` (see docs/internals.md): overlay answers with")
	p("the stop already sent (reads overlaid), hold waits for containerd (reads held), off forwards containerd's RUNNING.")
	if cs := controlComparisons(runs, setups); len(cs) > 0 {
		p("")
		controlsMarkdown(p, runs, setups, cs)
	}
	return b.String()
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

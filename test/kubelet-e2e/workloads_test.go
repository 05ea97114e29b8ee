package kubelete2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/nodebench"
)

// The workload benchmark (make bench-workloads, issue 59), standalone: per setup and round,
// workloadPods pods of each workload, one after the other:
//   - init chain: initContainers init containers that each exit 0 at once, then an app that runs; from
//     containerd's timestamps, the sandbox's creation to the app's start, and each step from an init
//     container's exit to the creation of the container after it;
//   - job: restartPolicy Never, one container that exits 0 after jobRun; from its exit (finished_at) to
//     the kubelet's status saying Succeeded (its read-only /pods, which is the status manager's status:
//     what a kubelet with an API server writes there; polled every jobPoll), and to the sandbox stopped
//     by the kubelet's terminating sync (containerd's STOPPED for the sandbox);
//   - crash: restartPolicy Always, a container that exits 1 after crashAfter, once (the pod's emptyDir
//     remembers it, so the replacement runs on and the kubelet's back-off never comes in); from the exit
//     to the restart count in the kubelet's status (/pods, polled every jobPoll) and to the
//     replacement's start;
//   - sidecar OOM: a sidecar (restartable init container) under a memory limit that is OOM-killed once
//     after crashAfter, beside an app; from the kill to the sidecar's replacement started.
//
// The rounds run the setups in turn, so a change of the shared machine's load hits each alike.
const (
	workloadRounds = 3
	workloadPods   = 8
	initContainers = 3
	jobRun         = 100 * time.Millisecond
	jobPoll        = 10 * time.Millisecond
	// crashAfter is how long the crashing containers run first: beyond the 1 s in which
	// refresh-after-stop treats an exit as early, as a container that crashes in service.
	crashAfter = 1500 * time.Millisecond
	// workloadGap separates a pod's end from the next pod's manifest, in steps that are not a divisor of
	// the 1 s relist, so the pods start at every phase of it.
	workloadGap = 370 * time.Millisecond
	// workloadReportEnv names the markdown file BenchmarkWorkloads writes; the JSON goes beside it.
	workloadReportEnv = "PLEG_NRI_WORKLOADS_MD"
	// workloadVerbosityEnv runs the kubelets with that --v (default 2, as in production) and pleg-nri
	// with its detailed log, to read what they did (with PLEG_NRI_KUBELET_KEEP_LOGS).
	workloadVerbosityEnv = "PLEG_NRI_WORKLOADS_V"
	// workloadSetupsEnv chooses setups by index in workloadSetups ("0,2"): for a run of fewer.
	workloadSetupsEnv = "PLEG_NRI_WORKLOADS_SETUPS"
	// workloadLoadEnv keeps the node busy while the workloads run (issue 59, item 5): "cpu:N" runs N
	// busy loops (host processes at the kubelet's and containerd's priority) from the first pod of a run
	// to its last, so containerd's exit handling and the kubelet's syncs compete for the CPUs.
	workloadLoadEnv = "PLEG_NRI_WORKLOADS_LOAD"
)

// setupPlegNRIRefresh is pleg-nri with refresh-after-stop, as docs/operations.md configures it for
// kubelet 1.37 since issue 59 (an early exit's STOPPED is sent again).
var setupPlegNRIRefresh = setup{Name: "EventedPLEG on pleg-nri (refresh-after-stop)", Evented: true, PlegNRI: true, RefreshAfterStop: true}

// workloadSetups are GenericPLEG, EventedPLEG on containerd's stream, and EventedPLEG on pleg-nri as
// docs/operations.md configures it for the kubelet under test (1.35, 1.36: refresh-after-stop and
// cache-tick; 1.37: refresh-after-stop, and pleg-nri's defaults before it, to compare in the same
// run); unless workloadSetupsEnv chooses some (indexes).
func workloadSetups(tb testing.TB) []setup {
	all := []setup{setupGeneric, setupEventedDirect, setupPlegNRITick}
	if eventsTriggerRelist() {
		all = []setup{setupGeneric, setupEventedDirect, setupEventedPlegNRI, setupPlegNRIRefresh}
	}
	v := os.Getenv(workloadSetupsEnv)
	if v == "" {
		return all
	}
	var out []setup
	for _, f := range strings.Split(v, ",") {
		i, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || i < 0 || i >= len(all) {
			tb.Fatalf("%s=%q: want indexes of %d setups", workloadSetupsEnv, v, len(all))
		}
		out = append(out, all[i])
	}
	return out
}

// BenchmarkWorkloads measures the init chain and the job pod per setup (see above).
func BenchmarkWorkloads(b *testing.B) {
	setups := workloadSetups(b)
	results := make([]nodebench.WorkloadSetup, len(setups))
	for i, s := range setups {
		results[i].Name = s.Name
	}
	rounds, pods := workloadRounds, workloadPods
	if v := os.Getenv(benchRoundsEnv); v != "" {
		rounds, _ = strconv.Atoi(v)
	}
	if v := os.Getenv(benchPodsEnv); v != "" {
		pods, _ = strconv.Atoi(v)
	}
	var loads []string
	for round := 1; round <= rounds; round++ {
		for i, s := range setups {
			b.Run(fmt.Sprintf("round%d_%s", round, strings.NewReplacer(" ", "_", ",", "").Replace(s.Name)), func(b *testing.B) {
				for range b.N {
					w := runWorkloads(b, s, round, pods)
					results[i].Chains = append(results[i].Chains, w.Chains...)
					results[i].Jobs = append(results[i].Jobs, w.Jobs...)
					results[i].Crashes = append(results[i].Crashes, w.Crashes...)
					results[i].OOMs = append(results[i].OOMs, w.OOMs...)
				}
				loads = append(loads, loadAvg())
			})
		}
	}
	b.Logf("\n%s", nodebench.WorkloadTable(results))
	path := os.Getenv(workloadReportEnv)
	if path == "" || len(loads) < rounds*len(setups) {
		return
	}
	if err := os.WriteFile(path, []byte(workloadMarkdown(path, results, rounds, pods, loads)), 0o644); err != nil {
		b.Fatal(err)
	}
	js, err := json.MarshalIndent(struct {
		Kubelet string                    `json:"kubelet"`
		Date    string                    `json:"date"`
		CPUs    int                       `json:"cpus"`
		Loads   []string                  `json:"load_at_end_of_each_run"`
		Setups  []nodebench.WorkloadSetup `json:"setups"`
	}{kubeletVersion, time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), loads, results}, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(strings.TrimSuffix(path, ".md")+".json", js, 0o644); err != nil {
		b.Fatal(err)
	}
	title := fmt.Sprintf("Workloads on kubelet %s, standalone (%s)", kubeletVersion, time.Now().UTC().Format("2006-01-02"))
	if v := os.Getenv(workloadLoadEnv); v != "" {
		title += ", node kept busy: " + v
	}
	if err := os.WriteFile(strings.TrimSuffix(path, ".md")+".svg", []byte(nodebench.WorkloadSVG(title, results)), 0o644); err != nil {
		b.Fatal(err)
	}
	b.Logf("wrote %s", path)
}

// initChainPod is pod i's init chain: initContainers init containers that exit 0 at once, then an app
// that runs.
func initChainPod(i int) kubelet.Pod {
	p := kubelet.Pod{Name: fmt.Sprintf("chain%02d", i), HostNetwork: true,
		Containers: []kubelet.Container{{Name: "app", Script: "exec sleep 3600"}}}
	for k := 1; k <= initContainers; k++ {
		p.InitContainers = append(p.InitContainers, kubelet.Container{Name: fmt.Sprintf("init%d", k), Script: "exit 0"})
	}
	return p
}

// jobPod is pod i of the job workload.
func jobPod(i int) kubelet.Pod {
	return kubelet.Pod{Name: fmt.Sprintf("job%02d", i), HostNetwork: true, RestartPolicy: "Never",
		Containers: []kubelet.Container{{Name: "work", Script: fmt.Sprintf("sleep %.3f; exit 0", jobRun.Seconds())}}}
}

// crashPod is pod i of the crash workload: its container exits 1 after crashAfter, the first time only.
func crashPod(i int) kubelet.Pod {
	return kubelet.Pod{Name: fmt.Sprintf("crash%02d", i), HostNetwork: true,
		Containers: []kubelet.Container{{Name: "app", State: true, Script: onceThen("crashed", fmt.Sprintf("sleep %.1f; exit 1", crashAfter.Seconds()))}}}
}

// sidecarOOMPod is pod i of the sidecar OOM workload: a sidecar OOM-killed after crashAfter, the first
// time only, beside an app.
func sidecarOOMPod(i int) kubelet.Pod {
	return kubelet.Pod{Name: fmt.Sprintf("oom%02d", i), HostNetwork: true,
		InitContainers: []kubelet.Container{{Name: "sidecar", RestartPolicy: "Always", MemoryLimit: "32Mi", State: true,
			Script: onceThen("oomed", fmt.Sprintf("sleep %.1f; exec tail /dev/zero", crashAfter.Seconds()))}},
		Containers: []kubelet.Container{{Name: "app", Script: "exec sleep 3600"}}}
}

// onceThen is a script that runs first the first time (marking it in the pod's emptyDir) and sleeps on
// every later run.
func onceThen(mark, first string) string {
	m := kubelet.StateMount + "/" + mark
	return fmt.Sprintf("[ -e %s ] && exec sleep 3600; touch %s; %s", m, m, first)
}

func runWorkloads(b *testing.B, s setup, round, pods int) nodebench.WorkloadSetup {
	b.StopTimer()
	opts := nodeOptions{quiet: true, noDupWatch: true}
	if v := os.Getenv(workloadVerbosityEnv); v != "" {
		// Detailed logs: pleg-nri's too.
		opts.quiet = false
		opts.verbosity, _ = strconv.Atoi(v)
	}
	n := startNode(b, s, opts)
	// containerd replays to its stream's first subscriber the events of the pods the previous setup
	// left: let them arrive before the run starts.
	time.Sleep(2 * time.Second)
	containerdStops := watchContainerdStops(b, n)
	var plegNRIStops *stopWatch
	if n.p != nil {
		plegNRIStops = watchStops(b, dialCRI(b, n.p.Socket), "pleg-nri")
	}
	stopsOf := func(id string) (containerd, plegNRI int64) {
		containerd, _ = containerdStops.stopped(id)
		if plegNRIStops != nil {
			plegNRI, _ = plegNRIStops.stopped(id)
		}
		return containerd, plegNRI
	}
	stopLoad := startWorkloadLoad(b, os.Getenv(workloadLoadEnv))
	b.StartTimer()
	var chains []nodebench.InitChain
	for i := range pods {
		time.Sleep(time.Duration(i%3) * workloadGap)
		chains = append(chains, n.runInitChain(initChainPod(i), fmt.Sprintf("%d/%02d", round, i), stopsOf))
	}
	var jobs []nodebench.Job
	for i := range pods {
		time.Sleep(time.Duration(i%3) * workloadGap)
		jobs = append(jobs, n.runJob(jobPod(i), fmt.Sprintf("%d/%02d", round, i), stopsOf, containerdStops))
	}
	var crashes, ooms []nodebench.Restart
	for i := range pods {
		time.Sleep(time.Duration(i%3) * workloadGap)
		crashes = append(crashes, n.runRestart(crashPod(i), "app", fmt.Sprintf("%d/%02d", round, i), stopsOf, containerdStops))
	}
	for i := range pods {
		time.Sleep(time.Duration(i%3) * workloadGap)
		ooms = append(ooms, n.runRestart(sidecarOOMPod(i), "sidecar", fmt.Sprintf("%d/%02d", round, i), stopsOf, containerdStops))
	}
	b.StopTimer()
	stopLoad()
	w := nodebench.WorkloadSetup{Name: s.Name, Chains: chains, Jobs: jobs, Crashes: crashes, OOMs: ooms}
	b.Logf("%s, round %d:\n%s", s.Name, round, nodebench.WorkloadTable([]nodebench.WorkloadSetup{w}))
	return w
}

// runRestart writes pod p, polls the kubelet's status every jobPoll until container name's restart count
// is 1, waits for its replacement to run, and reads both containers' times from containerd. The kubelet
// may have removed the first container by then (its dead-container cleanup after the ContainerDied,
// seen once in 24 on 1.36.3 with GenericPLEG): its exit is then read from containerd's STOPPED of it,
// which carries its status.
func (n *node) runRestart(p kubelet.Pod, name, key string, stopsOf func(id string) (int64, int64), containerdStops *stopWatch) nodebench.Restart {
	n.t.Helper()
	if err := n.k.WritePod(p); err != nil {
		n.t.Fatal(err)
	}
	r := nodebench.Restart{Key: key}
	statusOf := func(st *kubelet.PodStatus) *kubelet.ContainerStatus {
		for _, list := range [][]kubelet.ContainerStatus{st.Status.ContainerStatuses, st.Status.InitContainerStatuses} {
			for i := range list {
				if list[i].Name == name {
					return &list[i]
				}
			}
		}
		return nil
	}
	var st *kubelet.PodStatus
	r.Counted, st = n.pollPod(p.Name, "container "+name+" restarted", podWaitTimeout+crashAfter, func(got *kubelet.PodStatus) (bool, error) {
		c := statusOf(got)
		if c != nil && c.RestartCount > 1 {
			return false, fmt.Errorf("container %s restarted %d times, want once", name, c.RestartCount)
		}
		return c != nil && c.RestartCount == 1, nil
	})
	var first, second *runtimeapi.ContainerStatus
	err := harness.WaitFor(context.Background(), podWaitTimeout, fmt.Sprintf("pod %s: container %s's replacement to run", p.Name, name), func() (bool, error) {
		first, second = nil, nil
		for _, c := range n.containers(st.Metadata.UID) {
			if c.GetMetadata().GetName() != name {
				continue
			}
			switch c.GetMetadata().GetAttempt() {
			case 0:
				first = c
			case 1:
				second = c
			default:
				return false, fmt.Errorf("container %s has attempt %d: it restarted more than once", name, c.GetMetadata().GetAttempt())
			}
		}
		return second != nil && second.GetStartedAt() != 0, nil
	})
	if err != nil {
		n.t.Fatal(err)
	}
	switch {
	case first == nil:
		// Removed by the kubelet: the kubelet's status names it (lastState), containerd's STOPPED has
		// its exit.
		st = n.waitPod(p.Name, "container "+name+"'s last state", func(got *kubelet.PodStatus) (bool, error) {
			c := statusOf(got)
			return c != nil && c.LastState.Terminated != nil && c.LastState.Terminated.ContainerID != "", nil
		})
		id := strings.TrimPrefix(statusOf(st).LastState.Terminated.ContainerID, "containerd://")
		if first = containerdStops.stoppedStatus(id); first == nil {
			n.t.Fatalf("pod %s: container %s (%s) was removed, and containerd's stream had no status of its exit", p.Name, name, id)
		}
		r.Removed = true
	case first.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED:
		first = n.waitExited(first.GetId())
	}
	r.Finished, r.Reason = first.GetFinishedAt(), first.GetReason()
	r.Created, r.Started = second.GetCreatedAt(), second.GetStartedAt()
	r.ContainerdStopped, r.PlegNRIStopped = stopsOf(first.GetId())
	return r
}

// runInitChain writes pod p, waits for its app to run, and reads its timestamps from containerd.
func (n *node) runInitChain(p kubelet.Pod, key string, stopsOf func(id string) (int64, int64)) nodebench.InitChain {
	n.t.Helper()
	if err := n.k.WritePod(p); err != nil {
		n.t.Fatal(err)
	}
	st := n.waitPod(p.Name, "app running after its init containers", running)
	c := nodebench.InitChain{Key: key}
	sbs := n.sandboxes(st.Metadata.UID)
	if len(sbs) != 1 {
		n.t.Fatalf("pod %s has %d sandboxes, want 1", p.Name, len(sbs))
	}
	c.SandboxCreated = sbs[0].GetCreatedAt()
	byName := map[string]*runtimeapi.ContainerStatus{}
	for _, ctr := range n.containers(st.Metadata.UID) {
		if _, dup := byName[ctr.GetMetadata().GetName()]; dup {
			n.t.Fatalf("pod %s: containerd has two containers named %s (an init container ran twice)", p.Name, ctr.GetMetadata().GetName())
		}
		byName[ctr.GetMetadata().GetName()] = ctr
	}
	times := func(name string) nodebench.Times {
		ctr := byName[name]
		if ctr == nil {
			n.t.Fatalf("pod %s: containerd has no container %s", p.Name, name)
		}
		// The kubelet can go on before containerd handled an exit (pleg-nri reports it at once).
		if name != "app" && ctr.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
			ctr = n.waitExited(ctr.GetId())
		}
		if name != "app" && ctr.GetExitCode() != 0 {
			n.t.Fatalf("pod %s: init container %s exited %d", p.Name, name, ctr.GetExitCode())
		}
		t := nodebench.Times{Created: ctr.GetCreatedAt(), Started: ctr.GetStartedAt(), Finished: ctr.GetFinishedAt()}
		t.ContainerdStopped, t.PlegNRIStopped = stopsOf(ctr.GetId())
		return t
	}
	for _, ic := range p.InitContainers {
		c.Inits = append(c.Inits, times(ic.Name))
	}
	c.App = times("app")
	return c
}

// runJob writes pod p, polls the kubelet's status every jobPoll until it says Succeeded, and reads the
// exit from containerd and the sandbox's stop from containerd's stream.
func (n *node) runJob(p kubelet.Pod, key string, stopsOf func(id string) (int64, int64), containerdStops *stopWatch) nodebench.Job {
	n.t.Helper()
	if err := n.k.WritePod(p); err != nil {
		n.t.Fatal(err)
	}
	j := nodebench.Job{Key: key}
	var st *kubelet.PodStatus
	j.Succeeded, st = n.pollPod(p.Name, "Succeeded", podWaitTimeout, func(got *kubelet.PodStatus) (bool, error) {
		if got.Status.Phase == "Failed" {
			return false, fmt.Errorf("pod %s failed", p.Name)
		}
		return got.Status.Phase == "Succeeded", nil
	})
	ctrs := n.containers(st.Metadata.UID)
	if len(ctrs) != 1 {
		n.t.Fatalf("pod %s: containerd has %d containers, want 1", p.Name, len(ctrs))
	}
	ctr := ctrs[0]
	if ctr.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
		ctr = n.waitExited(ctr.GetId())
	}
	j.Finished = ctr.GetFinishedAt()
	j.ContainerdStopped, j.PlegNRIStopped = stopsOf(ctr.GetId())
	sbs := n.sandboxes(st.Metadata.UID)
	if len(sbs) != 1 {
		n.t.Fatalf("pod %s has %d sandboxes, want 1", p.Name, len(sbs))
	}
	err := harness.WaitFor(context.Background(), podWaitTimeout, "the kubelet to stop the sandbox of "+p.Name, func() (bool, error) {
		j.SandboxStopped, _ = containerdStops.stopped(sbs[0].GetId())
		return j.SandboxStopped != 0, nil
	})
	if err != nil {
		n.t.Fatal(err)
	}
	return j
}

// workloadMarkdown renders docs/workloads-standalone-<version>.md.
func workloadMarkdown(mdPath string, setups []nodebench.WorkloadSetup, rounds, pods int, loads []string) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# Workloads on a standalone kubelet %s, by PLEG", kubeletVersion)
	p("")
	p("Made by `make bench-workloads KUBELET_VERSION=%s` (`go test -run '^$' -bench BenchmarkWorkloads -benchtime 1x ./test/kubelet-e2e/`) on %s.",
		kubeletVersion, time.Now().UTC().Format("2006-01-02 15:04 MST"))
	p("Kubelet `%s` (unmodified, standalone: static pods, no API server), containerd %s, %d CPUs, kernel %s.",
		commandOutput(kubeletBinary, "--version"), strings.Fields(commandOutput(env.BinDir+"/containerd", "--version") + " ? ? ?")[2],
		runtime.NumCPU(), commandOutput("uname", "-r"))
	p("%d rounds of the %d setups in turn; per round and setup, %d pods of each workload (init chain, job, crash, sidecar OOM), one after the other.",
		rounds, len(setups), pods)
	p("Init chain: %d init containers that each `exit 0`, then an app; times from containerd's `created_at`, `started_at`,", initContainers)
	p("`finished_at`. Job: restartPolicy Never, one container `sleep %.1f; exit 0`; its `finished_at` to phase `Succeeded` in the", jobRun.Seconds())
	p("kubelet's read-only `/pods` (the status manager's status, what a kubelet with an API server writes there; polled every")
	p("%s, so up to that much late), and to containerd's STOPPED of the pod's sandbox (the kubelet's terminating sync).", jobPoll)
	p("Crash: restartPolicy Always, a container that exits 1 after %.1f s, once; its `finished_at` to a restart count of 1 in `/pods`", crashAfter.Seconds())
	p("(polled the same way) and to the replacement's `started_at`. Sidecar OOM: a restartable init container under a 32 MiB")
	p("limit that runs `tail /dev/zero` after %.1f s, once, beside an app; its `finished_at` to its replacement's `started_at`.", crashAfter.Seconds())
	if v := os.Getenv(workloadLoadEnv); v != "" {
		p("The node was kept busy all along: %s.", describeWorkloadLoad(v))
	}
	p("Load average at the end of each run: %s.", strings.Join(loads, "; "))
	p("")
	p("%s", nodebench.WorkloadTable(setups))
	p("")
	p("Every sample, per workload and setup: [%s](%s).", strings.TrimSuffix(filepath.Base(mdPath), ".md")+".svg", strings.TrimSuffix(filepath.Base(mdPath), ".md")+".svg")
	p("")
	if len(setups) > 1 {
		subject := setups[len(setups)-1].Name
		p("Paired differences (the samples of the same round and pod; for a step, of the same step), %s minus each other setup:", subject)
		p("")
		p("%s", nodebench.ComparisonsMarkdown(nodebench.WorkloadComparisons(setups, subject)))
	}
	p("The first exit's reason, as containerd gives it, per setup (crash; sidecar OOM):")
	p("")
	for _, s := range setups {
		p("- %s: %s; %s", s.Name, reasons(s.Crashes), reasons(s.OOMs))
	}
	p("")
	p("First containers the kubelet had removed before the bench read them (their exit read from containerd's STOPPED, which carries their status): %s.",
		removedSamples(setups))
	p("")
	p("Every init-chain step (exit → next created, ms), per setup, in the order of the samples:")
	p("")
	for _, s := range setups {
		var cells []string
		for _, c := range s.Chains {
			var steps []string
			for _, v := range c.StepsMs() {
				steps = append(steps, fmt.Sprintf("%.0f", v))
			}
			cells = append(cells, c.Key+" "+strings.Join(steps, "/"))
		}
		p("- %s: %s", s.Name, strings.Join(cells, ", "))
	}
	p("")
	p("Where each slow step's time went, from pleg-nri's and containerd's STOPPED (ms after the init container's exit):")
	p("")
	p("| setup | sample/step | step | pleg-nri STOPPED | containerd STOPPED | the container ran (created → finished) |")
	p("| --- | --- | ---: | ---: | ---: | ---: |")
	for _, s := range setups {
		for _, c := range s.Chains {
			for i, v := range c.StepsMs() {
				if v <= nodebench.SlowStep {
					continue
				}
				x := c.Inits[i]
				at := func(t int64) string {
					if t == 0 {
						return "-"
					}
					return nodebench.Ms(float64(t-x.Finished) / 1e6)
				}
				p("| %s | %s/s%d | %s | %s | %s | %s |", s.Name, c.Key, i+1, nodebench.Ms(v), at(x.PlegNRIStopped), at(x.ContainerdStopped),
					nodebench.Ms(float64(x.Finished-x.Created)/1e6))
			}
		}
	}
	return b.String()
}

// reasons counts the exit reasons of the restarts ("OOMKilled x24").
func reasons(rs []nodebench.Restart) string {
	count := map[string]int{}
	for _, r := range rs {
		count[r.Reason]++
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(count)) {
		out = append(out, fmt.Sprintf("%s x%d", k, count[k]))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// startWorkloadLoad starts the load spec describes (workloadLoadEnv; "" is none) and returns what stops
// it, which the test's cleanup also does.
func startWorkloadLoad(tb testing.TB, spec string) (stop func()) {
	if spec == "" {
		return func() {}
	}
	n, err := parseWorkloadLoad(spec)
	if err != nil {
		tb.Fatal(err)
	}
	var procs []*exec.Cmd
	for range n {
		c := exec.Command("sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			tb.Fatalf("%s: %v", workloadLoadEnv, err)
		}
		procs = append(procs, c)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			for _, c := range procs {
				_ = c.Process.Kill()
				_ = c.Wait()
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}

// parseWorkloadLoad reads workloadLoadEnv's "cpu:N" (1 <= N <= 64).
func parseWorkloadLoad(spec string) (int, error) {
	v, ok := strings.CutPrefix(spec, "cpu:")
	n, err := strconv.Atoi(v)
	if !ok || err != nil || n < 1 || n > 64 {
		return 0, fmt.Errorf("%s=%q: want cpu:N, N busy loops (1 to 64)", workloadLoadEnv, spec)
	}
	return n, nil
}

// describeWorkloadLoad says in the report what load spec ran.
func describeWorkloadLoad(spec string) string {
	n, err := parseWorkloadLoad(spec)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("`%s=%s`, %d busy shell loops (`while :; do :; done`, host processes at the kubelet's and containerd's priority) from each run's first pod to its last, on %d CPUs",
		workloadLoadEnv, spec, n, runtime.NumCPU())
}

// removedSamples lists the restarts whose first container the kubelet had removed, per setup.
func removedSamples(setups []nodebench.WorkloadSetup) string {
	var out []string
	for _, s := range setups {
		for _, w := range []struct {
			name string
			rs   []nodebench.Restart
		}{{"crash", s.Crashes}, {"sidecar OOM", s.OOMs}} {
			for _, r := range w.rs {
				if r.Removed {
					out = append(out, fmt.Sprintf("%s %s %s", s.Name, w.name, r.Key))
				}
			}
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// pollPod polls the kubelet's status of pod name every jobPoll until cond accepts it, and returns when
// the accepted answer came back and the status; an error of cond, or no answer accepted within timeout,
// fails the test.
func (n *node) pollPod(name, what string, timeout time.Duration, cond func(*kubelet.PodStatus) (bool, error)) (int64, *kubelet.PodStatus) {
	n.t.Helper()
	var last *kubelet.PodStatus
	deadline := time.Now().Add(timeout)
	for {
		if time.Now().After(deadline) {
			n.t.Fatalf("pod %s: not %s within %s: %s", name, what, timeout, describePod(last))
		}
		got, err := n.k.Pod(name)
		now := time.Now().UnixNano()
		if err != nil {
			n.t.Fatal(err)
		}
		if got != nil {
			last = got
			ok, err := cond(got)
			if err != nil {
				n.t.Fatalf("pod %s: %v: %s", name, err, describePod(got))
			}
			if ok {
				return now, got
			}
		}
		time.Sleep(jobPoll)
	}
}

package kubelete2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
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
//     by the kubelet's terminating sync (containerd's STOPPED for the sandbox).
//
// The rounds run the setups in turn, so a change of the shared machine's load hits each alike.
const (
	workloadRounds = 3
	workloadPods   = 8
	initContainers = 3
	jobRun         = 100 * time.Millisecond
	jobPoll        = 10 * time.Millisecond
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
					chains, jobs := runWorkloads(b, s, round, pods)
					results[i].Chains = append(results[i].Chains, chains...)
					results[i].Jobs = append(results[i].Jobs, jobs...)
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
	if err := os.WriteFile(path, []byte(workloadMarkdown(results, rounds, pods, loads)), 0o644); err != nil {
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

func runWorkloads(b *testing.B, s setup, round, pods int) ([]nodebench.InitChain, []nodebench.Job) {
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
	b.StopTimer()
	b.Logf("%s, round %d:\n%s", s.Name, round, nodebench.WorkloadTable([]nodebench.WorkloadSetup{{Name: s.Name, Chains: chains, Jobs: jobs}}))
	return chains, jobs
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
	deadline := time.Now().Add(podWaitTimeout)
	for j.Succeeded == 0 {
		if time.Now().After(deadline) {
			n.t.Fatalf("pod %s not Succeeded within %s: %s", p.Name, podWaitTimeout, describePod(st))
		}
		got, err := n.k.Pod(p.Name)
		now := time.Now().UnixNano()
		if err != nil {
			n.t.Fatal(err)
		}
		if got != nil {
			st = got
			switch got.Status.Phase {
			case "Succeeded":
				j.Succeeded = now
				continue
			case "Failed":
				n.t.Fatalf("pod %s failed: %s", p.Name, describePod(got))
			}
		}
		time.Sleep(jobPoll)
	}
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
func workloadMarkdown(setups []nodebench.WorkloadSetup, rounds, pods int, loads []string) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# Workloads on a standalone kubelet %s, by PLEG", kubeletVersion)
	p("")
	p("Made by `make bench-workloads KUBELET_VERSION=%s` (`go test -run '^$' -bench BenchmarkWorkloads -benchtime 1x ./test/kubelet-e2e/`) on %s.",
		kubeletVersion, time.Now().UTC().Format("2006-01-02 15:04 MST"))
	p("Kubelet `%s` (unmodified, standalone: static pods, no API server), containerd %s, %d CPUs, kernel %s.",
		commandOutput(kubeletBinary, "--version"), strings.Fields(commandOutput(env.BinDir+"/containerd", "--version") + " ? ? ?")[2],
		runtime.NumCPU(), commandOutput("uname", "-r"))
	p("%d rounds of the %d setups in turn; per round and setup, %d init-chain pods then %d job pods, one after the other.",
		rounds, len(setups), pods, pods)
	p("Init chain: %d init containers that each `exit 0`, then an app; times from containerd's `created_at`, `started_at`,", initContainers)
	p("`finished_at`. Job: restartPolicy Never, one container `sleep %.1f; exit 0`; its `finished_at` to phase `Succeeded` in the", jobRun.Seconds())
	p("kubelet's read-only `/pods` (the status manager's status, what a kubelet with an API server writes there; polled every")
	p("%s, so up to that much late), and to containerd's STOPPED of the pod's sandbox (the kubelet's terminating sync).", jobPoll)
	p("Load average at the end of each run: %s.", strings.Join(loads, "; "))
	p("")
	p("%s", nodebench.WorkloadTable(setups))
	p("")
	if len(setups) > 1 {
		subject := setups[len(setups)-1].Name
		p("Paired differences (the samples of the same round and pod; for a step, of the same step), %s minus each other setup:", subject)
		p("")
		p("%s", nodebench.ComparisonsMarkdown(nodebench.WorkloadComparisons(setups, subject)))
	}
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

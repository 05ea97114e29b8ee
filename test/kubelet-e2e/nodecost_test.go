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

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/nodebench"
)

// The node-cost workload (make bench-node): nodePodCount host-network pods of one sleeping busybox
// container, measured while idle for nodeIdle, then for nodeChurn while one pod is replaced (manifest
// removed, a new one written) every nodeChurnEvery, then with the kubelet stopped (its pods running on)
// for nodeNoKubelet. The pod count (PLEG_NRI_NODE_BENCH_PODS, default nodeDefaultPods) and both first
// durations (PLEG_NRI_NODE_BENCH_IDLE, PLEG_NRI_NODE_BENCH_CHURN: Go durations) can be changed. With
// PLEG_NRI_CONTAINERD_PROFILE set, each phase also records the CRI calls containerd served by method, and
// the idle and no-kubelet phases a CPU profile of containerd (up to nodeProfileMax of it).
const (
	nodeDefaultPods = 100
	nodeChurnEvery  = 5 * time.Second
	nodeNoKubelet   = time.Minute
	nodeProfileMax  = time.Minute
	// nodeReportEnv names the markdown file BenchmarkNodeCost writes (with the pod count in its name
	// when it is not nodeDefaultPods, nodebench.ReportPath); the JSON goes beside it.
	nodeReportEnv = "PLEG_NRI_NODE_BENCH_MD"
	// nodePodsEnv sets the node benchmarks' pod count (make bench-node NODE_PODS=250).
	nodePodsEnv = "PLEG_NRI_NODE_BENCH_PODS"
	// kubeletMaxPods is the kubelet's default maxPods: a benchmark of more pods raises it.
	kubeletMaxPods = 110
)

func nodeDuration(tb testing.TB, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		tb.Fatalf("%s: want a positive Go duration, got %q", name, v)
	}
	return d
}

// nodeCount reads a positive count from the environment variable name (def when it is not set).
func nodeCount(tb testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		tb.Fatalf("%s: want a positive count, got %q", name, v)
	}
	return n
}

// nodePodCount is the node benchmarks' count of idle pods (nodePodsEnv).
func nodePodCount(tb testing.TB) int { return nodeCount(tb, nodePodsEnv, nodeDefaultPods) }

// maxPodsFor is the kubelet's maxPods for a benchmark that runs up to pods pods at once: 0 (the
// kubelet's default) when they fit in it.
func maxPodsFor(pods int) int {
	if pods <= kubeletMaxPods {
		return 0
	}
	return pods
}

// idlePod is the node benchmarks' idle pod: one busybox container that sleeps.
func idlePod(i int) kubelet.Pod {
	return kubelet.Pod{Name: fmt.Sprintf("idle%03d", i), HostNetwork: true,
		Containers: []kubelet.Container{{Name: "sleep", Script: "exec sleep 36000"}}}
}

// startIdlePods writes count idle pods, waits until the kubelet reports each of them running, and lets
// the start-up settle (the kubelet's status manager, pleg-nri's verifications).
func (n *node) startIdlePods(count int) {
	n.t.Helper()
	for i := 0; i < count; i++ {
		if err := n.k.WritePod(idlePod(i)); err != nil {
			n.t.Fatalf("writing pod %s: %v", idlePod(i).Name, err)
		}
	}
	start := time.Now()
	for i := 0; i < count; i++ {
		n.waitPod(idlePod(i).Name, "running", running)
	}
	n.t.Logf("%s: %d pods running in %s; %s", n.setup.Name, count, time.Since(start).Round(time.Second), n.limits())
	time.Sleep(20 * time.Second)
}

// limits reads the host limits a dense node can reach, with the node's containerd and kubelet.
func (n *node) limits() nodebench.Limits { return nodebench.ReadLimits(env.PID, n.k.PID) }

// BenchmarkNodeCost measures, for each setup, what nodePodCount pods cost the node: CPU of the kubelet,
// containerd and pleg-nri, pleg-nri's RSS and the CRI calls through it, idle and with churn.
func BenchmarkNodeCost(b *testing.B) {
	idle := nodeDuration(b, "PLEG_NRI_NODE_BENCH_IDLE", 3*time.Minute)
	churn := nodeDuration(b, "PLEG_NRI_NODE_BENCH_CHURN", 3*time.Minute)
	pods := nodePodCount(b)
	var samples []nodebench.Cost
	for _, s := range allSetups {
		b.Run(strings.ReplaceAll(s.Name, " ", "_"), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				samples = append(samples, runNodeCost(b, s, pods, idle, churn)...)
			}
		})
	}
	path := os.Getenv(nodeReportEnv)
	if path == "" || len(samples) != 3*len(allSetups) {
		return
	}
	path = nodebench.ReportPath(path, pods, nodeDefaultPods)
	if err := os.WriteFile(path, []byte(nodeMarkdown(samples, pods, idle, churn)), 0o644); err != nil {
		b.Fatal(err)
	}
	js, err := json.MarshalIndent(struct {
		Kubelet string           `json:"kubelet"`
		Date    string           `json:"date"`
		CPUs    int              `json:"cpus"`
		Pods    int              `json:"pods"`
		Samples []nodebench.Cost `json:"samples"`
	}{kubeletVersion, time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), pods, samples}, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(strings.TrimSuffix(path, ".md")+".json", js, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Logf("wrote %s", path)
}

func runNodeCost(b *testing.B, s setup, pods int, idle, churn time.Duration) []nodebench.Cost {
	b.StopTimer()
	n := startNode(b, s, nodeOptions{quiet: true, noDupWatch: true, maxPods: maxPodsFor(pods)})
	n.startIdlePods(pods)

	b.StartTimer()
	idleSample := n.measure(s, "idle", idle, func() { time.Sleep(idle) })
	limits := n.limits()
	idleSample.Limits = &limits
	if tight := limits.Tight(); len(tight) > 0 {
		b.Logf("%s: %d pods take more than half of a host limit: %s", s.Name, pods, strings.Join(tight, "; "))
	}
	next := pods
	churnSample := n.measure(s, "churn", 0, func() {
		end := time.Now().Add(churn)
		for k := 0; time.Now().Before(end); k++ {
			// The oldest pod: one of the first ones, then the one written pods steps ago (the pods run
			// fewer than pods replacements go round once).
			if err := n.k.RemovePod(idlePod(k).Name); err != nil {
				b.Fatal(err)
			}
			if err := n.k.WritePod(idlePod(next)); err != nil {
				b.Fatal(err)
			}
			next++
			time.Sleep(nodeChurnEvery)
		}
	})
	// The same node without a kubelet: what containerd (and pleg-nri) cost on their own.
	n.k.Stop()
	time.Sleep(10 * time.Second)
	aloneSample := n.measure(s, "no kubelet", nodeNoKubelet, func() { time.Sleep(nodeNoKubelet) })
	b.StopTimer()
	for _, sample := range []nodebench.Cost{idleSample, churnSample, aloneSample} {
		b.Logf("%s %s: kubelet %.2f, containerd %.2f CPU s/min", s.Name, sample.Phase, sample.KubeletCPU, sample.ContainerdCPU)
	}
	return []nodebench.Cost{idleSample, churnSample, aloneSample}
}

// measure runs work and returns what the node's processes spent meanwhile; with containerd's profiling
// on, it profiles containerd for the first profileFor of it (0: no profile).
func (n *node) measure(s setup, phase string, profileFor time.Duration, work func()) nodebench.Cost {
	kubeletUp := n.k.Running()
	relists := func() float64 {
		if !kubeletUp {
			return 0
		}
		return n.metric(metricRelistCount)
	}
	k0, c0, r0 := processCPU(n.k.PID), processCPU(env.PID), relists()
	var methods0 map[string]harness.MethodCount
	if env.MetricsAddress != "" {
		var err error
		if methods0, err = env.ContainerdMethods(); err != nil {
			n.t.Fatalf("containerd's metrics: %v", err)
		}
	}
	var profile chan *harness.ProfileSummary
	if env.DebugAddress != "" && profileFor > 0 {
		profile = make(chan *harness.ProfileSummary, 1)
		path := fmt.Sprintf("%s/containerd-%s-%s.pprof", profileDir(n.t), strings.ReplaceAll(s.Name, " ", "_"), strings.ReplaceAll(phase, " ", "_"))
		go func() {
			if err := env.ProfileCPU(context.Background(), min(profileFor, nodeProfileMax), path); err != nil {
				n.t.Errorf("containerd's profile: %v", err)
				profile <- nil
				return
			}
			sum, err := harness.SummarizeProfile(path)
			if err != nil {
				n.t.Errorf("containerd's profile: %v", err)
			}
			profile <- sum
		}()
	}
	var p0, f0, calls0 float64
	front := 0
	if n.p != nil {
		var err error
		if front, err = n.p.FrontPID(); err != nil {
			n.t.Fatalf("pleg-nri's front: %v", err)
		}
		p0, f0 = processCPU(n.p.PID), processCPU(front)
		calls0, _ = n.p.Metric("pleg_nri_forwarded_call_duration_seconds_count")
	}
	t0 := time.Now()
	work()
	secs := time.Since(t0).Seconds()
	perMin := func(x float64) float64 { return x / secs * 60 }
	out := nodebench.Cost{Setup: s.Name, Phase: phase, Seconds: secs,
		KubeletCPU: perMin(processCPU(n.k.PID) - k0), ContainerdCPU: perMin(processCPU(env.PID) - c0),
		Relists: relists() - r0, Load: loadAvg()}
	if methods0 != nil {
		methods1, err := env.ContainerdMethods()
		if err != nil {
			n.t.Fatalf("containerd's metrics: %v", err)
		}
		out.ContainerdMethods = harness.MethodRates(methods0, methods1, time.Duration(secs*float64(time.Second)))
	}
	if profile != nil {
		out.Profile = <-profile
	}
	if n.p != nil {
		cpu := perMin(processCPU(n.p.PID) - p0)
		rss := processRSSMiB(n.p.PID)
		calls, _ := n.p.Metric("pleg_nri_forwarded_call_duration_seconds_count")
		rate := (calls - calls0) / secs
		out.PlegNRICPU, out.PlegNRIRSSMiB, out.ProxyCallsPerSec = &cpu, &rss, &rate
		frontCPU, frontRSS := perMin(processCPU(front)-f0), processRSSMiB(front)
		out.FrontCPU, out.FrontRSSMiB = &frontCPU, &frontRSS
	}
	return out
}

// processRSSMiB returns a process's resident memory (VmRSS) in MiB.
func processRSSMiB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// envOverrides returns the values of the environment variables names that are set, for the command a
// report says reproduces it.
func envOverrides(names ...string) map[string]string {
	out := map[string]string{}
	for _, name := range names {
		out[name] = os.Getenv(name)
	}
	return out
}

func nodeMarkdown(samples []nodebench.Cost, pods int, idle, churn time.Duration) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# What %d pods cost the node, by PLEG (kubelet %s)", pods, kubeletVersion)
	p("")
	p("Made by `%s` (`go test -run '^$' -bench BenchmarkNodeCost -benchtime 1x ./test/kubelet-e2e/`) on %s,",
		nodebench.MakeCommand("bench-node", kubeletVersion, pods, nodeDefaultPods, envOverrides("PLEG_NRI_NODE_BENCH_IDLE", "PLEG_NRI_NODE_BENCH_CHURN")),
		time.Now().UTC().Format("2006-01-02 15:04 MST"))
	p("%d CPUs. Each setup runs its own kubelet against the same containerd: %d host-network pods of one sleeping busybox",
		runtime.NumCPU(), pods)
	p("container, idle for %s, then for %s one pod replaced (manifest removed, a new one written) every %s. CPU is",
		idle, churn, nodeChurnEvery)
	p("user+system seconds per minute from /proc (60 = one core busy); containerd's is its daemon only (not the shims);")
	p("pleg-nri's core and its front (which serves the kubelet's CRI socket and forwards every call) are counted apart,")
	p("and both are in the node's total (the reports made before the front was counted have the core only).")
	if pods > kubeletMaxPods {
		p("The kubelet runs with maxPods %d (its default, %d, would reject pods).", maxPodsFor(pods), kubeletMaxPods)
	}
	p("")
	p("| setup | phase | kubelet CPU s/min | containerd CPU s/min | pleg-nri CPU s/min | pleg-nri front CPU s/min | kubelet + containerd + pleg-nri | pleg-nri RSS (core + front) | CRI calls/s through pleg-nri | kubelet relists | load at end |")
	p("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, s := range samples {
		core, front, rss := s.PlegNRICells()
		calls := "-"
		if s.ProxyCallsPerSec != nil {
			calls = fmt.Sprintf("%.2f", *s.ProxyCallsPerSec)
		}
		p("| %s | %s | %.2f | %.2f | %s | %s | %.2f | %s | %s | %g | %s |", s.Setup, s.Phase, s.KubeletCPU, s.ContainerdCPU, core, front,
			s.Node(), rss, calls, s.Relists, s.Load)
	}
	p("")
	p("Host limits with the %d pods running, at the end of the idle phase (open files against each process's soft", pods)
	p("RLIMIT_NOFILE; threads against kernel.pid_max; inotify against fs.inotify.max_user_*, counted over every process of")
	p("the machine):")
	p("")
	for _, s := range samples {
		if s.Limits != nil {
			p("- %s: %s.", s.Setup, s.Limits)
		}
	}
	containerdSections(p, samples)
	return b.String()
}

// containerdSections writes, for the samples with containerd's profiling on, the calls containerd
// served by method and where its CPU went.
func containerdSections(p func(string, ...any), samples []nodebench.Cost) {
	profiled := false
	for _, s := range samples {
		profiled = profiled || s.ContainerdMethods != nil
	}
	if !profiled {
		return
	}
	p("")
	p("## What containerd serves, and where its CPU goes")
	p("")
	p("From containerd's own gRPC counters (`grpc_server_handled_total`, `grpc_server_handling_seconds` on its")
	p("`/v1/metrics`: every client's calls, the kubelet's and pleg-nri's) and a CPU profile of containerd from its")
	p("debug socket (up to %s of the idle and the no-kubelet phases; the CPU of each CRI method is the cumulative", nodeProfileMax)
	p("time under containerd's CRI handler, `instrumentedService.<Method>`, so it leaves out gRPC's own transport and")
	p("encoding). `make bench-node` runs with `%s=1`; the profiles stay in %s.", containerdProfileEnv, profileDir(failer{}))
	for _, s := range samples {
		if s.ContainerdMethods == nil {
			continue
		}
		p("")
		p("### %s, %s", s.Setup, s.Phase)
		p("")
		if s.Profile != nil {
			p("Profile: %.1f s of CPU in %.0f s (%.2f CPU s/min; /proc says %.2f for the whole phase).", s.Profile.CPUSeconds, s.Profile.Seconds,
				s.Profile.CPUSeconds/s.Profile.Seconds*60, s.ContainerdCPU)
			p("")
		}
		p("| method | calls/s | handling ms per call | containerd CPU ms/s in the handler | share of containerd's CPU |")
		p("| --- | ---: | ---: | ---: | ---: |")
		calls := map[string]float64{}
		for k, c := range s.ContainerdMethods {
			calls[k] = c.Calls
		}
		for _, k := range sortedKeys(calls) {
			c := s.ContainerdMethods[k]
			cpu, share := "-", "-"
			if s.Profile != nil && s.Profile.CPUSeconds > 0 {
				v := s.Profile.ByMethod[k]
				cpu, share = fmt.Sprintf("%.2f", v/s.Profile.Seconds*1000), fmt.Sprintf("%.1f%%", v/s.Profile.CPUSeconds*100)
			}
			p("| %s | %.2f | %.3f | %s | %s |", k, c.Calls, c.Seconds/c.Calls*1000, cpu, share)
		}
		if s.Profile != nil {
			p("")
			p("Most CPU of their own: %s.", strings.Join(s.Profile.Flat, "; "))
			p("")
			p("Most CPU under them: %s.", strings.Join(s.Profile.Cum, "; "))
		}
	}
}

// failer is a Fatal that panics, for profileDir outside a test.
type failer struct{}

func (failer) Fatal(args ...any) { panic(fmt.Sprint(args...)) }

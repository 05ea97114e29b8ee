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
)

// The node-cost workload (make bench-node): nodePods host-network pods of one sleeping busybox
// container, measured while idle for nodeIdle, then for nodeChurn while one pod is replaced (manifest
// removed, a new one written) every nodeChurnEvery, then with the kubelet stopped (its pods running on)
// for nodeNoKubelet. Both first durations can be changed for a quicker look (PLEG_NRI_NODE_BENCH_IDLE,
// PLEG_NRI_NODE_BENCH_CHURN: Go durations). With PLEG_NRI_CONTAINERD_PROFILE set, each phase also records
// the CRI calls containerd served by method, and the idle and no-kubelet phases a CPU profile of
// containerd (up to nodeProfileMax of it).
const (
	nodePods       = 100
	nodeChurnEvery = 5 * time.Second
	nodeNoKubelet  = time.Minute
	nodeProfileMax = time.Minute
	// nodeReportEnv names the markdown file BenchmarkNodeCost writes; the JSON goes beside it.
	nodeReportEnv = "PLEG_NRI_NODE_BENCH_MD"
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

// costSample is what one phase of one setup cost.
type costSample struct {
	Setup string `json:"setup"`
	Phase string `json:"phase"`
	// Seconds is the phase's length.
	Seconds float64 `json:"seconds"`
	// CPU seconds per minute (user+system) of each process.
	KubeletCPU    float64  `json:"kubelet_cpu_seconds_per_minute"`
	ContainerdCPU float64  `json:"containerd_cpu_seconds_per_minute"`
	PlegNRICPU    *float64 `json:"plegnri_cpu_seconds_per_minute,omitempty"`
	// PlegNRIRSSMiB is pleg-nri's resident memory at the phase's end.
	PlegNRIRSSMiB *float64 `json:"plegnri_rss_mib,omitempty"`
	// ProxyCallsPerSec are the CRI calls pleg-nri forwarded to containerd, per second.
	ProxyCallsPerSec *float64 `json:"proxy_calls_per_second,omitempty"`
	// Relists are the kubelet's generic relists during the phase.
	Relists float64 `json:"kubelet_relists"`
	// Load is the load average at the phase's end.
	Load string `json:"load_at_end"`
	// ContainerdMethods are the gRPC calls containerd served per second, by method, with their
	// handling time per second (PLEG_NRI_CONTAINERD_PROFILE).
	ContainerdMethods map[string]harness.MethodCount `json:"containerd_calls_per_second,omitempty"`
	// Profile is containerd's CPU profile of the phase (PLEG_NRI_CONTAINERD_PROFILE; idle and no kubelet).
	Profile *harness.ProfileSummary `json:"containerd_profile,omitempty"`
}

// BenchmarkNodeCost measures, for each setup, what nodePods pods cost the node: CPU of the kubelet,
// containerd and pleg-nri, pleg-nri's RSS and the CRI calls through it, idle and with churn.
func BenchmarkNodeCost(b *testing.B) {
	idle := nodeDuration(b, "PLEG_NRI_NODE_BENCH_IDLE", 3*time.Minute)
	churn := nodeDuration(b, "PLEG_NRI_NODE_BENCH_CHURN", 3*time.Minute)
	var samples []costSample
	for _, s := range allSetups {
		b.Run(strings.ReplaceAll(s.Name, " ", "_"), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				samples = append(samples, runNodeCost(b, s, idle, churn)...)
			}
		})
	}
	path := os.Getenv(nodeReportEnv)
	if path == "" || len(samples) != 3*len(allSetups) {
		return
	}
	if err := os.WriteFile(path, []byte(nodeMarkdown(samples, idle, churn)), 0o644); err != nil {
		b.Fatal(err)
	}
	js, err := json.MarshalIndent(struct {
		Kubelet string       `json:"kubelet"`
		Date    string       `json:"date"`
		CPUs    int          `json:"cpus"`
		Pods    int          `json:"pods"`
		Samples []costSample `json:"samples"`
	}{kubeletVersion, time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), nodePods, samples}, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(strings.TrimSuffix(path, ".md")+".json", js, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Logf("wrote %s", path)
}

func runNodeCost(b *testing.B, s setup, idle, churn time.Duration) []costSample {
	b.StopTimer()
	n := startNode(b, s, nodeOptions{quiet: true, noDupWatch: true})
	pod := func(i int) kubelet.Pod {
		return kubelet.Pod{Name: fmt.Sprintf("idle%03d", i), HostNetwork: true,
			Containers: []kubelet.Container{{Name: "sleep", Script: "exec sleep 36000"}}}
	}
	for i := 0; i < nodePods; i++ {
		if err := n.k.WritePod(pod(i)); err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	for i := 0; i < nodePods; i++ {
		n.waitPod(pod(i).Name, "running", running)
	}
	b.Logf("%s: %d pods running in %s", s.Name, nodePods, time.Since(start).Round(time.Second))
	// Let the start-up settle (the kubelet's status manager, pleg-nri's verifications).
	time.Sleep(20 * time.Second)

	b.StartTimer()
	idleSample := n.measure(s, "idle", idle, func() { time.Sleep(idle) })
	next := nodePods
	churnSample := n.measure(s, "churn", 0, func() {
		end := time.Now().Add(churn)
		for k := 0; time.Now().Before(end); k++ {
			if err := n.k.RemovePod(pod(k % nodePods).Name); err != nil {
				b.Fatal(err)
			}
			if err := n.k.WritePod(pod(next)); err != nil {
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
	for _, sample := range []costSample{idleSample, churnSample, aloneSample} {
		b.Logf("%s %s: kubelet %.2f, containerd %.2f CPU s/min", s.Name, sample.Phase, sample.KubeletCPU, sample.ContainerdCPU)
	}
	return []costSample{idleSample, churnSample, aloneSample}
}

// measure runs work and returns what the node's processes spent meanwhile; with containerd's profiling
// on, it profiles containerd for the first profileFor of it (0: no profile).
func (n *node) measure(s setup, phase string, profileFor time.Duration, work func()) costSample {
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
	var p0, calls0 float64
	if n.p != nil {
		p0 = processCPU(n.p.PID)
		calls0, _ = n.p.Metric("pleg_nri_forwarded_call_duration_seconds_count")
	}
	t0 := time.Now()
	work()
	secs := time.Since(t0).Seconds()
	perMin := func(x float64) float64 { return x / secs * 60 }
	out := costSample{Setup: s.Name, Phase: phase, Seconds: secs,
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

func nodeMarkdown(samples []costSample, idle, churn time.Duration) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# What %d pods cost the node, by PLEG (kubelet %s)", nodePods, kubeletVersion)
	p("")
	p("Made by `make bench-node KUBELET_VERSION=%s` (`go test -run '^$' -bench BenchmarkNodeCost -benchtime 1x ./test/kubelet-e2e/`) on %s,",
		kubeletVersion, time.Now().UTC().Format("2006-01-02 15:04 MST"))
	p("%d CPUs. Each setup runs its own kubelet against the same containerd: %d host-network pods of one sleeping busybox",
		runtime.NumCPU(), nodePods)
	p("container, idle for %s, then for %s one pod replaced (manifest removed, a new one written) every %s. CPU is",
		idle, churn, nodeChurnEvery)
	p("user+system seconds per minute from /proc (60 = one core busy); containerd's is its daemon only (not the shims).")
	p("")
	p("| setup | phase | kubelet CPU s/min | containerd CPU s/min | pleg-nri CPU s/min | kubelet + containerd + pleg-nri | pleg-nri RSS | CRI calls/s through pleg-nri | kubelet relists | load at end |")
	p("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, s := range samples {
		pcpu, rss, calls, total := "-", "-", "-", s.KubeletCPU+s.ContainerdCPU
		if s.PlegNRICPU != nil {
			pcpu, rss, calls = fmt.Sprintf("%.2f", *s.PlegNRICPU), fmt.Sprintf("%.1f MiB", *s.PlegNRIRSSMiB), fmt.Sprintf("%.2f", *s.ProxyCallsPerSec)
			total += *s.PlegNRICPU
		}
		p("| %s | %s | %.2f | %.2f | %s | %.2f | %s | %s | %g | %s |", s.Setup, s.Phase, s.KubeletCPU, s.ContainerdCPU, pcpu, total,
			rss, calls, s.Relists, s.Load)
	}
	containerdSections(p, samples)
	return b.String()
}

// containerdSections writes, for the samples with containerd's profiling on, the calls containerd
// served by method and where its CPU went.
func containerdSections(p func(string, ...any), samples []costSample) {
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

package kubelete2e

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
)

// The node-cost workload (make bench-node): nodePods host-network pods of one sleeping busybox
// container, measured while idle for nodeIdle, then for nodeChurn while one pod is replaced (manifest
// removed, a new one written) every nodeChurnEvery. Both durations can be changed for a quicker look
// (PLEG_NRI_NODE_BENCH_IDLE, PLEG_NRI_NODE_BENCH_CHURN: Go durations).
const (
	nodePods       = 100
	nodeChurnEvery = 5 * time.Second
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
	if path == "" || len(samples) != 2*len(allSetups) {
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
	n := startNode(b, s, nodeOptions{quiet: true})
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
	idleSample := n.measure(s, "idle", func() { time.Sleep(idle) })
	next := nodePods
	churnSample := n.measure(s, "churn", func() {
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
	b.StopTimer()
	b.Logf("%s: %+v", s.Name, idleSample)
	b.Logf("%s: %+v", s.Name, churnSample)
	return []costSample{idleSample, churnSample}
}

// measure runs work and returns what the node's processes spent meanwhile.
func (n *node) measure(s setup, phase string, work func()) costSample {
	k0, c0, r0 := processCPU(n.k.PID), processCPU(env.PID), n.metric(metricRelistCount)
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
		Relists: n.metric(metricRelistCount) - r0, Load: loadAvg()}
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
	return b.String()
}

package nodebench

import (
	"strings"
	"testing"
	"time"
)

func TestLatencies(t *testing.T) {
	const s = int64(1_000_000_000_000)
	start := map[string]int64{"a": s, "b": s + 2e6, "c": s + 4e6}
	done := map[string]int64{"a": s + 500e6, "b": s + 1502e6}
	ms, last, missing := Latencies([]string{"a", "b", "c"}, start, done)
	if len(ms) != 2 || ms[0] != 500 || ms[1] != 1500 {
		t.Errorf("latencies %v, want [500 1500]", ms)
	}
	if last == nil || *last != 1502 {
		t.Errorf("last %v, want 1502 ms (first start to last done)", last)
	}
	if missing != 1 {
		t.Errorf("missing %d, want 1", missing)
	}
	if ms, last, missing := Latencies([]string{"a"}, start, nil); len(ms) != 0 || last != nil || missing != 1 {
		t.Errorf("nothing done: %v %v %d", ms, last, missing)
	}
}

func TestStormMarkdown(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	q := QuantilesOf([]float64{1200, 2500, 3100})
	probe := map[string]Quantiles{"Version": QuantilesOf([]float64{0.4, 0.5, 9}), "ListPodSandbox": QuantilesOf([]float64{2, 3, 40})}
	phases := func(plegNRI bool) []StormPhase {
		cost := Cost{Seconds: 60, KubeletCPU: 6, ContainerdCPU: 12, Load: "1.00 0.50 0.20"}
		var events *float64
		if plegNRI {
			cost.PlegNRICPU, cost.FrontCPU, cost.PlegNRIRSSMiB, cost.FrontRSSMiB = f(0.5), f(1), f(40), f(20)
			events = f(12.5)
		}
		return []StormPhase{
			{Phase: PhaseDelete, Pods: 3, Kubelet: q, KubeletLastMs: f(3150), Containerd: &q, ContainerdLastMs: f(3200), Cost: cost,
				KubeletEvents: events, PlegNRIEvents: events, Probe: probe},
			{Phase: PhaseCreate, Pods: 3, Kubelet: q, KubeletLastMs: f(3150), KubeletMissing: 1, Cost: cost, Probe: probe, ProbeErrors: 2},
			{Phase: PhaseCrash, Pods: 2, Restarts: f(30), Cost: cost, Probe: probe},
		}
	}
	r := StormReport{Kubelet: "v1.37.2", Date: "2026-11-26 22:00 UTC", CPUs: 2, Command: "make bench-storm KUBELET_VERSION=v1.37.2",
		IdlePods: 3, StormPods: 3, Crashers: 2, CrashScript: "sleep 2; exit 1", MaxPods: 250, Window: time.Minute, Crash: 2 * time.Minute,
		Poll: 100 * time.Millisecond, Probe: 100 * time.Millisecond,
		Runs: []StormRun{
			{Setup: "GenericPLEG on containerd", Phases: phases(false), Limits: &Limits{ContainerdFDs: 10, ContainerdFDLimit: 1024}},
			{Setup: "EventedPLEG on containerd", Evented: true, Phases: phases(false)},
			{Setup: "EventedPLEG on pleg-nri", Evented: true, PlegNRI: true, Phases: phases(true)},
		}}
	md := StormMarkdown(r)
	for _, want := range []string{
		"# A storm on a node of 3 pods, by PLEG (kubelet v1.37.2)",
		"Made by `make bench-storm KUBELET_VERSION=v1.37.2`",
		"container running (the kubelet's maxPods: 250)",
		"## delete: 3 pods deleted at once",
		"| GenericPLEG on containerd | 3 | 2.50 s | 3.10 s | 3.10 s | 3.15 s | 0 | 2.50 s | 3.10 s | 3.10 s | 3.20 s | 0 |",
		"## create: 3 pods created at once",
		"| EventedPLEG on pleg-nri | 3 | 2.50 s | 3.10 s | 3.10 s | 3.15 s | 1 |",
		"## crash loop: 2 containers crash-looping for 2m0s",
		"| EventedPLEG on containerd | 2 | 30 | 0.50 |",
		"| GenericPLEG on containerd | 60 | 6.00 | 12.00 | - | - | 18.00 | - | - | - | - | 1.00 0.50 0.20 |",
		"| EventedPLEG on containerd | 60 | 6.00 | 12.00 | - | - | 18.00 | - | - | - | no counter | 1.00 0.50 0.20 |",
		"| EventedPLEG on pleg-nri | 60 | 6.00 | 12.00 | 0.50 | 1.00 | 19.50 | 40.0 + 20.0 MiB | 12.5 | 12.5 | - | 1.00 0.50 0.20 |",
		"| setup | Version n | Version p50 | Version p90 | Version p99 | Version max | ListPodSandbox n |",
		"| GenericPLEG on containerd | 3 | 0.5 ms | 9.0 ms | 9.0 ms | 9.0 ms | 3 | 3.0 ms | 40 ms | 40 ms | 40 ms | 0 |",
		"| EventedPLEG on containerd | 3 | 0.5 ms | 9.0 ms | 9.0 ms | 9.0 ms | 3 | 3.0 ms | 40 ms | 40 ms | 40 ms | 2 |",
		"- GenericPLEG on containerd: open files: containerd 10 of 1024",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report has no %q:\n%s", want, md)
		}
	}
	// Every table row has as many cells as its header.
	var header int
	for _, l := range strings.Split(md, "\n") {
		if !strings.HasPrefix(l, "|") {
			header = 0
			continue
		}
		cells := strings.Count(l, "|")
		if header == 0 {
			header = cells
		} else if cells != header {
			t.Errorf("row %q has %d cells, its header %d", l, cells-1, header-1)
		}
	}
}

package benchreport

import (
	"encoding/xml"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

func TestQuantile(t *testing.T) {
	s := []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	for _, c := range []struct{ q, want float64 }{{.5, 5}, {.9, 9}, {.99, 10}, {1, 10}, {0, 1}} {
		if got := Quantile(s, c.q); got != c.want {
			t.Errorf("Quantile(%g) = %g, want %g", c.q, got, c.want)
		}
	}
	if !math.IsNaN(Quantile(nil, .5)) {
		t.Error("Quantile of nothing is not NaN")
	}
	if s[0] != 5 {
		t.Error("Quantile sorted its input")
	}
}

const metrics = `# HELP pleg_nri_hook_duration_seconds Time the NRI plugin took to handle a callback.
# TYPE pleg_nri_hook_duration_seconds histogram
pleg_nri_hook_duration_seconds_bucket{callback="StopContainer",le="1e-05"} 10
pleg_nri_hook_duration_seconds_bucket{callback="StopContainer",le="2.5e-05"} 90
pleg_nri_hook_duration_seconds_bucket{callback="StopContainer",le="5e-05"} 100
pleg_nri_hook_duration_seconds_bucket{callback="StopContainer",le="+Inf"} 100
pleg_nri_hook_duration_seconds_sum{callback="StopContainer"} 0.0015
pleg_nri_hook_duration_seconds_count{callback="StopContainer"} 100
pleg_nri_hook_duration_seconds_bucket{callback="Synchronize",le="1e-05"} 0
pleg_nri_hook_duration_seconds_bucket{callback="Synchronize",le="2.5e-05"} 0
pleg_nri_hook_duration_seconds_bucket{callback="Synchronize",le="5e-05"} 0
pleg_nri_hook_duration_seconds_bucket{callback="Synchronize",le="+Inf"} 1
pleg_nri_hook_duration_seconds_sum{callback="Synchronize"} 0.3
pleg_nri_hook_duration_seconds_count{callback="Synchronize"} 1
pleg_nri_other_bucket{le="+Inf"} 7
`

func TestParseHistogram(t *testing.T) {
	h, err := ParseHistogram(strings.NewReader(metrics), "pleg_nri_hook_duration_seconds", "callback",
		func(l string) bool { return strings.Contains(l, `callback="Synchronize"`) })
	if err != nil {
		t.Fatal(err)
	}
	if h.Count != 100 || h.ByCallback["Synchronize"] != 1 || h.ByCallback["StopContainer"] != 100 || len(h.Buckets) != 4 {
		t.Fatalf("parsed %+v", h)
	}
	// Rank 50 lies in (10 µs, 25 µs] holding 80: 10 + 15*(40/80) = 17.5 µs.
	if got := HistogramQuantile(h.Buckets, .5) * 1e6; math.Abs(got-17.5) > 1e-9 {
		t.Errorf("p50 = %g µs, want 17.5", got)
	}
	if got := HistogramQuantile(h.Buckets, .99) * 1e6; math.Abs(got-47.5) > 1e-9 {
		t.Errorf("p99 = %g µs, want 47.5", got)
	}
	if got := FractionAtMost(h.Buckets, 50e-6); got != 1 {
		t.Errorf("fraction <= 50 µs = %g, want 1", got)
	}
	if _, err := ParseHistogram(strings.NewReader(metrics), "nope", "callback", nil); err == nil {
		t.Error("a missing histogram is not an error")
	}
}

func TestParseGoBench(t *testing.T) {
	out := "goos: linux\nBenchmarkHookStopContainer-2   \t 1000000\t      1234 ns/op\t     96 B/op\t       2 allocs/op\nPASS\n"
	got, err := ParseGoBench(strings.NewReader(out))
	if err != nil || len(got) != 1 || got[0].Name != "BenchmarkHookStopContainer-2" || got[0].NsPerOp != 1234 || got[0].Metrics["allocs/op"] != 2 {
		t.Fatalf("ParseGoBench = %+v, %v", got, err)
	}
}

func TestReport(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.json")
	exits := &ExitLatency{Pods: 1, Batches: 1}
	for i := range 100 {
		exits.Exits = append(exits.Exits, Exit{ID: "c", ContainerdMs: 40 + float64(i)/4, PlegNRIMs: 1 + float64(i)/50})
	}
	exits.Exits[0].PlegNRIMs = -1
	if err := Update(path, func(r *Results) { r.Date, r.ExitLatency = "2026-01-01T00:00:00Z", exits }); err != nil {
		t.Fatal(err)
	}
	if err := Update(path, func(r *Results) {
		r.Proxy = &Proxy{Methods: []ProxyMethod{{Method: "Version", DirectUs: []float64{100, 110}, ProxiedUs: []float64{150, 160}}}}
		r.PodStart = &PodStart{Rounds: 1, WithMs: []float64{101}, WithoutMs: []float64{100}}
	}); err != nil {
		t.Fatal(err)
	}
	r, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitLatency == nil || r.Proxy == nil || r.Date == "" {
		t.Fatalf("Update lost a section: %+v", r)
	}
	md := Markdown(r, "exit-latency.svg")
	for _, want := range []string{"make bench", "2026-01-01", "| STOPPED events never received | 0 | 1 |", "+50 µs", "+1.00%", "**no**"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "no state-dir") {
		t.Errorf("the control's rows without its samples:\n%s", md)
	}
	// With the control phase of BenchmarkPodStart (pleg-nri with no state-dir): its rows and the
	// differences with their intervals.
	r.PodStart.WithNoStateDirMs, r.PodStart.WithMs, r.PodStart.WithoutMs = []float64{100, 100}, []float64{103, 103}, []float64{100, 100}
	md = Markdown(r, "exit-latency.svg")
	for _, want := range []string{"| pod start with pleg-nri connected, no state-dir (control), median (2 pods) | 100.0 ms | 100.0 ms | +0.00% |",
		"with minus with no state-dir (the checkpoint's share, 95 % interval) |  |  | +3 ms (95 % interval +3 to +3 ms, 2 / 2 samples: later) |",
		"of three phases, their order rotating"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	svg := SVG(r.ExitLatency)
	if err := xml.Unmarshal([]byte(svg), new(struct{})); err != nil {
		t.Errorf("SVG is not well-formed XML: %v", err)
	}
	if !strings.Contains(svg, "pleg-nri: p50") || !strings.Contains(svg, "containerd: p50") {
		t.Errorf("SVG lacks the legend")
	}
}

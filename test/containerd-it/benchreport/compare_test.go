package benchreport

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeResults is one run's results: exit latencies around exitMs, calls through pleg-nri proxyAddUs
// above direct ones, pod starts with pleg-nri podAddMs above those without, a hook histogram.
func fakeResults(seed uint64, exitMs, proxyAddUs, podAddMs float64) *Results {
	rng := rand.New(rand.NewPCG(seed, 1))
	around := func(v float64) float64 { return v * (0.8 + 0.4*rng.Float64()) }
	r := &Results{Date: "2026-12-07T19:00:00Z", Machine: "2 CPUs, Linux 6.1.0, containerd v2.4.2, go1.26.8",
		ExitLatency: &ExitLatency{Pods: 2, Batches: 2}, Proxy: &Proxy{}, PodStart: &PodStart{Rounds: 2}}
	for i := range 60 {
		x := Exit{ContainerdMs: around(10), PlegNRIMs: around(exitMs), EmittedMs: around(exitMs / 2)}
		if i == 59 {
			x.PlegNRIMs = -1 // missed
		}
		r.ExitLatency.Exits = append(r.ExitLatency.Exits, x)
	}
	for _, name := range []string{"Version", "ListContainers"} {
		m := ProxyMethod{Method: name, Items: 12}
		for range 200 {
			d := around(100)
			m.DirectUs = append(m.DirectUs, d)
			m.ProxiedUs = append(m.ProxiedUs, d+around(proxyAddUs))
		}
		r.Proxy.Methods = append(r.Proxy.Methods, m)
	}
	for range 30 {
		w := around(200)
		r.PodStart.WithoutMs = append(r.PodStart.WithoutMs, w)
		r.PodStart.WithMs = append(r.PodStart.WithMs, around(200)+podAddMs)
		r.PodStart.WithNoStateDirMs = append(r.PodStart.WithNoStateDirMs, around(200))
	}
	r.Hook = &Hook{Buckets: []Bucket{{1e-5, 100}, {2.5e-5, 900}, {5e-5, 990}, {math.MaxFloat64, 1000}}, Count: 1000}
	r.Internals = map[string]*Hook{"pleg_nri_emit_latency_seconds": {Buckets: []Bucket{{1e-3, 50}, {5e-3, 240}, {math.MaxFloat64, 240}}}}
	return r
}

// fakeRuns is two rounds, ABBA, of head's and base's results.
func fakeRuns(head, base func(round int) *Results) []CompareRun {
	t0 := time.Date(2026, 12, 7, 19, 0, 0, 0, time.UTC)
	var runs []CompareRun
	for round := 1; round <= 2; round++ {
		order := []string{SideHead, SideBase}
		if round%2 == 0 {
			slices.Reverse(order)
		}
		for i, side := range order {
			r := head(round)
			if side == SideBase {
				r = base(round)
			}
			start := t0.Add(time.Duration(2*(round-1)+i) * 6 * time.Minute)
			runs = append(runs, CompareRun{Round: round, Side: side, First: i == 0, Start: start, End: start.Add(5 * time.Minute),
				LoadBefore: "1.00 0.80 0.50", LoadAfter: "2.10 1.20 0.70", Results: r})
		}
	}
	return runs
}

func rowNamed(t *testing.T, rows []cmpRow, prefix string) cmpRow {
	t.Helper()
	for _, r := range rows {
		if strings.HasPrefix(r.m.name, prefix) {
			return r
		}
	}
	t.Fatalf("no row %q", prefix)
	return cmpRow{}
}

func TestCompareRowsPooledAndRounds(t *testing.T) {
	// HEAD's pleg-nri latencies are 1..60 in round 1 and 61..120 in round 2; BASE's the same plus 1000.
	exits := func(from float64) *Results {
		r := &Results{ExitLatency: &ExitLatency{}}
		for i := range 60 {
			r.ExitLatency.Exits = append(r.ExitLatency.Exits, Exit{PlegNRIMs: from + float64(i), ContainerdMs: 5, EmittedMs: -1})
		}
		return r
	}
	runs := fakeRuns(func(round int) *Results { return exits(float64(60*(round-1) + 1)) },
		func(round int) *Results { return exits(float64(60*(round-1) + 1001)) })
	rows := compareRows(runs)
	p50 := rowNamed(t, rows, "task exit → STOPPED received on pleg-nri's stream, p50")
	// Pooled: 1..120, nearest rank 60.
	if p50.head != 60 || p50.base != 1060 || p50.headN != 120 || p50.baseN != 120 {
		t.Errorf("pooled p50 head %g (%d) base %g (%d), want 60 (120) and 1060 (120)", p50.head, p50.headN, p50.base, p50.baseN)
	}
	if p50.rounds[1][SideHead] != 30 || p50.rounds[2][SideHead] != 90 || p50.rounds[1][SideBase] != 1030 || p50.rounds[2][SideBase] != 1090 {
		t.Errorf("rounds %v", p50.rounds)
	}
	if p50.diff.Diff != -1000 || !(p50.diff.Lo <= -1000 && -1000 <= p50.diff.Hi) || p50.diff.Hi >= 0 {
		t.Errorf("diff %+v: want -1000 inside an interval below 0", p50.diff)
	}
	if v := cmpVerdict(p50.diff); v != "HEAD lower" {
		t.Errorf("verdict %q", v)
	}
	// Same samples on both sides: 0 difference, an interval around it.
	control := rowNamed(t, rows, "task exit → STOPPED received on containerd's own stream")
	if !control.m.control || control.diff.Diff != 0 || control.diff.Lo != 0 || control.diff.Hi != 0 {
		t.Errorf("control %+v", control)
	}
	// The emit stage is absent on both sides (every EmittedMs negative): no row at all.
	for _, r := range rows {
		if strings.HasPrefix(r.m.name, "pleg-nri emits") {
			t.Errorf("row %q from no samples", r.m.name)
		}
	}
	// Deterministic: the bootstrap starts from a fixed seed.
	again := rowNamed(t, compareRows(runs), "task exit → STOPPED received on pleg-nri's stream, p50")
	if again.diff != p50.diff {
		t.Errorf("second computation %+v, first %+v", again.diff, p50.diff)
	}
}

func TestCompareRowsFromFakeRuns(t *testing.T) {
	// HEAD: proxy adds 50 µs instead of BASE's 20, pod starts alike, exits alike.
	runs := fakeRuns(func(round int) *Results { return fakeResults(uint64(round), 2, 50, 3) },
		func(round int) *Results { return fakeResults(uint64(10+round), 2, 20, 3) })
	rows := compareRows(runs)
	added := rowNamed(t, rows, "Version through pleg-nri, added latency p50")
	if cmpVerdict(added.diff) != "**HEAD higher**" || added.diff.Diff < 20 || added.diff.Diff > 40 {
		t.Errorf("Version added latency %+v (%s), want about +30 µs beyond noise", added.diff, cmpVerdict(added.diff))
	}
	if added.head/added.base < 2 {
		t.Errorf("added latency head %g, base %g", added.head, added.base)
	}
	missed := rowNamed(t, rows, "STOPPED events pleg-nri's stream never delivered")
	if missed.head != 2 || missed.base != 2 || !math.IsNaN(missed.diff.Diff) || missed.rounds[1][SideHead] != 1 {
		t.Errorf("missed %+v", missed)
	}
	hook := rowNamed(t, rows, "NRI callback handling in the plugin, p50")
	// Pooled: twice the histogram; rank 1000 of 2000 in (10, 25] µs holding 1600: 10 + 15*(800/1600).
	if math.Abs(hook.head-17.5) > 1e-9 || hook.headN != 2000 {
		t.Errorf("hook p50 %g µs over %d", hook.head, hook.headN)
	}
	if hook.diff.Diff != 0 || hook.diff.Lo > 0 || hook.diff.Hi < 0 || hook.diff.Hi-hook.diff.Lo > 3 {
		t.Errorf("hook diff %+v: want 0 inside a narrow interval", hook.diff)
	}
	if cmpVerdict(hook.diff) != "not told apart from noise" {
		t.Errorf("hook verdict %q", cmpVerdict(hook.diff))
	}
	rowNamed(t, rows, "`pleg_nri_emit_latency_seconds`, p99")
	pod := rowNamed(t, rows, "pod start, added by pleg-nri")
	if math.IsNaN(pod.diff.Lo) || pod.diff.Lo > pod.diff.Diff || pod.diff.Hi < pod.diff.Diff || pod.headN != 60 {
		t.Errorf("pod start overhead %+v: want the difference inside its interval, 60 samples a side", pod.diff)
	}
}

func TestResamplerHistogram(t *testing.T) {
	h := []Bucket{{1, 3}, {2, 3}, {5, 10}, {math.MaxFloat64, 12}}
	next := resampler(obs{hist: h})
	rng := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		r := next(rng)
		if len(r.hist) != len(h) || r.hist[len(h)-1].Count != 12 {
			t.Fatalf("resample %v: want %d buckets and 12 observations", r.hist, len(h))
		}
		for i, b := range r.hist {
			if b.LE != h[i].LE || (i > 0 && b.Count < r.hist[i-1].Count) {
				t.Fatalf("resample %v is not a cumulative histogram on %v's bounds", r.hist, h)
			}
		}
		// The empty bucket (1, 2] stays empty.
		if r.hist[1].Count != r.hist[0].Count {
			t.Fatalf("resample %v filled an empty bucket", r.hist)
		}
	}
}

func TestPoolHistograms(t *testing.T) {
	p := pool([]obs{{hist: []Bucket{{1, 1}, {math.MaxFloat64, 2}}}, {hist: []Bucket{{math.MaxFloat64, 5}, {1, 4}}}})
	want := []Bucket{{1, 5}, {math.MaxFloat64, 7}}
	if !reflect.DeepEqual(p.hist, want) {
		t.Errorf("pooled %v, want %v", p.hist, want)
	}
}

func TestLoadComparedUnknownSections(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.json")
	data := `{"date": "2026-12-06T04:00:00Z", "proxy": {"methods": []}, "state_reads": {"methods": []}, "zz_new": 1}`
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	r, unknown, err := LoadCompared(path)
	if err != nil {
		t.Fatal(err)
	}
	if r.Proxy == nil || !slices.Equal(unknown, []string{"state_reads", "zz_new"}) {
		t.Errorf("proxy %v, unknown %v", r.Proxy, unknown)
	}
	r, unknown, err = LoadCompared(filepath.Join(t.TempDir(), "none.json"))
	if err != nil || r == nil || unknown != nil {
		t.Errorf("missing file: %v, %v, %v", r, unknown, err)
	}
}

func TestCompareMarkdown(t *testing.T) {
	runs := fakeRuns(func(round int) *Results { return fakeResults(uint64(round), 2, 50, 3) },
		func(round int) *Results {
			r := fakeResults(uint64(10+round), 2, 20, 3)
			r.PodStart.WithNoStateDirMs = nil // BASE predates the control phase
			return r
		})
	runs[1].Unknown = []string{"state_reads"} // round 1's second run is BASE's
	runs[3].ExitCode = 1                      // round 2's second run is HEAD's
	runs[3].Results.PodStart = nil
	c := &Comparison{Command: "make bench-compare BASE=a1ca225 ROUNDS=2", Head: "ef29970 (tree clean)", Base: "a1ca225 deploy: ...",
		Machine: "2 CPUs, Linux 6.1.0", BenchCommand: "go test -bench . ./test/containerd-it/", Runs: runs}
	md := CompareMarkdown(c)
	for _, want := range []string{
		"Generated by `make bench-compare BASE=a1ca225 ROUNDS=2`, from runs between 2026-12-07T19:00:00Z and 2026-12-07T19:23:00Z.",
		"- HEAD: ef29970 (tree clean)\n- BASE: a1ca225 deploy: ...\n",
		"- Machine: 2 CPUs, Linux 6.1.0; the benchmarks saw 2 CPUs, Linux 6.1.0, containerd v2.4.2, go1.26.8.",
		"`go test -bench . ./test/containerd-it/`",
		"not paired across runs",
		"Higher on HEAD than on BASE beyond the interval: Version through pleg-nri, added latency p50",
		"STOPPED events pleg-nri's stream never delivered: HEAD 2, BASE 2.",
		"pod start with pleg-nri and no state-dir, median (missing on BASE)",
		"Sections of BASE's results this report does not know (a benchmark the other side lacks; not compared): `state_reads`.",
		"**Runs that failed** (their results hold the benchmarks that completed): round 2 HEAD (exit 1).",
		"| 1 | first | HEAD | 2026-12-07 19:00:00 | 5m0s | 1.00 0.80 0.50 | 2.10 1.20 0.70 | 0 |",
		"| 2 | second | HEAD | 2026-12-07 19:18:00 | 5m0s |",
		"| measure | 1 HEAD¹ | 1 BASE | 2 HEAD | 2 BASE¹ |",
		"| task exit → STOPPED received on containerd's own stream, p50 (control) |",
		"ListContainers listed 12 containers on HEAD, 12 containers on BASE.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	// Round 2's HEAD run has no pod starts: a dash in its column, the pooled figure from round 1 alone.
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "| pod start with pleg-nri, median |") {
			if cells := strings.Split(line, "|"); len(cells) == 7 && strings.TrimSpace(cells[4]) != "—" {
				t.Errorf("round 2 HEAD cell of %q is not a dash", line)
			}
		}
		if strings.HasPrefix(line, "| pod start with pleg-nri, median | ") && strings.Contains(line, "30 / 60") {
			return
		}
	}
	t.Errorf("no pooled pod start row with 30 / 60 samples in:\n%s", md)
}

func TestCompareMarkdownRunWithoutResults(t *testing.T) {
	// BASE's run failed before any benchmark wrote its results: every measure is HEAD's alone.
	runs := fakeRuns(func(round int) *Results { return fakeResults(uint64(round), 2, 50, 3) }, func(int) *Results { return nil })
	md := CompareMarkdown(&Comparison{Command: "make bench-compare BASE=x ROUNDS=2", Runs: runs})
	for _, want := range []string{
		"task exit → STOPPED received on pleg-nri's stream, p50 (missing on BASE)",
		"| task exit → STOPPED received on pleg-nri's stream, p50 | 2.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q:\n%s", want, md)
		}
	}
}

package benchreport

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"
)

// The two sides of a comparison (make bench-compare): the tree it runs in and another commit's.
const (
	SideHead = "HEAD"
	SideBase = "BASE"
)

// CompareRun is one run of make bench's benchmarks in a comparison of two trees.
type CompareRun struct {
	// Round counts from 1; each round runs both sides once.
	Round int
	// Side is SideHead or SideBase.
	Side string
	// First says the run came first in its round.
	First bool
	// Start and End are when its go test started and ended.
	Start, End time.Time
	// LoadBefore and LoadAfter are the machine's load averages (1, 5, 15 min) at Start and End.
	LoadBefore, LoadAfter string
	// ExitCode is its go test's: the results of a failed run hold the benchmarks that completed.
	ExitCode int
	// Results are what its benchmarks wrote (empty when they wrote nothing).
	Results *Results
	// Unknown are the top-level sections of its results file that Results has no field for (a
	// benchmark only one side has): listed in the report, not compared.
	Unknown []string
}

// Comparison is what make bench-compare ran, for CompareMarkdown.
type Comparison struct {
	// Command reproduces the comparison.
	Command string
	// Head and Base describe the two revisions (commit, subject).
	Head, Base string
	// Machine is where it ran (CPUs, kernel), as the script saw it.
	Machine string
	// BenchCommand is the go test command each run ran.
	BenchCommand string
	Runs         []CompareRun
}

// LoadCompared reads a results file like Load and also returns its top-level sections that Results
// has no field for, sorted.
func LoadCompared(path string) (*Results, []string, error) {
	r, err := Load(path)
	if err != nil {
		return nil, nil, err
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return r, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	known := map[string]bool{}
	t := reflect.TypeFor[Results]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		known[name] = true
	}
	var unknown []string
	for k := range top {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	return r, unknown, nil
}

// cmpKind is how a measure's figure is computed from its samples.
type cmpKind int

const (
	// kindQuantile: the q-quantile of the samples a.
	kindQuantile cmpKind = iota
	// kindQuantileDiff: the q-quantile of a minus that of b (a cost added to a control measured in
	// the same run, e.g. through pleg-nri minus direct).
	kindQuantileDiff
	// kindHistogram: the q-quantile of the histogram, bucket-interpolated, times scale.
	kindHistogram
	// kindCount: a count, summed over the runs; no interval.
	kindCount
)

// obs is what one run (or a side's runs, pooled) holds of a measure.
type obs struct {
	a, b  []float64
	hist  []Bucket
	count float64
}

// cmpMeasure is one row of the comparison.
type cmpMeasure struct {
	name string
	unit string // "ms", "µs", or "" for a count
	kind cmpKind
	q    float64
	// scale converts a histogram's seconds into unit.
	scale float64
	// control: not a figure of pleg-nri's (containerd's own stream, calls direct to containerd, pod
	// starts without pleg-nri): it tells how the machine differed between the sides.
	control bool
	get     func(*Results) (obs, bool)
}

func (m cmpMeasure) value(o obs) float64 {
	switch m.kind {
	case kindQuantile:
		return Quantile(o.a, m.q)
	case kindQuantileDiff:
		if len(o.a) == 0 || len(o.b) == 0 {
			return math.NaN()
		}
		return Quantile(o.a, m.q) - Quantile(o.b, m.q)
	case kindHistogram:
		return HistogramQuantile(o.hist, m.q) * m.scale
	}
	return o.count
}

// n is how many samples o holds (the first set's, for a difference).
func (m cmpMeasure) n(o obs) int {
	switch m.kind {
	case kindHistogram:
		return int(histTotal(o.hist))
	case kindCount:
		return 0
	}
	return len(o.a)
}

func histTotal(h []Bucket) float64 {
	var t float64
	for _, b := range h {
		t = max(t, b.Count)
	}
	return t
}

// pool joins the observations of a side's runs.
func pool(runs []obs) obs {
	var p obs
	byLE := map[float64]float64{}
	for _, o := range runs {
		p.a = append(p.a, o.a...)
		p.b = append(p.b, o.b...)
		p.count += o.count
		for _, b := range o.hist {
			byLE[b.LE] += b.Count
		}
	}
	for le, c := range byLE {
		p.hist = append(p.hist, Bucket{LE: le, Count: c})
	}
	sortBuckets(p.hist)
	return p
}

// resampler returns a function that draws a bootstrap resample of o: each sample set with
// replacement on its own, a histogram's observations (as their buckets) likewise.
func resampler(o obs) func(*rand.Rand) obs {
	ra, rb := make([]float64, len(o.a)), make([]float64, len(o.b))
	// bucketOf[i] is the bucket of the i-th observation of the histogram.
	var bucketOf []int32
	below := 0.0
	for i, b := range o.hist {
		for range int(math.Round(b.Count - below)) {
			bucketOf = append(bucketOf, int32(i))
		}
		below = max(below, b.Count)
	}
	counts := make([]float64, len(o.hist))
	hist := make([]Bucket, len(o.hist))
	return func(rng *rand.Rand) obs {
		var r obs
		if len(o.a) > 0 {
			for i := range ra {
				ra[i] = o.a[rng.IntN(len(o.a))]
			}
			r.a = ra
		}
		if len(o.b) > 0 {
			for i := range rb {
				rb[i] = o.b[rng.IntN(len(o.b))]
			}
			r.b = rb
		}
		if len(bucketOf) > 0 {
			clear(counts)
			for range bucketOf {
				counts[bucketOf[rng.IntN(len(bucketOf))]]++
			}
			cum := 0.0
			for i, b := range o.hist {
				cum += counts[i]
				hist[i] = Bucket{LE: b.LE, Count: cum}
			}
			r.hist = hist
		}
		return r
	}
}

// cmpMeasures are the measures to compare: every one either side's runs hold, in report order.
func cmpMeasures(runs []CompareRun) []cmpMeasure {
	exit := func(plegNRI bool) func(*Results) (obs, bool) {
		return func(r *Results) (obs, bool) {
			if r.ExitLatency == nil {
				return obs{}, false
			}
			ms, _ := r.ExitLatency.Latencies(plegNRI)
			return obs{a: ms}, true
		}
	}
	var ms []cmpMeasure
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50", .5}, {"p90", .9}, {"p99", .99}} {
		ms = append(ms, cmpMeasure{name: "task exit → STOPPED received on pleg-nri's stream, " + q.name, unit: "ms", q: q.q, get: exit(true)})
	}
	ms = append(ms,
		cmpMeasure{name: "STOPPED events pleg-nri's stream never delivered", kind: kindCount, get: func(r *Results) (obs, bool) {
			if r.ExitLatency == nil {
				return obs{}, false
			}
			_, missed := r.ExitLatency.Latencies(true)
			return obs{count: float64(missed)}, true
		}},
		cmpMeasure{name: "pleg-nri emits STOPPED (its `created_at`), p50", unit: "ms", q: .5, get: func(r *Results) (obs, bool) {
			if r.ExitLatency == nil {
				return obs{}, false
			}
			v := r.ExitLatency.Stage(func(x Exit) float64 { return x.EmittedMs })
			return obs{a: v}, len(v) > 0
		}},
		cmpMeasure{name: "task exit → STOPPED received on containerd's own stream, p50", unit: "ms", q: .5, control: true, get: exit(false)},
	)
	hook := func(r *Results) (obs, bool) {
		if r.Hook == nil {
			return obs{}, false
		}
		return obs{hist: r.Hook.Buckets}, len(r.Hook.Buckets) > 0
	}
	ms = append(ms,
		cmpMeasure{name: "NRI callback handling in the plugin, p50", unit: "µs", kind: kindHistogram, q: .5, scale: 1e6, get: hook},
		cmpMeasure{name: "NRI callback handling in the plugin, p99", unit: "µs", kind: kindHistogram, q: .99, scale: 1e6, get: hook},
	)
	var methods []string
	for _, run := range runs {
		if p := run.Results.Proxy; p != nil {
			for _, m := range p.Methods {
				if !slices.Contains(methods, m.Method) {
					methods = append(methods, m.Method)
				}
			}
		}
	}
	for _, name := range methods {
		method := func(r *Results) (ProxyMethod, bool) {
			if r.Proxy == nil {
				return ProxyMethod{}, false
			}
			i := slices.IndexFunc(r.Proxy.Methods, func(m ProxyMethod) bool { return m.Method == name })
			if i < 0 {
				return ProxyMethod{}, false
			}
			return r.Proxy.Methods[i], true
		}
		ms = append(ms,
			cmpMeasure{name: name + " through pleg-nri, added latency p50 (p50 through pleg-nri − p50 direct)", unit: "µs", kind: kindQuantileDiff, q: .5,
				get: func(r *Results) (obs, bool) {
					m, ok := method(r)
					return obs{a: m.ProxiedUs, b: m.DirectUs}, ok
				}},
			cmpMeasure{name: name + " direct to containerd, p50", unit: "µs", q: .5, control: true,
				get: func(r *Results) (obs, bool) {
					m, ok := method(r)
					return obs{a: m.DirectUs}, ok
				}},
		)
	}
	podStart := func(f func(*PodStart) []float64) func(*Results) (obs, bool) {
		return func(r *Results) (obs, bool) {
			if r.PodStart == nil {
				return obs{}, false
			}
			v := f(r.PodStart)
			return obs{a: v}, len(v) > 0
		}
	}
	ms = append(ms,
		cmpMeasure{name: "pod start with pleg-nri, median", unit: "ms", q: .5, get: podStart(func(s *PodStart) []float64 { return s.WithMs })},
		cmpMeasure{name: "pod start, added by pleg-nri (median with − median without)", unit: "ms", kind: kindQuantileDiff, q: .5,
			get: func(r *Results) (obs, bool) {
				if r.PodStart == nil {
					return obs{}, false
				}
				return obs{a: r.PodStart.WithMs, b: r.PodStart.WithoutMs}, true
			}},
		cmpMeasure{name: "pod start with pleg-nri and no state-dir, median", unit: "ms", q: .5, get: podStart(func(s *PodStart) []float64 { return s.WithNoStateDirMs })},
		cmpMeasure{name: "pod start without pleg-nri, median", unit: "ms", q: .5, control: true, get: podStart(func(s *PodStart) []float64 { return s.WithoutMs })},
	)
	var internals []string
	for _, run := range runs {
		for name := range run.Results.Internals {
			if !slices.Contains(internals, name) {
				internals = append(internals, name)
			}
		}
	}
	slices.Sort(internals)
	for _, name := range internals {
		get := func(r *Results) (obs, bool) {
			h := r.Internals[name]
			if h == nil || len(h.Buckets) == 0 {
				return obs{}, false
			}
			return obs{hist: h.Buckets}, true
		}
		for _, q := range []struct {
			name string
			q    float64
		}{{"p50", .5}, {"p99", .99}} {
			ms = append(ms, cmpMeasure{name: fmt.Sprintf("`%s`, %s", name, q.name), unit: "ms", kind: kindHistogram, q: q.q, scale: 1e3, get: get})
		}
	}
	return ms
}

// cmpRow is a measure compared.
// label is the measure's name in a table, a control marked as one.
func (m cmpMeasure) label() string {
	if m.control {
		return m.name + " (control)"
	}
	return m.name
}

type cmpRow struct {
	m cmpMeasure
	// head and base are the pooled figures, NaN on a side whose runs lack the measure; headN and
	// baseN the pooled samples.
	head, base   float64
	headN, baseN int
	// diff is head minus base with its 95 % bootstrap interval (NaNs for a count or a missing side).
	diff Diff
	// rounds holds each run's own figure, by round and side (NaN: that run lacks the measure).
	rounds map[int]map[string]float64
}

// has says whether the side's runs hold the measure.
func (r cmpRow) has(side string) bool {
	if side == SideHead {
		return !math.IsNaN(r.head)
	}
	return !math.IsNaN(r.base)
}

// compareRows computes every measure's row.
func compareRows(runs []CompareRun) []cmpRow {
	runs = slices.Clone(runs)
	for i := range runs {
		if runs[i].Results == nil {
			runs[i].Results = &Results{}
		}
	}
	var rows []cmpRow
	for _, m := range cmpMeasures(runs) {
		row := cmpRow{m: m, rounds: map[int]map[string]float64{}}
		bySide := map[string][]obs{}
		for _, run := range runs {
			if row.rounds[run.Round] == nil {
				row.rounds[run.Round] = map[string]float64{}
			}
			o, ok := m.get(run.Results)
			if !ok {
				row.rounds[run.Round][run.Side] = math.NaN()
				continue
			}
			row.rounds[run.Round][run.Side] = m.value(o)
			bySide[run.Side] = append(bySide[run.Side], o)
		}
		if len(bySide) == 0 {
			continue // neither side has it (a proxy method of no run, say)
		}
		head, base := pool(bySide[SideHead]), pool(bySide[SideBase])
		row.head, row.base = math.NaN(), math.NaN()
		if len(bySide[SideHead]) > 0 {
			row.head, row.headN = m.value(head), m.n(head)
		}
		if len(bySide[SideBase]) > 0 {
			row.base, row.baseN = m.value(base), m.n(base)
		}
		row.diff = Diff{Diff: math.NaN(), Lo: math.NaN(), Hi: math.NaN(), NA: row.headN, NB: row.baseN}
		if m.kind != kindCount && !math.IsNaN(row.head) && !math.IsNaN(row.base) {
			rh, rb := resampler(head), resampler(base)
			row.diff.Diff = row.head - row.base
			row.diff.Lo, row.diff.Hi = bootstrap(func(rng *rand.Rand) float64 {
				return m.value(rh(rng)) - m.value(rb(rng))
			})
		}
		rows = append(rows, row)
	}
	return rows
}

// cmpVerdict says where HEAD's figure is against BASE's, for a figure that is better lower.
func cmpVerdict(d Diff) string {
	switch {
	case math.IsNaN(d.Diff) || math.IsNaN(d.Lo):
		return "—"
	case d.Lo > 0:
		return "**HEAD higher**"
	case d.Hi < 0:
		return "HEAD lower"
	}
	return "not told apart from noise"
}

// CompareMarkdown renders a comparison as docs/bench-compare-<base>.md.
func CompareMarkdown(c *Comparison) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	runs := slices.Clone(c.Runs)
	for i := range runs {
		if runs[i].Results == nil {
			runs[i].Results = &Results{}
		}
	}
	sort.SliceStable(runs, func(i, j int) bool {
		if runs[i].Round != runs[j].Round {
			return runs[i].Round < runs[j].Round
		}
		return runs[i].First && !runs[j].First
	})
	rounds := 0
	for _, r := range runs {
		rounds = max(rounds, r.Round)
	}
	rows := compareRows(runs)

	w("# make bench: HEAD against BASE\n\n")
	w("Generated by `%s`", c.Command)
	if len(runs) > 0 {
		w(", from runs between %s and %s", runs[0].Start.UTC().Format(time.RFC3339), lastEnd(runs).UTC().Format(time.RFC3339))
	}
	w(".\n\n")
	w("- HEAD: %s\n- BASE: %s\n", c.Head, c.Base)
	w("- Machine: %s", c.Machine)
	for _, m := range resultsMachines(runs) {
		w("; %s", m)
	}
	w(".\n")
	w("- Each round runs `make bench`'s benchmarks once in each tree, HEAD's in the tree the command ran in and\n")
	w("  BASE's in a temporary worktree of BASE (its own harness and pleg-nri binary, the same dependency cache),\n")
	w("  one after the other; which side goes first alternates from round to round (HEAD, BASE, then BASE, HEAD, ...):\n")
	w("  `%s`.\n", c.BenchCommand)
	w("- Pooled: a side's samples of every round together. HEAD − BASE is the pooled figures' difference, with a\n")
	w("  95 %% bootstrap interval (%d resamples of each side's pooled samples, a fixed seed: the interval is a\n", bootstrapResamples)
	w("  function of the samples). Samples are not paired across runs (the i-th exit of one run has nothing to do\n")
	w("  with the i-th of another), so the interval is unpaired; the rounds are interleaved so that both sides see\n")
	w("  the same stretch of the machine's load. A run that differs from the others as a whole (a noisy minute)\n")
	w("  makes a pooled interval too narrow, not too wide: the rounds' own figures, side by side below, show that\n")
	w("  run-to-run noise.\n")
	w("- The NRI callback and pleg-nri's own figures come from histograms (bucket-interpolated, as Prometheus'\n")
	w("  `histogram_quantile`); their interval resamples the observations by bucket.\n")
	w("- Controls are figures pleg-nri has no part in (containerd's own stream, calls direct to containerd, pod\n")
	w("  starts without pleg-nri): where they differ, the machine differed between the sides.\n")
	w("- Not part of it: the plugin's in-process `BenchmarkHook` (`go test -bench ./plugin/`), which `make bench` adds\n")
	w("  to its own report, and `BenchmarkRestartStall` (`make bench-stall`).\n\n")

	w("## Summary\n\n")
	var higher, controls []string
	for _, r := range rows {
		if cmpVerdict(r.diff) != "**HEAD higher**" {
			continue
		}
		if r.m.control {
			controls = append(controls, r.m.name)
		} else {
			higher = append(higher, r.m.name)
		}
	}
	if len(higher) == 0 {
		w("No figure of pleg-nri's is higher on HEAD than on BASE beyond the interval.")
	} else {
		w("Higher on HEAD than on BASE beyond the interval: %s.", strings.Join(higher, "; "))
	}
	if len(controls) > 0 {
		w(" Controls higher on HEAD: %s (the machine, not pleg-nri).", strings.Join(controls, "; "))
	}
	for _, r := range rows {
		if r.m.kind == kindCount && (r.head > 0 || r.base > 0) {
			w(" %s: HEAD %s, BASE %s.", r.m.name, count(r.head), count(r.base))
		}
	}
	w(" With %d %s a side, check a difference against the rounds' own figures below before believing it.\n\n", rounds, plural(rounds, "round"))
	var missing []string
	for _, r := range rows {
		for _, side := range []string{SideHead, SideBase} {
			if !r.has(side) {
				missing = append(missing, fmt.Sprintf("%s (missing on %s)", r.m.name, side))
			}
		}
	}
	unknown := map[string][]string{}
	for _, run := range runs {
		for _, u := range run.Unknown {
			if !slices.Contains(unknown[run.Side], u) {
				unknown[run.Side] = append(unknown[run.Side], u)
			}
		}
	}
	if len(missing) > 0 {
		w("Measures only one side's results hold (not compared): %s.\n\n", strings.Join(missing, "; "))
	}
	for _, side := range []string{SideHead, SideBase} {
		if u := unknown[side]; len(u) > 0 {
			w("Sections of %s's results this report does not know (a benchmark the other side lacks; not compared): `%s`.\n\n",
				side, strings.Join(u, "`, `"))
		}
	}
	var failed []string
	for _, run := range runs {
		if run.ExitCode != 0 {
			failed = append(failed, fmt.Sprintf("round %d %s (exit %d)", run.Round, run.Side, run.ExitCode))
		}
	}
	if len(failed) > 0 {
		w("**Runs that failed** (their results hold the benchmarks that completed): %s.\n\n", strings.Join(failed, ", "))
	}

	w("## Runs\n\n")
	w("| round | order | side | started (UTC) | took | load before (1, 5, 15 min) | load after | exit |\n")
	w("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, run := range runs {
		order := "second"
		if run.First {
			order = "first"
		}
		w("| %d | %s | %s | %s | %s | %s | %s | %d |\n", run.Round, order, run.Side, run.Start.UTC().Format("2006-01-02 15:04:05"),
			run.End.Sub(run.Start).Round(time.Second), orDash(run.LoadBefore), orDash(run.LoadAfter), run.ExitCode)
	}
	w("\n")

	w("## Pooled\n\n")
	w("Every figure is better lower.\n\n")
	w("| measure | HEAD | BASE | HEAD / BASE | HEAD − BASE (95 %% interval) | samples HEAD / BASE | verdict |\n")
	w("| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		name := r.m.label()
		diff, samples := "—", "—"
		if r.m.kind != kindCount && !math.IsNaN(r.diff.Diff) {
			diff = fmt.Sprintf("%s (%s to %s)", signed(r.m.unit, r.diff.Diff), signed(r.m.unit, r.diff.Lo), signed(r.m.unit, r.diff.Hi))
		}
		if r.m.kind != kindCount {
			samples = fmt.Sprintf("%s / %s", nOrDash(r.headN, r.has(SideHead)), nOrDash(r.baseN, r.has(SideBase)))
		}
		w("| %s | %s | %s | %s | %s | %s | %s |\n", name, figure(r.m.unit, r.head), figure(r.m.unit, r.base),
			headRatio(r.m, r.head, r.base), diff, samples, cmpVerdict(r.diff))
	}
	w("\n")

	w("## Each round\n\n")
	w("Each run's own figure (— where that run's results lack the measure); the side that ran first in a round is marked ¹.\n\n")
	w("| measure |")
	for round := 1; round <= rounds; round++ {
		for _, side := range roundSides(runs, round) {
			w(" %d %s |", round, side)
		}
	}
	w("\n| --- |")
	for round := 1; round <= rounds; round++ {
		for range roundSides(runs, round) {
			w(" --- |")
		}
	}
	w("\n")
	for _, r := range rows {
		name := r.m.label()
		w("| %s |", name)
		for round := 1; round <= rounds; round++ {
			for _, side := range roundSides(runs, round) {
				v, ok := r.rounds[round][strings.TrimSuffix(side, "¹")]
				if !ok {
					v = math.NaN()
				}
				w(" %s |", figure(r.m.unit, v))
			}
		}
		w("\n")
	}
	w("\n")
	if notes := proxyItems(runs); notes != "" {
		w("ListContainers listed %s.\n", notes)
	}
	return b.String()
}

// roundSides are the column heads of a round: HEAD then BASE, the one that ran first marked ¹.
func roundSides(runs []CompareRun, round int) []string {
	var out []string
	for _, side := range []string{SideHead, SideBase} {
		for _, r := range runs {
			if r.Round == round && r.Side == side {
				if r.First {
					side += "¹"
				}
				out = append(out, side)
				break
			}
		}
	}
	return out
}

func lastEnd(runs []CompareRun) time.Time {
	var t time.Time
	for _, r := range runs {
		if r.End.After(t) {
			t = r.End
		}
	}
	return t
}

// resultsMachines is what the runs' results say of the machine (containerd's and Go's versions), per
// side when the sides differ.
func resultsMachines(runs []CompareRun) []string {
	bySide := map[string]string{}
	for _, r := range runs {
		if r.Results.Machine != "" && bySide[r.Side] == "" {
			bySide[r.Side] = r.Results.Machine
		}
	}
	switch {
	case bySide[SideHead] == bySide[SideBase] && bySide[SideHead] != "":
		return []string{"the benchmarks saw " + bySide[SideHead]}
	case bySide[SideHead] == "" && bySide[SideBase] == "":
		return nil
	}
	var out []string
	for _, side := range []string{SideHead, SideBase} {
		if m := bySide[side]; m != "" {
			out = append(out, fmt.Sprintf("%s's benchmarks saw %s", side, m))
		}
	}
	return out
}

// proxyItems says how many containers each side's ListContainers listed.
func proxyItems(runs []CompareRun) string {
	items := map[string]map[int]bool{}
	for _, r := range runs {
		if r.Results.Proxy == nil {
			continue
		}
		for _, m := range r.Results.Proxy.Methods {
			if m.Method == "ListContainers" {
				if items[r.Side] == nil {
					items[r.Side] = map[int]bool{}
				}
				items[r.Side][m.Items] = true
			}
		}
	}
	var parts []string
	for _, side := range []string{SideHead, SideBase} {
		if len(items[side]) == 0 {
			continue
		}
		var ns []string
		for _, n := range slices.Sorted(maps.Keys(items[side])) {
			ns = append(ns, fmt.Sprint(n))
		}
		parts = append(parts, fmt.Sprintf("%s containers on %s", strings.Join(ns, " or "), side))
	}
	return strings.Join(parts, ", ")
}

func figure(unit string, v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case v < 0:
		return "−" + figure(unit, -v)
	case unit == "ms":
		return ms(v)
	case unit == "µs":
		return us(v)
	}
	return count(v)
}

func count(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	return fmt.Sprintf("%.0f", v)
}

// signed renders a difference with its sign.
func signed(unit string, v float64) string {
	s := figure(unit, math.Abs(v))
	switch {
	case math.IsNaN(v):
		return s
	case v < 0:
		return "−" + s
	}
	return "+" + s
}

// headRatio is HEAD's figure over BASE's (none for a count, or where either is not above 0: an added
// cost can be negative).
func headRatio(m cmpMeasure, head, base float64) string {
	if m.kind == kindCount || math.IsNaN(head) || math.IsNaN(base) || head <= 0 || base <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", head/base)
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func nOrDash(n int, ok bool) string {
	if !ok {
		return "—"
	}
	return fmt.Sprint(n)
}

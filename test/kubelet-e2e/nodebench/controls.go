package nodebench

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
)

// Comparison is one setup of make bench-kubelet against another, measure by measure: what the control
// setups (pleg-nri attached while the kubelet uses containerd's stream) tell apart.
type Comparison struct {
	// A and B name the setups; the differences are A's minus B's.
	A, B string
	// Isolates says what the difference between A and B is made of.
	Isolates string
	Measures []MeasureDiff
}

// MeasureDiff is one measure of a Comparison, in ms.
type MeasureDiff struct {
	Measure string
	// A50 and B50 are the medians of every sample of each setup.
	A50, B50 float64
	// Diff is A50 - B50 with the unpaired bootstrap interval (every sample of each setup, resampled on
	// its own, as the report's other differences).
	Diff benchreport.Diff
	// Paired is the median of the differences of the pairs (the samples of A and B taken at the same
	// place of the same round), with the paired bootstrap interval.
	Paired benchreport.Diff
}

// Compare compares one measure of two setups from their samples keyed by where they were taken (the
// round and the container): every sample goes into the unpaired difference of the medians, the samples
// of keys both setups have into the paired one.
func Compare(measure string, a, b map[string]float64) MeasureDiff {
	va, vb := slices.Collect(maps.Values(a)), slices.Collect(maps.Values(b))
	pa, pb := Pair(a, b)
	return MeasureDiff{Measure: measure, A50: benchreport.Median(va), B50: benchreport.Median(vb),
		Diff: benchreport.QuantileDiff(va, vb, 0.5), Paired: benchreport.PairedQuantileDiff(pa, pb, 0.5)}
}

// Pair returns the values of the keys that both a and b have, in the keys' order: xa[i] and xb[i]
// were taken at the same place.
func Pair(a, b map[string]float64) (xa, xb []float64) {
	for _, k := range slices.Sorted(maps.Keys(a)) {
		if y, ok := b[k]; ok {
			xa, xb = append(xa, a[k]), append(xb, y)
		}
	}
	return xa, xb
}

// Measure returns the measure named name (nil when there is none).
func (c Comparison) Measure(name string) *MeasureDiff {
	for i := range c.Measures {
		if c.Measures[i].Measure == name {
			return &c.Measures[i]
		}
	}
	return nil
}

// ComparisonsMarkdown renders the comparisons as one table each.
func ComparisonsMarkdown(cs []Comparison) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	for _, c := range cs {
		p("**%s − %s**: %s.", c.A, c.B, c.Isolates)
		p("")
		p("| measure | p50, %s | p50, %s | difference of the p50s (95 %% interval, samples) | median of the paired differences (95 %% interval, pairs) |", c.A, c.B)
		p("| --- | ---: | ---: | --- | --- |")
		for _, m := range c.Measures {
			p("| %s | %s | %s | %s | %s |", m.Measure, Ms(m.A50), Ms(m.B50), m.Diff, m.Paired)
		}
		p("")
	}
	return b.String()
}

// DiffJSON is a benchreport.Diff for JSON (which has no NaN): absent fields when there were no samples.
type DiffJSON struct {
	Diff *float64 `json:"diff_ms,omitempty"`
	Lo   *float64 `json:"lo_ms,omitempty"`
	Hi   *float64 `json:"hi_ms,omitempty"`
	NA   int      `json:"n_a"`
	NB   int      `json:"n_b"`
}

// DiffToJSON converts d, rounded to 0.1 ms.
func DiffToJSON(d benchreport.Diff) DiffJSON {
	f := func(x float64) *float64 {
		if math.IsNaN(x) {
			return nil
		}
		x = math.Round(x*10) / 10
		return &x
	}
	return DiffJSON{Diff: f(d.Diff), Lo: f(d.Lo), Hi: f(d.Hi), NA: d.NA, NB: d.NB}
}

// ComparisonJSON is a Comparison for JSON.
type ComparisonJSON struct {
	A        string        `json:"a"`
	B        string        `json:"b"`
	Isolates string        `json:"isolates"`
	Measures []MeasureJSON `json:"measures"`
}

// MeasureJSON is a MeasureDiff for JSON.
type MeasureJSON struct {
	Measure string   `json:"measure"`
	A50     *float64 `json:"p50_a_ms,omitempty"`
	B50     *float64 `json:"p50_b_ms,omitempty"`
	Diff    DiffJSON `json:"p50_difference"`
	Paired  DiffJSON `json:"paired_median_difference"`
}

// JSON converts c.
func (c Comparison) JSON() ComparisonJSON {
	out := ComparisonJSON{A: c.A, B: c.B, Isolates: c.Isolates}
	for _, m := range c.Measures {
		q := func(x float64) *float64 { return DiffToJSON(benchreport.Diff{Diff: x}).Diff }
		out.Measures = append(out.Measures, MeasureJSON{Measure: m.Measure, A50: q(m.A50), B50: q(m.B50),
			Diff: DiffToJSON(m.Diff), Paired: DiffToJSON(m.Paired)})
	}
	return out
}

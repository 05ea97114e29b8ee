package nodebench

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestPair(t *testing.T) {
	a := map[string]float64{"1/c00": 10, "1/c01": 11, "2/c00": 12}
	b := map[string]float64{"1/c01": 21, "2/c00": 22, "2/c01": 23}
	xa, xb := Pair(a, b)
	if !slices.Equal(xa, []float64{11, 12}) || !slices.Equal(xb, []float64{21, 22}) {
		t.Errorf("Pair = %v, %v; want [11 12], [21 22] (the keys both have, in key order)", xa, xb)
	}
	if xa, xb := Pair(a, nil); xa != nil || xb != nil {
		t.Errorf("Pair with nothing = %v, %v; want nothing", xa, xb)
	}
}

func TestCompare(t *testing.T) {
	// Places as unlike as 10 and 100 ms, each 5 ms longer in a: the paired difference is exactly 5
	// with an interval of 5 to 5; the unpaired one spans the places' own spread and holds 0.
	a, b := map[string]float64{}, map[string]float64{}
	for i := range 24 {
		k := string(rune('a' + i))
		b[k] = 10 + float64(i%2)*90 + float64(i)/10
		a[k] = b[k] + 5
	}
	a["unpaired"] = 1000
	m := Compare("exit → created", a, b)
	if m.Paired.Diff != 5 || m.Paired.Lo != 5 || m.Paired.Hi != 5 || m.Paired.NA != 24 {
		t.Errorf("paired = %+v, want 5 (5 to 5) over 24 pairs", m.Paired)
	}
	if m.Diff.NA != 25 || m.Diff.NB != 24 || m.Diff.Lo > 0 || m.Diff.Hi < 0 {
		t.Errorf("unpaired = %+v, want 25 / 24 samples and an interval holding 0", m.Diff)
	}
	if m.A50-m.B50 != m.Diff.Diff {
		t.Errorf("A50 %g - B50 %g != Diff %g", m.A50, m.B50, m.Diff.Diff)
	}
	c := Comparison{A: "x", B: "y", Isolates: "something", Measures: []MeasureDiff{m, Compare("none", nil, b)}}
	if c.Measure("exit → created") == nil || c.Measure("other") != nil {
		t.Errorf("Measure finds the wrong measures")
	}
	md := ComparisonsMarkdown([]Comparison{c})
	for _, want := range []string{"**x − y**: something.", "| exit → created |", "+5 ms (95 % interval +5 to +5 ms, 24 / 24 samples: later)", "| none | - |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// No NaN reaches the JSON (encoding/json refuses it).
	js, err := json.Marshal(c.JSON())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"paired_median_difference":{"diff_ms":5,"lo_ms":5,"hi_ms":5,"n_a":24,"n_b":24}`) {
		t.Errorf("JSON: %s", js)
	}
	if d := DiffToJSON(Compare("none", nil, b).Diff); d.Diff != nil || d.NB != 24 || !math.IsNaN(Compare("none", nil, b).A50) {
		t.Errorf("no samples: %+v", d)
	}
}

package nodebench

import (
	"encoding/xml"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
)

// svgDoc is what the tests read of a chart: the text of every <text> element, in order, and the
// number of sample dots.
type svgDoc struct {
	texts   []string
	samples int
}

// parseSVG decodes every token of s, failing the test on malformed XML.
func parseSVG(t *testing.T, s string) svgDoc {
	t.Helper()
	var doc svgDoc
	d := xml.NewDecoder(strings.NewReader(s))
	inText := false
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the chart is not well-formed XML: %v\n%s", err, s)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if e.Name.Local == "text" {
				inText = true
				doc.texts = append(doc.texts, "")
			}
			if e.Name.Local == "circle" && slices.Contains(e.Attr, xml.Attr{Name: xml.Name{Local: "class"}, Value: "sample"}) {
				doc.samples++
			}
		case xml.EndElement:
			inText = inText && e.Name.Local != "text"
		case xml.CharData:
			if inText {
				doc.texts[len(doc.texts)-1] += string(e)
			}
		}
	}
	return doc
}

func count(v []string, s string) int {
	n := 0
	for _, x := range v {
		if x == s {
			n++
		}
	}
	return n
}

func TestWorkloadSVG(t *testing.T) {
	// Jobs whose sandbox stop was never seen: that measure has no values in any setup, the others have.
	jobs := func(succeededMs ...int64) []Job {
		var out []Job
		for i, v := range succeededMs {
			out = append(out, Job{Key: string(rune('a' + i)), Finished: 1e9, Succeeded: 1e9 + v*1e6})
		}
		return out
	}
	setups := []WorkloadSetup{
		{Name: "generic (1 s relist) → slow", Chains: []InitChain{chain("1/00", 30, 900, 40), chain("1/01", 0, 1000, 5)},
			Jobs:    jobs(20, 1000, 1500),
			Crashes: []Restart{{Key: "1/00", Finished: 1e9, Started: 1e9 + 120e6, Counted: 1e9 + 140e6}},
			OOMs:    []Restart{{Key: "1/00", Finished: 1e9, Started: 1e9 + 110e6}}},
		{Name: "evented <&> \"fast\"", Chains: []InitChain{chain("1/00", 3, 4, 5)}, Jobs: jobs(2)},
		{Name: "no jobs"},
	}
	out := WorkloadSVG("title with <&>", setups)
	doc := parseSVG(t, out)

	var shown []string
	samples := 0
	for _, m := range WorkloadMeasures {
		n := 0
		for _, s := range setups {
			n += len(Values(m.Of(s)))
		}
		samples += n
		want := 1
		if n == 0 {
			want = 0
		} else {
			shown = append(shown, m.Name)
		}
		if got := count(doc.texts, m.Name); got != want {
			t.Errorf("panel %q: %d titles, want %d (%d values)", m.Name, got, want, n)
		}
	}
	if len(shown) != len(WorkloadMeasures)-1 {
		t.Fatalf("%d measures with values, want all but the sandbox stop: the test's data do not test what they should", len(shown))
	}
	var order []string
	for _, x := range doc.texts {
		if slices.Contains(shown, x) {
			order = append(order, x)
		}
	}
	if !slices.Equal(order, shown) {
		t.Errorf("panels in order %q, want WorkloadMeasures' %q", order, shown)
	}
	// Once in the legend and once per panel, at the setup's row (also for a setup with no values).
	for _, s := range setups {
		if got := count(doc.texts, s.Name); got != 1+len(shown) {
			t.Errorf("setup %q named %d times, want %d (legend and %d panels)", s.Name, got, 1+len(shown), len(shown))
		}
	}
	if doc.samples != samples {
		t.Errorf("%d sample dots, want one per value: %d", doc.samples, samples)
	}
	// Chains 3, steps 9, chain less runc 3, jobs 4, the crash's count and start 2, the sidecar's 1.
	if samples != 3+9+3+4+2+1 {
		t.Fatalf("%d values, want 22: the test's data changed", samples)
	}
	if strings.Contains(out, "<&>") || !strings.Contains(out, "evented &lt;&amp;&gt; &#34;fast&#34;") ||
		!strings.Contains(out, "title with &lt;&amp;&gt;") {
		t.Error("a name or the title is not escaped")
	}
	if doc.texts[0] != "title with <&>" {
		t.Errorf("first text %q, want the title", doc.texts[0])
	}
	// The p50 and p90 (nearest rank) of the jobs of the first setup, and a setup with no sample in a panel.
	for _, want := range []string{"p50 1000 ms, p90 1500 ms, n=3", "p50 -, p90 -, n=0"} {
		if count(doc.texts, want) == 0 {
			t.Errorf("no row says %q", want)
		}
	}
}

func TestWorkloadSVGNothing(t *testing.T) {
	doc := parseSVG(t, WorkloadSVG("empty", []WorkloadSetup{{Name: "a"}}))
	if doc.samples != 0 || count(doc.texts, "a") != 1 {
		t.Errorf("a chart without values: %d samples, setup named %d times, want 0 and 1 (the legend)", doc.samples, count(doc.texts, "a"))
	}
	for _, m := range WorkloadMeasures {
		if count(doc.texts, m.Name) != 0 {
			t.Errorf("a panel %q without values", m.Name)
		}
	}
}

func TestChartRange(t *testing.T) {
	for _, c := range []struct {
		v      []float64
		lo, hi float64
	}{
		{[]float64{12, 300, 1100}, 10, 2000},
		{[]float64{0.3, 4.9}, 0.2, 5},
		{[]float64{-3, 0, 40}, chartFloorMs, 50}, // 0 and less at the floor
		{[]float64{100, 100}, 20, 500},           // a single value: about a decade around it
		{nil, 1, 10},
	} {
		if lo, hi := chartRange(c.v); lo != c.lo || hi != c.hi {
			t.Errorf("chartRange(%v) = %v, %v, want %v, %v", c.v, lo, hi, c.lo, c.hi)
		}
	}
	if got := chartTicks(0.2, 50); !slices.Equal(got, []float64{0.2, 0.5, 1, 2, 5, 10, 20, 50}) {
		t.Errorf("chartTicks(0.2, 50) = %v", got)
	}
	if got := chartTicks(10, 2000); !slices.Equal(got, []float64{10, 20, 50, 100, 200, 500, 1000, 2000}) {
		t.Errorf("chartTicks(10, 2000) = %v", got)
	}
}

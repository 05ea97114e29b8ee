package benchreport

import (
	"math"
	"slices"
	"testing"
)

// spread is n latencies around base ms: base, base+7, base+14, ... wrapped every 10 (0-63 ms above base).
func spread(n int, base float64) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = base + float64((i*7)%10)*7
	}
	return v
}

func TestQuantileDiffSeparates(t *testing.T) {
	ours, theirs := spread(24, 100), spread(24, 200)
	d := QuantileDiff(ours, theirs, 0.5)
	if d.Diff != -100 {
		t.Fatalf("Diff = %v, want -100", d.Diff)
	}
	if !(d.Lo <= d.Diff && d.Diff <= d.Hi) || d.Hi >= 0 {
		t.Fatalf("interval %v..%v: want it around -100 and below 0", d.Lo, d.Hi)
	}
	if d.Verdict() != "sooner" || !d.Sooner(50) || d.Sooner(200) {
		t.Fatalf("verdict %q, Sooner(50) %v, Sooner(200) %v", d.Verdict(), d.Sooner(50), d.Sooner(200))
	}
	if r := QuantileDiff(theirs, ours, 0.5); r.Verdict() != "later" || r.Diff != 100 {
		t.Fatalf("reversed: %v", r)
	}
}

func TestQuantileDiffNoise(t *testing.T) {
	// The same distribution in a different order: the interval must hold 0.
	a := spread(30, 300)
	b := slices.Clone(a)
	slices.Reverse(b)
	b[0] += 5 // not quite identical
	d := QuantileDiff(a, b, 0.5)
	if !(d.Lo <= 0 && 0 <= d.Hi) || d.Verdict() != "not told apart from noise" || d.Sooner(0) {
		t.Fatalf("%v: want an interval holding 0", d)
	}
	if d.NA != 30 || d.NB != 30 {
		t.Fatalf("sizes %d / %d", d.NA, d.NB)
	}
}

func TestQuantileDiffReproducibleAndPure(t *testing.T) {
	a, b := spread(24, 100), spread(25, 130)
	a[3], b[7] = 900, 5 // outliers
	ca, cb := slices.Clone(a), slices.Clone(b)
	d1, d2 := QuantileDiff(a, b, 0.9), QuantileDiff(a, b, 0.9)
	if d1 != d2 {
		t.Fatalf("two calls differ: %v, %v", d1, d2)
	}
	if !slices.Equal(a, ca) || !slices.Equal(b, cb) {
		t.Fatal("QuantileDiff changed its input")
	}
	if d1.Diff != Quantile(a, 0.9)-Quantile(b, 0.9) {
		t.Fatalf("Diff %v is not the difference of the p90s", d1.Diff)
	}
}

func TestQuantileDiffEmpty(t *testing.T) {
	for _, d := range []Diff{QuantileDiff(nil, []float64{1}, 0.5), QuantileDiff([]float64{1}, nil, 0.5)} {
		if !math.IsNaN(d.Diff) || !math.IsNaN(d.Lo) || d.Verdict() != "no samples" || d.String() != "no samples" || d.Sooner(0) {
			t.Fatalf("empty: %+v", d)
		}
	}
}

func TestDiffString(t *testing.T) {
	d := Diff{Diff: -19, Lo: -41.2, Hi: 3.4, NA: 24, NB: 24}
	want := "-19 ms (95 % interval -41 to +3 ms, 24 / 24 samples: not told apart from noise)"
	if got := d.String(); got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

func TestPairedQuantileDiff(t *testing.T) {
	// Tests as unlike as 1 s and 70 s, each 0.5 s longer in a: a paired interval sees the 0.5 s shift
	// that an unpaired one, spanning the tests' own spread, cannot tell from noise.
	b := []float64{1, 2, 3, 10, 11, 25, 36, 64, 70, 72, 4, 6}
	a := make([]float64, len(b))
	for i := range b {
		a[i] = b[i] + 0.5
	}
	d := PairedQuantileDiff(a, b, 0.5)
	if d.Diff != 0.5 || d.Lo != 0.5 || d.Hi != 0.5 || d.Verdict() != "later" || d.NA != len(b) {
		t.Fatalf("paired: %+v, want 0.5 with interval 0.5..0.5, later", d)
	}
	if u := QuantileDiff(a, b, 0.5); u.Verdict() != "not told apart from noise" {
		t.Fatalf("unpaired: %+v, want an interval holding 0", u)
	}
	// Differences on both sides of 0 (a test's polling step either way): noise.
	mixed := slices.Clone(b)
	for i := range mixed {
		if i%2 == 0 {
			mixed[i] += 2
		} else {
			mixed[i] -= 2
		}
	}
	if m := PairedQuantileDiff(mixed, b, 0.5); m.Verdict() != "not told apart from noise" {
		t.Fatalf("mixed: %+v, want an interval holding 0", m)
	}
	// The longer slice's extra samples are not paired; no pairs, no difference.
	if e := PairedQuantileDiff(a, b[:3], 0.5); e.NA != 3 || e.NB != 3 {
		t.Fatalf("pairs counted %d/%d, want 3", e.NA, e.NB)
	}
	if e := PairedQuantileDiff(nil, b, 0.5); !math.IsNaN(e.Diff) || e.Verdict() != "no samples" {
		t.Fatalf("no pairs: %+v", e)
	}
}

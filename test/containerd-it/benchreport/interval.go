package benchreport

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// bootstrapResamples is how many times QuantileDiff resamples; 2000 keeps the interval's own
// wobble (from one seed to another) to a few percent of its width at 24-30 samples a side.
const bootstrapResamples = 2000

// Diff is the difference between one quantile of two sets of samples (A's minus B's) and a 95 %
// bootstrap interval for it.
type Diff struct {
	Diff, Lo, Hi float64
	// NA and NB are the sizes of the two sets.
	NA, NB int
}

// QuantileDiff returns the q-quantile of a minus that of b, with the 2.5th and 97.5th percentiles
// of the same difference over bootstrapResamples resamplings of a and b (each resampled with
// replacement, on its own). The interval says whether the difference tells a gain from noise: when
// it holds 0, another run of the same setups could well come out the other way round. The resampling
// starts from a fixed seed, so the interval is a function of the samples and a report can be
// recomputed from them. Samples are taken as independent; samples taken in rounds that differ among
// themselves make the interval too narrow, not too wide, so rotate setups within rounds. NaNs when
// either set is empty.
func QuantileDiff(a, b []float64, q float64) Diff {
	d := Diff{Diff: math.NaN(), Lo: math.NaN(), Hi: math.NaN(), NA: len(a), NB: len(b)}
	if len(a) == 0 || len(b) == 0 {
		return d
	}
	d.Diff = Quantile(a, q) - Quantile(b, q)
	ra, rb := make([]float64, len(a)), make([]float64, len(b))
	d.Lo, d.Hi = bootstrap(func(rng *rand.Rand) float64 {
		return resampledQuantile(rng, a, ra, q) - resampledQuantile(rng, b, rb, q)
	})
	return d
}

// bootstrap returns the 2.5th and 97.5th percentiles of bootstrapResamples draws of resample, from
// a fixed seed (so the interval is a function of the samples resample draws from).
func bootstrap(resample func(*rand.Rand) float64) (lo, hi float64) {
	rng := rand.New(rand.NewPCG(0x706c6567, 0x6e7269))
	draws := make([]float64, bootstrapResamples)
	for i := range draws {
		draws[i] = resample(rng)
	}
	slices.Sort(draws)
	return sortedQuantile(draws, 0.025), sortedQuantile(draws, 0.975)
}

// PairedQuantileDiff is QuantileDiff for paired samples: a[i] and b[i] measure the same thing (one
// test's duration in two setups, say), so what differs is a[i]-b[i], and the interval resamples the
// pairs rather than each set on its own (which, with pairs as unlike as a 1 s and a 70 s test, would
// make it as wide as the tests' own spread). Diff is the q-quantile of the differences; NA and NB are
// both the number of pairs. Pairs beyond the shorter slice are ignored; NaNs without pairs.
func PairedQuantileDiff(a, b []float64, q float64) Diff {
	n := min(len(a), len(b))
	d := Diff{Diff: math.NaN(), Lo: math.NaN(), Hi: math.NaN(), NA: n, NB: n}
	if n == 0 {
		return d
	}
	diffs := make([]float64, n)
	for i := range diffs {
		diffs[i] = a[i] - b[i]
	}
	d.Diff = Quantile(diffs, q)
	buf := make([]float64, n)
	d.Lo, d.Hi = bootstrap(func(rng *rand.Rand) float64 { return resampledQuantile(rng, diffs, buf, q) })
	return d
}

// resampledQuantile fills buf (len(from)) with draws from from and returns their q-quantile.
func resampledQuantile(rng *rand.Rand, from, buf []float64, q float64) float64 {
	for i := range buf {
		buf[i] = from[rng.IntN(len(from))]
	}
	slices.Sort(buf)
	return sortedQuantile(buf, q)
}

// sortedQuantile is Quantile for samples already sorted (at least one).
func sortedQuantile(s []float64, q float64) float64 {
	rank := int(math.Ceil(q * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// Sooner says, for a difference of latencies (ours minus theirs, in ms), whether ours is at least
// by ms sooner beyond noise: the whole interval at or below -by.
func (d Diff) Sooner(by float64) bool { return d.Hi <= -by }

// Verdict is what the interval lets one say: "sooner", "later" (the whole interval on one side of
// 0) or "not told apart from noise".
func (d Diff) Verdict() string {
	switch {
	case math.IsNaN(d.Diff):
		return "no samples"
	case d.Hi < 0:
		return "sooner"
	case d.Lo > 0:
		return "later"
	}
	return "not told apart from noise"
}

// String renders the difference in ms with its interval and verdict, e.g.
// "-19 ms (95 % interval -41 to +3 ms, 24 / 24 samples: not told apart from noise)".
func (d Diff) String() string {
	if math.IsNaN(d.Diff) {
		return "no samples"
	}
	return fmt.Sprintf("%+.0f ms (95 %% interval %+.0f to %+.0f ms, %d / %d samples: %s)", d.Diff, d.Lo, d.Hi, d.NA, d.NB, d.Verdict())
}

// Package nodebench holds the pure parts of the kubelet suite's node benchmarks (test/kubelet-e2e:
// make bench-kubelet, bench-deletion, bench-node, bench-storm): the figures they compute from their
// samples, what they record per phase, and the reports they render. It needs no root, containerd or
// kubelet, so its tests run with the unit tests.
package nodebench

import (
	"fmt"
	"math"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
)

// Quantiles are p50, p90, p99 and max of some latencies, in ms, rounded to 0.1 ms (absent without
// samples).
type Quantiles struct {
	N   int      `json:"n"`
	P50 *float64 `json:"p50,omitempty"`
	P90 *float64 `json:"p90,omitempty"`
	P99 *float64 `json:"p99,omitempty"`
	Max *float64 `json:"max,omitempty"`
}

// QuantilesOf summarizes v (ms).
func QuantilesOf(v []float64) Quantiles {
	if len(v) == 0 {
		return Quantiles{}
	}
	round := func(x float64) *float64 { x = math.Round(x*10) / 10; return &x }
	return Quantiles{N: len(v), P50: round(benchreport.Median(v)), P90: round(benchreport.Quantile(v, 0.9)),
		P99: round(benchreport.Quantile(v, 0.99)), Max: round(Max(v))}
}

// Max returns the largest of v (NaN when v is empty).
func Max(v []float64) float64 {
	m := math.NaN()
	for _, x := range v {
		if math.IsNaN(m) || x > m {
			m = x
		}
	}
	return m
}

// Ms renders a duration in ms: "4.2 ms", "130 ms" ("-" for NaN).
func Ms(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	if v < 10 {
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.0f ms", v)
}

// Cell renders a quantile ("-": no sample).
func Cell(v *float64) string {
	if v == nil {
		return "-"
	}
	return Ms(*v)
}

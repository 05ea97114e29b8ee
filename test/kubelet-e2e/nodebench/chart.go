package nodebench

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
)

// The chart of make bench-workloads' samples (issue 59): a table of p50 / p90 hides the shape of a
// distribution (the steps the kubelet acted on at once and those that waited for a relist make two
// clusters), so every sample is drawn, per measure and setup.

// chartPalette are the setups' colours, in the setups' order (cycled when there are more setups).
var chartPalette = []string{"#1f5fbf", "#d9541e", "#2a9d3a", "#8e44ad", "#b8860b", "#17a2b8", "#c2185b"}

// chartFloorMs is where a value of 0 or less is drawn: a log axis has no place for it, and a few µs is
// below what the workloads' timestamps tell apart anyway.
const chartFloorMs = 0.01

// WorkloadSVG renders the samples of every measure of WorkloadMeasures that has some (a measure no
// setup has values of is left out) as one self-contained SVG: a panel per measure, in their order, a
// row per setup in each, in the order of setups, with every sample as a dot on a logarithmic ms axis
// of the panel's own range, ticks at the p50 (thick) and the p90 (thin), and the figures at the right.
// The setups' names are in the legend and at each row.
func WorkloadSVG(title string, setups []WorkloadSetup) string {
	const (
		width         = 900
		left, right   = 24, 24
		statsWidth    = 200 // the "p50 ..., p90 ..., n=..." text right of the plot
		titleHeight   = 34
		legendLine    = 18
		panelTitle    = 26
		rowHeight     = 38
		axisHeight    = 40
		dotBand       = 14 // the height over which a row's dots spread
		labelToDots   = 15 // from a row's top to the middle of its dots
		panelGap      = 10
		legendSwatchR = 5
	)
	type panel struct {
		name   string
		values [][]float64 // per setup
	}
	var panels []panel
	for _, m := range WorkloadMeasures {
		p := panel{name: m.Name}
		n := 0
		for _, s := range setups {
			v := Values(m.Of(s))
			p.values = append(p.values, v)
			n += len(v)
		}
		if n > 0 {
			panels = append(panels, p)
		}
	}
	colour := func(i int) string { return chartPalette[i%len(chartPalette)] }
	esc := html.EscapeString
	plotLeft, plotRight := float64(left), float64(width-right-statsWidth)

	legendHeight := legendLine * (len(setups) + 1)
	panelHeight := func(p panel) int { return panelTitle + rowHeight*len(p.values) + axisHeight }
	height := titleHeight + legendHeight + panelGap
	for _, p := range panels {
		height += panelHeight(p) + panelGap
	}

	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	w(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	w(`<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, esc(title))

	// The legend: a swatch and name per setup, then what the marks are.
	y := titleHeight
	for i, s := range setups {
		ly := float64(y + legendLine*i + legendLine/2)
		w(`<circle cx="%d" cy="%.1f" r="%d" fill="%s"/>`+"\n", left+legendSwatchR, ly, legendSwatchR, colour(i))
		w(`<text x="%d" y="%.1f">%s</text>`+"\n", left+3*legendSwatchR, ly+4, esc(s.Name))
	}
	w(`<text x="%d" y="%d" fill="#444">Each dot is a sample; the thick tick is the p50, the thin one the p90. Each panel has its own log scale, in ms.</text>`+"\n",
		left, y+legendLine*len(setups)+legendLine/2+4)
	y += legendHeight + panelGap

	for _, p := range panels {
		var all []float64
		for _, v := range p.values {
			all = append(all, v...)
		}
		lo, hi := chartRange(all)
		x := func(v float64) float64 {
			return plotLeft + (math.Log10(chartClamp(v))-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*(plotRight-plotLeft)
		}
		top := y + panelTitle
		bottom := top + rowHeight*len(p.values)
		w(`<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", left, y+17, esc(p.name))
		// The grid: a solid line at each decade, dashed ones at its 2 and 5, each labelled.
		for _, t := range chartTicks(lo, hi) {
			stroke, dash := "#ccc", ` stroke-dasharray="2,3"`
			if isDecade(t) {
				stroke, dash = "#bbb", ""
			}
			w(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"%s/>`+"\n", x(t), top, x(t), bottom, stroke, dash)
			w(`<text x="%.1f" y="%d" text-anchor="middle" fill="#444">%s</text>`+"\n", x(t), bottom+15, strconv.FormatFloat(t, 'f', -1, 64))
		}
		w(`<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="none" stroke="#444"/>`+"\n", plotLeft, top, plotRight-plotLeft, bottom-top)
		w(`<text x="%.1f" y="%d" text-anchor="middle" fill="#444">ms (log scale)</text>`+"\n", (plotLeft+plotRight)/2, bottom+31)
		for i, v := range p.values {
			rowTop := top + rowHeight*i
			mid := float64(rowTop + labelToDots + dotBand/2)
			c := colour(i)
			if i > 0 {
				w(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`+"\n", plotLeft, rowTop, plotRight, rowTop)
			}
			w(`<text x="%.1f" y="%d" font-size="11" fill="#333">%s</text>`+"\n", plotLeft+4, rowTop+12, esc(setups[i].Name))
			for j, s := range v {
				// A fixed spread over the band (not a random jitter: the same data draws the same
				// chart), so that samples of about the same value do not hide one another.
				dy := float64(j*7%9-4) / 4 * dotBand / 2
				w(`<circle class="sample" cx="%.1f" cy="%.1f" r="2.5" fill="%s" fill-opacity="0.45"/>`+"\n", x(s), mid+dy, c)
			}
			p50, p90 := benchreport.Median(v), benchreport.Quantile(v, .9)
			if len(v) > 0 {
				w(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", x(p50), mid-dotBand/2-3, x(p50), mid+dotBand/2+3, c)
				w(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1.2"/>`+"\n", x(p90), mid-dotBand/2-1, x(p90), mid+dotBand/2+1, c)
			}
			w(`<text x="%.1f" y="%.1f" fill="%s">%s</text>`+"\n", plotRight+8, mid+4, c,
				esc(fmt.Sprintf("p50 %s, p90 %s, n=%d", Ms(p50), Ms(p90), len(v))))
		}
		y += panelHeight(p) + panelGap
	}
	w("</svg>\n")
	return b.String()
}

// chartClamp moves a value the log axis cannot show (0 or less, NaN) to chartFloorMs.
func chartClamp(v float64) float64 {
	if !(v > chartFloorMs) {
		return chartFloorMs
	}
	return v
}

// chartRange returns the ends of an axis that holds every value of v: the 1, 2 or 5 times a power of
// ten at or below the least, and that at or above the greatest. Ends on the 1-2-5 steps rather than on
// decades spare a panel whose values span 20 to 1100 ms an empty decade on each side.
func chartRange(v []float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, x := range v {
		x = chartClamp(x)
		lo, hi = min(lo, x), max(hi, x)
	}
	if math.IsInf(lo, 0) {
		return 1, 10
	}
	lo, hi = stepAtOrBelow(lo), stepAtOrAbove(hi)
	if lo == hi { // every value the same: a decade around it
		lo, hi = stepAtOrBelow(lo/3), stepAtOrAbove(hi*3)
	}
	return lo, hi
}

// chartSteps are the 1-2-5 steps of a decade: the axes' ends and ticks.
var chartSteps = []float64{1, 2, 5}

func stepAtOrBelow(v float64) float64 {
	d := math.Pow(10, math.Floor(math.Log10(v)))
	out := d
	for _, m := range chartSteps {
		if s := m * d; s <= v*(1+1e-9) {
			out = s
		}
	}
	return roundStep(out)
}

func stepAtOrAbove(v float64) float64 {
	d := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range chartSteps {
		if s := m * d; s >= v*(1-1e-9) {
			return roundStep(s)
		}
	}
	return roundStep(10 * d)
}

// chartTicks are the 1-2-5 steps from lo to hi (both on a step), rounded so that they print short.
func chartTicks(lo, hi float64) []float64 {
	var out []float64
	for d := math.Floor(math.Log10(lo)); d <= math.Ceil(math.Log10(hi)); d++ {
		for _, m := range chartSteps {
			t := roundStep(m * math.Pow(10, d))
			if t >= lo*(1-1e-9) && t <= hi*(1+1e-9) {
				out = append(out, t)
			}
		}
	}
	return out
}

// roundStep drops the floating-point noise of m * 10^d (0.30000000000000004 and the like).
func roundStep(v float64) float64 {
	f, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 3, 64), 64)
	return f
}

func isDecade(v float64) bool {
	l := math.Log10(v)
	return math.Abs(l-math.Round(l)) < 1e-9
}

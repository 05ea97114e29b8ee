package benchreport

import (
	"fmt"
	"html"
	"maps"
	"math"
	"slices"
	"strings"
)

// Goals, from docs/design.md section 7 (the stricter figure where the brief and an issue differ).
const (
	GoalExitP50Ms       = 5.0   // and no slower than containerd's own stream
	GoalExitP99Ms       = 10.0  // task exit -> subscriber
	GoalHookP99Us       = 50.0  // NRI callback handling time
	GoalProxyAddedP50Us = 100.0 // per forwarded unary call
	GoalPodStartPct     = 1.0   // pod start overhead with pleg-nri connected
)

// Command is how the figures are produced.
const Command = "make bench"

// Markdown renders the results as docs/benchmarks.md; svgName is the plot's file name next to it.
func Markdown(r *Results, svgName string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Benchmarks\n\n")
	w("%s. Everything is measured side by side in one run against a real containerd (the integration harness of\n", generated(Command, r))
	w("`test/containerd-it`): the same workload seen by both sides at the same time, or calls interleaved A/B. The\n")
	w("machine is shared and noisy, so the figures are medians, percentiles and ratios of one run, not constants;\n")
	w("run `%s` again to reproduce them. Goals are those of `docs/design.md` section 7.\n", Command)
	if len(r.Load) > 0 {
		w("Load average (1, 5, 15 min) when each benchmark ended: %s.\n", loads(r.Load))
	}
	w("\n")

	w("| measure | containerd alone | pleg-nri | pleg-nri vs containerd | goal | met |\n")
	w("| --- | --- | --- | --- | --- | --- |\n")
	row := func(measure, a, p, diff, goal, met string) {
		w("| %s | %s | %s | %s | %s | %s |\n", measure, a, p, diff, goal, met)
	}
	if e := r.ExitLatency; e != nil {
		cd, cdMiss := e.Latencies(false)
		pn, pnMiss := e.Latencies(true)
		n := len(e.Exits)
		for _, q := range []struct {
			name string
			q    float64
		}{{"p50", .5}, {"p90", .9}, {"p99", .99}, {"max", 1}} {
			a, p := Quantile(cd, q.q), Quantile(pn, q.q)
			goal, met := "", ""
			switch q.name {
			case "p50":
				goal = fmt.Sprintf("< %g ms and ≤ containerd's", GoalExitP50Ms)
				met = yesNo(p < GoalExitP50Ms && p <= a)
			case "p99":
				goal = fmt.Sprintf("< %g ms", GoalExitP99Ms)
				met = yesNo(p < GoalExitP99Ms)
			}
			row(fmt.Sprintf("task exit → STOPPED received, %s (%d exits)", q.name, n), ms(a), ms(p), ratio(a, p), goal, met)
		}
		row("STOPPED events never received", fmt.Sprint(cdMiss), fmt.Sprint(pnMiss), "", "0", yesNo(pnMiss == 0))
	}
	if h := r.Hook; h != nil {
		p50, p99 := HistogramQuantile(h.Buckets, .5)*1e6, HistogramQuantile(h.Buckets, .99)*1e6
		in := FractionAtMost(h.Buckets, GoalHookP99Us/1e6) * 100
		row(fmt.Sprintf("NRI callback handling in the plugin, p50 (%.0f callbacks, /metrics)", h.Count), "—", us(p50), "", "", "")
		row("NRI callback handling in the plugin, p99", "—", us(p99)+fmt.Sprintf(" (%.2f%% ≤ 50 µs)", in), "",
			fmt.Sprintf("< %g µs", GoalHookP99Us), yesNo(in >= 99))
	}
	for _, hb := range r.HookBench {
		goal, met := fmt.Sprintf("< %g µs", GoalHookP99Us), yesNo(hb.NsPerOp/1e3 < GoalHookP99Us)
		if strings.Contains(hb.Name, "Synchronize") { // the whole state, once per connection: no µs budget
			goal, met = "", ""
		}
		if p99, ok := hb.Metrics["p99-ns"]; ok {
			// A benchmark that times each call reports its percentiles: the goal is on the p99.
			met = yesNo(p99/1e3 < GoalHookP99Us)
			row(fmt.Sprintf("`%s` (in process, p50 / p99, `go test -bench ./plugin/`)", hb.Name), "—",
				us(hb.Metrics["p50-ns"]/1e3)+" / "+us(p99/1e3), "", goal+" at p99", met)
			continue
		}
		row(fmt.Sprintf("`%s` (in process, mean, `go test -bench ./plugin/`)", hb.Name), "—", us(hb.NsPerOp/1e3), "", goal, met)
	}
	if p := r.Proxy; p != nil {
		for _, m := range p.Methods {
			d50, p50 := Median(m.DirectUs), Median(m.ProxiedUs)
			d90, p90 := Quantile(m.DirectUs, .9), Quantile(m.ProxiedUs, .9)
			name := m.name()
			row(fmt.Sprintf("%s, p50 (%d calls each)", name, len(m.DirectUs)), us(d50), us(p50),
				fmt.Sprintf("+%s", us(p50-d50)), fmt.Sprintf("< %g µs added", GoalProxyAddedP50Us),
				yesNo(p50-d50 < GoalProxyAddedP50Us))
			row(fmt.Sprintf("%s, p90", name), us(d90), us(p90), fmt.Sprintf("+%s", us(p90-d90)), "", "")
		}
	}
	if s := r.PodStart; s != nil {
		a, p := Median(s.WithoutMs), Median(s.WithMs)
		pct := (p - a) / a * 100
		row(fmt.Sprintf("pod start (run pod + create + start), median (%d pods each)", min(len(s.WithMs), len(s.WithoutMs))),
			ms(a), ms(p), fmt.Sprintf("%+.2f%%", pct), fmt.Sprintf("< %g%%", GoalPodStartPct), yesNo(pct < GoalPodStartPct))
		a90, p90 := Quantile(s.WithoutMs, .9), Quantile(s.WithMs, .9)
		row("pod start, p90", ms(a90), ms(p90), fmt.Sprintf("%+.1f%%", (p90-a90)/a90*100), "", "")
		if len(s.WithNoStateDirMs) > 0 {
			row("pod start, median: with minus without pleg-nri (95 % interval)", "", "", QuantileDiff(s.WithMs, s.WithoutMs, .5).String(), "", "")
			n := Median(s.WithNoStateDirMs)
			row(fmt.Sprintf("pod start with pleg-nri connected, no state-dir (control), median (%d pods)", len(s.WithNoStateDirMs)),
				ms(a), ms(n), fmt.Sprintf("%+.2f%%", (n-a)/a*100), "", "")
			row("pod start, median: with minus with no state-dir (the checkpoint's share, 95 % interval)", "", "",
				QuantileDiff(s.WithMs, s.WithNoStateDirMs, .5).String(), "", "")
		}
	}
	w("\n")

	if e := r.ExitLatency; e != nil {
		w("## Task exit → subscriber\n\n")
		w("![exit latency CDF](%s)\n\n", svgName)
		w("%d containers in %d pods, in %d batches: each batch creates and starts a few containers per pod that\n", len(e.Exits), e.Pods, e.Batches)
		w("block reading a FIFO, then lets them exit (`exit 0` or `exit 1`) one at a time in random order, %.0f ms\n", e.SpacingMs)
		w("apart on average, waits for every STOPPED event and removes them. Two subscribers are connected for the\n")
		w("whole run: one on containerd's own `GetContainerEvents` stream, one on pleg-nri's. For each exit the\n")
		w("latency is the receipt time of the container's first STOPPED event minus the `finished_at` of its CRI\n")
		w("`ContainerStatus` (the exit time containerd recorded from the shim). Both subscribers run in the same\n")
		w("process on the same host clock.\n\n")
		stages := []struct {
			name string
			f    func(Exit) float64
		}{
			{"containerd stamps its `/tasks/exit` envelope", func(x Exit) float64 { return x.PublishedMs }},
			{"a task-event subscriber (the benchmark's own) receives it", func(x Exit) float64 { return x.TaskEventMs }},
			{"a `task.Wait` of the benchmark's own returns", func(x Exit) float64 { return x.WaitMs }},
			{"pleg-nri emits STOPPED (its `created_at`)", func(x Exit) float64 { return x.EmittedMs }},
			{"pleg-nri's subscriber receives STOPPED", func(x Exit) float64 { return x.PlegNRIMs }},
			{"containerd's subscriber receives STOPPED", func(x Exit) float64 { return x.ContainerdMs }},
		}
		if len(e.Stage(stages[0].f)) > 0 {
			w("Where the time goes: each stage of the exit's path, in ms after the exit (`finished_at`):\n\n")
			w("| stage | n | p50 | p90 | p99 | max |\n| --- | --- | --- | --- | --- | --- |\n")
			for _, st := range stages {
				v := e.Stage(st.f)
				w("| %s | %d | %s | %s | %s | %s |\n", st.name, len(v), ms(Quantile(v, .5)), ms(Quantile(v, .9)),
					ms(Quantile(v, .99)), ms(Quantile(v, 1)))
			}
			w("\n")
		}
	}
	if h := r.Hook; h != nil {
		w("## NRI callback handling\n\n")
		w("Read from pleg-nri's `pleg_nri_hook_duration_seconds` histogram after the exit workload, summed over\n")
		w("the lifecycle callbacks (Synchronize, once per connection with the whole state, is left out); the\n")
		w("quantiles are interpolated inside the buckets (1, 2.5, 5, 10, 25, 50, 100, 250 µs, ...), like\n")
		w("Prometheus' `histogram_quantile`, so they are estimates; the share of callbacks at or under 50 µs is exact.\n")
		w("Callbacks seen: %s.\n\n", callbacks(h.ByCallback))
	}
	if len(r.Internals) > 0 {
		w("## Where pleg-nri's time goes\n\n")
		w("pleg-nri's own histograms after the exit workload (bucket-interpolated, all series summed):\n\n")
		w("| metric | count | p50 | p99 | by label |\n| --- | --- | --- | --- | --- |\n")
		names := make([]string, 0, len(r.Internals))
		for n := range r.Internals {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			h := r.Internals[n]
			w("| `%s` | %.0f | %s | %s | %s |\n", n, h.Count, ms(HistogramQuantile(h.Buckets, .5)*1e3),
				ms(HistogramQuantile(h.Buckets, .99)*1e3), callbacks(h.ByCallback))
		}
		w("\n")
	}
	if len(r.HookBench) == 0 {
		w("The plugin's in-process `BenchmarkHook` (`go test -bench BenchmarkHook ./plugin/`) is not part of this run: it was\n")
		w("absent, or ./plugin/ did not build, when `%s` ran (its output says which).\n\n", Command)
	}
	if p := r.Proxy; p != nil {
		w("## Forwarded unary calls\n\n")
		w("One client on containerd's socket and one on pleg-nri's, called alternately (direct then proxied, then\n")
		w("proxied then direct, ...) after a warm-up, so both see the same machine load. The difference is what the\n")
		w("extra hop costs: a unix-socket round trip, the frame copy and the proxy's bookkeeping.\n\n")
	}
	if s := r.PodStart; s != nil {
		w("## Pod start\n\n")
		w("Pods started one at a time (RunPodSandbox + CreateContainer + StartContainer of a sleeping busybox, timed\n")
		w("from the first call to the last answer; each pod is removed before the next, untimed) in %d rounds\n", s.Rounds)
		if len(s.WithNoStateDirMs) > 0 {
			w("of three phases, their order rotating from round to round: with pleg-nri running (its NRI plugin\n")
			w("registered, one subscriber on its stream, its checkpoint), the same with no state-dir (no checkpoint), and\n")
			w("with pleg-nri stopped. A subscriber on containerd's own stream is connected in every phase.\n\n")
		} else {
			w("of two phases, in ABBA order: with pleg-nri running (its NRI plugin registered, one subscriber on its\n")
			w("stream) and with pleg-nri stopped. A subscriber on containerd's own stream is connected in both phases.\n\n")
		}
	}
	return b.String()
}

// generated says which command made r, when and where.
func generated(command string, r *Results) string {
	s := fmt.Sprintf("Generated by `%s` on %s", command, r.Date)
	if r.Machine != "" {
		s += fmt.Sprintf(" (%s)", r.Machine)
	}
	return s
}

func loads(m map[string]string) string { return joinSorted(m, "%s %s", "; ") }

func callbacks(m map[string]float64) string { return joinSorted(m, "%s %.0f", ", ") }

// joinSorted renders each entry of m, in key order, with format (of the key and the value), and joins
// them with sep.
func joinSorted[V any](m map[string]V, format, sep string) string {
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf(format, k, m[k]))
	}
	return strings.Join(parts, sep)
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

func ms(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case v < 10:
		return fmt.Sprintf("%.2f ms", v)
	}
	return fmt.Sprintf("%.1f ms", v)
}

func us(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case math.Abs(v) < 10:
		return fmt.Sprintf("%.1f µs", v)
	}
	return fmt.Sprintf("%.0f µs", v)
}

// ratio says how many times sooner p is than a.
func ratio(a, p float64) string {
	if math.IsNaN(a) || math.IsNaN(p) || p <= 0 {
		return "—"
	}
	if p <= a {
		return fmt.Sprintf("%.1f× sooner", a/p)
	}
	return fmt.Sprintf("%.1f× later", p/a)
}

// SVG renders the exit latency CDF of both streams on a logarithmic time axis.
func SVG(e *ExitLatency) string {
	cd, _ := e.Latencies(false)
	pn, _ := e.Latencies(true)
	const (
		width, height = 760, 470
		left, right   = 64, 24
		top, bottom   = 44, 106
	)
	pw, ph := float64(width-left-right), float64(height-top-bottom)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range slices.Concat(cd, pn) {
		v = max(v, 1e-3)
		lo, hi = min(lo, v), max(hi, v)
	}
	if math.IsInf(lo, 0) {
		lo, hi = 1, 100
	}
	hi = max(hi, GoalExitP99Ms)
	dLo, dHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dHi == dLo {
		dHi++
	}
	x := func(v float64) float64 {
		return float64(left) + (math.Log10(max(v, 1e-3))-dLo)/(dHi-dLo)*pw
	}
	y := func(f float64) float64 { return float64(top) + (1-f)*ph }

	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	w(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	w(`<text x="%d" y="22" font-size="15" font-weight="bold">Task exit → STOPPED event received (CDF, %d exits, one run)</text>`+"\n", left, len(e.Exits))
	// Grid and axes.
	for d := dLo; d <= dHi; d++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, d)
			if math.Log10(v) > dHi+1e-9 {
				break
			}
			xv := x(v)
			stroke, dash := "#ccc", ` stroke-dasharray="2,3"`
			if m == 1 {
				stroke, dash = "#bbb", ""
			}
			w(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="%s"%s/>`+"\n", xv, top, xv, y(0), stroke, dash)
			w(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="#444">%s</text>`+"\n", xv, y(0)+16, html.EscapeString(fmtMs(v)))
		}
	}
	for _, f := range []float64{0, .25, .5, .75, .9, 1} {
		w(`<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y(f), float64(left)+pw, y(f))
		w(`<text x="%d" y="%.1f" text-anchor="end" fill="#444">%g%%</text>`+"\n", left-6, y(f)+4, f*100)
	}
	w(`<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="none" stroke="#444"/>`+"\n", left, top, pw, ph)
	w(`<text x="%.1f" y="%.1f" text-anchor="middle">latency from the container's finished_at (log scale)</text>`+"\n", float64(left)+pw/2, y(0)+36)
	w(`<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">exits received</text>`+"\n", float64(top)+ph/2)
	// The goals.
	for _, g := range []struct {
		ms   float64
		name string
		at   float64
	}{{GoalExitP50Ms, "p50 goal", .12}, {GoalExitP99Ms, "p99 goal", .04}} {
		gx := x(g.ms)
		w(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#2a2" stroke-width="1.5" stroke-dasharray="6,4"/>`+"\n", gx, top, gx, y(0))
		w(`<text x="%.1f" y="%.1f" fill="#2a2">%s %g ms</text>`+"\n", gx+4, y(g.at), g.name, g.ms)
	}
	// The two CDFs.
	series := []struct {
		name, color string
		ms          []float64
	}{{"pleg-nri", "#1f5fbf", pn}, {"containerd", "#d9541e", cd}}
	for i, s := range series {
		sorted := slices.Clone(s.ms)
		slices.Sort(sorted)
		if len(sorted) > 0 {
			var path strings.Builder
			n := float64(len(sorted))
			fmt.Fprintf(&path, "M%.1f,%.1f", x(sorted[0]), y(0))
			for j, v := range sorted {
				fmt.Fprintf(&path, " L%.1f,%.1f L%.1f,%.1f", x(v), y(float64(j)/n), x(v), y(float64(j+1)/n))
			}
			w(`<path d="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", path.String(), s.color)
		}
		ly := y(0) + 62 + float64(i)*18
		w(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", left+10, ly-4, left+34, ly-4, s.color)
		w(`<text x="%d" y="%.1f">%s: p50 %s, p99 %s, max %s</text>`+"\n", left+40, ly, s.name,
			html.EscapeString(ms(Quantile(s.ms, .5))), html.EscapeString(ms(Quantile(s.ms, .99))), html.EscapeString(ms(Quantile(s.ms, 1))))
	}
	w("</svg>\n")
	return b.String()
}

func fmtMs(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", v/1000)
	case v >= 1:
		return fmt.Sprintf("%gms", v)
	}
	return fmt.Sprintf("%gµs", v*1000)
}

// name is the method's name in the report, with the number of containers a ListContainers listed.
func (m ProxyMethod) name() string {
	if m.Method == "ListContainers" {
		return fmt.Sprintf("%s (%d containers)", m.Method, m.Items)
	}
	return m.Method
}

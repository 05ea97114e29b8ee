// Package benchreport holds the results of pleg-nri's side-by-side benchmarks against a real containerd
// (test/containerd-it, `make bench`) and turns them into docs/benchmarks.md and docs/exit-latency.svg.
//
// The benchmarks write raw samples into one JSON file (each benchmark merges its own section); the
// report computes every figure from the samples, so the markdown, the plot and the benchmark's own
// output agree.
package benchreport

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Results is everything one `make bench` run measured.
type Results struct {
	// Date is when the run started (RFC 3339).
	Date string `json:"date"`
	// Machine describes where it ran (CPUs, kernel, containerd version).
	Machine string `json:"machine,omitempty"`
	// Load is the machine's load average (1, 5, 15 min) when each benchmark ended, by benchmark.
	Load map[string]string `json:"load,omitempty"`

	ExitLatency *ExitLatency `json:"exit_latency,omitempty"`
	Hook        *Hook        `json:"nri_hook,omitempty"`
	// Internals are pleg-nri's own latency histograms after the exit workload, by metric name (summed
	// over every series; ByCallback counts by the metric's main label): where its exit latency goes.
	Internals map[string]*Hook `json:"internals,omitempty"`
	Proxy     *Proxy           `json:"proxy,omitempty"`
	PodStart  *PodStart        `json:"pod_start,omitempty"`
	// HookBench is the plugin's in-process hook benchmark (go test -bench BenchmarkHook ./plugin/), when it
	// exists; filled by the report from that benchmark's text output.
	HookBench []GoBench `json:"hook_bench,omitempty"`
}

// ExitLatency is task exit -> STOPPED event received by a subscriber, on containerd's own stream and on
// pleg-nri's, both subscribed at the same time to the same workload.
type ExitLatency struct {
	Pods    int `json:"pods"`
	Batches int `json:"batches"`
	// SpacingMs is the mean time between two exits of a batch.
	SpacingMs float64 `json:"spacing_ms"`
	// Exits holds one entry per container exit.
	Exits []Exit `json:"exits"`
}

// Exit is one container's exit as both streams delivered it.
type Exit struct {
	ID       string `json:"id"`
	ExitCode int32  `json:"exit_code"`
	// FinishedAt is the container's finished_at from its CRI status (ns since the epoch).
	FinishedAt int64 `json:"finished_at"`
	// ContainerdMs and PlegNRIMs are the latencies from FinishedAt to the receipt of the STOPPED event;
	// negative means that stream never delivered it (missed).
	ContainerdMs float64 `json:"containerd_ms"`
	PlegNRIMs    float64 `json:"pleg_nri_ms"`
	// The stages of the exit's path, each in ms from FinishedAt (negative: not seen). PublishedMs is the
	// timestamp containerd put on its /tasks/exit envelope; TaskEventMs is when a task-event subscriber of
	// the benchmark (a second one, beside pleg-nri's) received that envelope; EmittedMs is the created_at
	// of pleg-nri's STOPPED event (the moment its core emitted it).
	PublishedMs float64 `json:"published_ms"`
	TaskEventMs float64 `json:"task_event_ms"`
	// WaitMs is when a containerd client's task.Wait of the container returned (the exit as the shim
	// reports it, before containerd's CRI handles it).
	WaitMs    float64 `json:"wait_ms"`
	EmittedMs float64 `json:"emitted_ms"`
}

// Stage returns the delivered values of one stage of the exit path (f picks it from an Exit).
func (e *ExitLatency) Stage(f func(Exit) float64) []float64 {
	var out []float64
	for _, x := range e.Exits {
		if v := f(x); v >= 0 {
			out = append(out, v)
		}
	}
	return out
}

// Latencies returns the delivered latencies of one side (containerd if !plegNRI) and how many were missed.
func (e *ExitLatency) Latencies(plegNRI bool) (ms []float64, missed int) {
	for _, x := range e.Exits {
		v := x.ContainerdMs
		if plegNRI {
			v = x.PlegNRIMs
		}
		if v < 0 {
			missed++
			continue
		}
		ms = append(ms, v)
	}
	return ms, missed
}

// Hook is pleg-nri's pleg_nri_hook_duration_seconds histogram as scraped after the exit workload.
type Hook struct {
	// Buckets are cumulative, summed over the lifecycle callbacks (Synchronize excluded: it carries the
	// whole state once per connection).
	Buckets []Bucket `json:"buckets"`
	Count   float64  `json:"count"`
	SumSec  float64  `json:"sum_seconds"`
	// ByCallback counts the observations per callback label, Synchronize included.
	ByCallback map[string]float64 `json:"by_callback"`
}

// Bucket is one cumulative histogram bucket.
type Bucket struct {
	LE    float64 `json:"le"` // +Inf is stored as math.MaxFloat64
	Count float64 `json:"count"`
}

// Proxy is forwarded unary calls, direct to containerd vs through pleg-nri, interleaved.
type Proxy struct {
	Methods []ProxyMethod `json:"methods"`
}

// ProxyMethod holds one method's call durations in microseconds.
type ProxyMethod struct {
	Method    string    `json:"method"`
	Items     int       `json:"items,omitempty"` // containers listed, for ListContainers
	DirectUs  []float64 `json:"direct_us"`
	ProxiedUs []float64 `json:"proxied_us"`
}

// PodStart is RunPodSandbox + CreateContainer + StartContainer with pleg-nri connected and not, in
// alternating phases.
type PodStart struct {
	Rounds    int       `json:"rounds"`
	WithMs    []float64 `json:"with_ms"`
	WithoutMs []float64 `json:"without_ms"`
	// WithNoStateDirMs is the control phase: pleg-nri connected as in WithMs but with no state-dir (no
	// checkpoint); absent in results made before it.
	WithNoStateDirMs []float64 `json:"with_no_state_dir_ms,omitempty"`
}

// GoBench is one line of `go test -bench` output.
type GoBench struct {
	Name    string  `json:"name"`
	NsPerOp float64 `json:"ns_per_op"`
	// Metrics holds the other unit/value pairs (B/op, allocs/op, custom ReportMetric units).
	Metrics map[string]float64 `json:"metrics,omitempty"`
}

// Load reads a results file; a missing file gives empty results.
func Load(path string) (*Results, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &Results{}, nil
	}
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

// Update loads the results file at path, lets fn change it, and writes it back.
func Update(path string, fn func(*Results)) error {
	r, err := Load(path)
	if err != nil {
		return err
	}
	fn(r)
	data, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Quantile returns the q-quantile (0..1) of samples by nearest rank; NaN when there are none.
func Quantile(samples []float64, q float64) float64 {
	if len(samples) == 0 {
		return math.NaN()
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return sortedQuantile(s, q)
}

// Median is Quantile(samples, 0.5).
func Median(samples []float64) float64 { return Quantile(samples, 0.5) }

// HistogramQuantile estimates the q-quantile of a cumulative histogram the way Prometheus'
// histogram_quantile does: linear interpolation inside the bucket that holds the rank. A rank in the
// +Inf bucket returns the highest finite bound.
func HistogramQuantile(buckets []Bucket, q float64) float64 {
	if len(buckets) == 0 {
		return math.NaN()
	}
	b := slices.Clone(buckets)
	sortBuckets(b)
	total := b[len(b)-1].Count
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, x := range b {
		if x.Count >= rank {
			if x.LE == math.MaxFloat64 {
				return lower
			}
			if x.Count == below {
				return x.LE
			}
			return lower + (x.LE-lower)*(rank-below)/(x.Count-below)
		}
		if x.LE != math.MaxFloat64 {
			lower = x.LE
		}
		below = x.Count
	}
	return lower
}

// FractionAtMost returns the fraction of a cumulative histogram's observations in buckets with an upper
// bound <= le (exact when le is a bucket bound).
func FractionAtMost(buckets []Bucket, le float64) float64 {
	var total, at float64
	for _, b := range buckets {
		total = max(total, b.Count)
		if b.LE <= le {
			at = max(at, b.Count)
		}
	}
	if total == 0 {
		return math.NaN()
	}
	return at / total
}

// ParseHistogram reads a Prometheus text exposition and returns the histogram name's cumulative buckets,
// count and sum, summed over every series whose labels do not match skip, and the count per value of
// the label byLabel.
func ParseHistogram(r io.Reader, name, byLabel string, skip func(labels string) bool) (*Hook, error) {
	h := &Hook{ByCallback: map[string]float64{}}
	byLE := map[float64]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	found := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		metric, rest, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		series, labels, _ := strings.Cut(metric, "{")
		labels = strings.TrimSuffix(labels, "}")
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			continue
		}
		skipped := skip != nil && skip(labels)
		switch series {
		case name + "_bucket":
			found = true
			if skipped {
				continue
			}
			le := label(labels, "le")
			bound := math.MaxFloat64
			if le != "+Inf" {
				if bound, err = strconv.ParseFloat(le, 64); err != nil {
					return nil, fmt.Errorf("bad le %q in %q", le, line)
				}
			}
			byLE[bound] += v
		case name + "_count":
			by := "all" // a histogram without labels: byLabel is ""
			if byLabel != "" {
				by = label(labels, byLabel)
			}
			h.ByCallback[by] += v
			if !skipped {
				h.Count += v
			}
		case name + "_sum":
			if !skipped {
				h.SumSec += v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("no %s histogram in the metrics", name)
	}
	for le, c := range byLE {
		h.Buckets = append(h.Buckets, Bucket{LE: le, Count: c})
	}
	slices.SortFunc(h.Buckets, func(x, y Bucket) int {
		if x.LE < y.LE {
			return -1
		}
		return 1
	})
	return h, nil
}

// label returns the value of label key in a Prometheus label set `a="x",b="y"`.
func label(labels, key string) string {
	for labels != "" {
		k, rest, ok := strings.Cut(labels, "=\"")
		if !ok {
			return ""
		}
		end := strings.IndexByte(rest, '"')
		for end > 0 && rest[end-1] == '\\' {
			next := strings.IndexByte(rest[end+1:], '"')
			if next < 0 {
				return ""
			}
			end += 1 + next
		}
		if end < 0 {
			return ""
		}
		if strings.TrimPrefix(k, ",") == key {
			return rest[:end]
		}
		labels = strings.TrimPrefix(rest[end+1:], ",")
	}
	return ""
}

// ParseGoBench reads `go test -bench` output and returns its benchmark lines.
func ParseGoBench(r io.Reader) ([]GoBench, error) {
	var out []GoBench
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		b := GoBench{Name: f[0], Metrics: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			if f[i+1] == "ns/op" {
				b.NsPerOp = v
			} else {
				b.Metrics[f[i+1]] = v
			}
		}
		out = append(out, b)
	}
	return out, sc.Err()
}

// sortBuckets sorts b by upper bound, lowest first.
func sortBuckets(b []Bucket) {
	slices.SortFunc(b, func(x, y Bucket) int { return cmp.Compare(x.LE, y.LE) })
}

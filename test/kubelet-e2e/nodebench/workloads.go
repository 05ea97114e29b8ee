package nodebench

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
)

// The pure parts of make bench-workloads (test/kubelet-e2e, BenchmarkWorkloads): an init chain and a
// Job-like pod per sample, their stages from containerd's timestamps and the kubelet's status, and
// the report.

// Times are one container's timestamps in containerd (ns since the epoch; 0: not known).
type Times struct {
	Created, Started, Finished int64
	// ContainerdStopped is the created_at of containerd's own STOPPED for the container (containerd
	// done with the exit); PlegNRIStopped that of pleg-nri's, where pleg-nri runs.
	ContainerdStopped, PlegNRIStopped int64
}

// InitChain is one pod of the init-chain workload: init containers that each exit 0 at once, then the
// app container.
type InitChain struct {
	// Key says where the sample was taken ("<round>/<pod>"): the samples of two setups with the same key
	// ran in the same round, at the same place of it.
	Key string `json:"key"`
	// SandboxCreated is the created_at of the pod's sandbox.
	SandboxCreated int64   `json:"sandbox_created"`
	Inits          []Times `json:"inits"`
	App            Times   `json:"app"`
}

func ms(from, to int64) float64 { return float64(to-from) / 1e6 }

// ChainMs is the time from the sandbox's creation to the app container's start.
func (c InitChain) ChainMs() float64 { return ms(c.SandboxCreated, c.App.Started) }

// StepsMs are, for each init container, the time from its exit to the creation of the container after
// it (the next init container, or the app after the last).
func (c InitChain) StepsMs() []float64 {
	out := make([]float64, len(c.Inits))
	for i, x := range c.Inits {
		next := c.App.Created
		if i+1 < len(c.Inits) {
			next = c.Inits[i+1].Created
		}
		out[i] = ms(x.Finished, next)
	}
	return out
}

// RunMs is the time the init containers and the app spent in runc's hands: for each init container,
// from its creation to its exit, and the app's creation to its start. The rest of ChainMs is the
// kubelet's (and the event source's) share.
func (c InitChain) RunMs() float64 {
	var sum float64
	for _, x := range c.Inits {
		sum += ms(x.Created, x.Finished)
	}
	return sum + ms(c.App.Created, c.App.Started)
}

// Job is one pod of the Job-like workload (restartPolicy Never, one container that exits 0).
type Job struct {
	Key string `json:"key"`
	// Finished is the container's finished_at.
	Finished int64 `json:"finished"`
	// Succeeded is when the bench first read phase Succeeded in the kubelet's /pods (the status
	// manager's status, which a kubelet with an API server writes there), polled every JobPoll.
	Succeeded int64 `json:"succeeded"`
	// SandboxStopped is the created_at of containerd's STOPPED for the pod's sandbox: the kubelet's
	// terminating sync stopped it (0: not seen).
	SandboxStopped int64 `json:"sandbox_stopped"`
	// ContainerdStopped and PlegNRIStopped are the created_at of each source's STOPPED for the container.
	ContainerdStopped int64 `json:"containerd_stopped"`
	PlegNRIStopped    int64 `json:"plegnri_stopped,omitempty"`
}

// SucceededMs is the time from the exit to phase Succeeded in the kubelet's status.
func (j Job) SucceededMs() float64 { return ms(j.Finished, j.Succeeded) }

// SandboxStoppedMs is the time from the exit to the sandbox stopped (false when not seen).
func (j Job) SandboxStoppedMs() (float64, bool) {
	return ms(j.Finished, j.SandboxStopped), j.SandboxStopped != 0
}

// Restart is one pod of a workload whose container exits and is restarted at once (the first exit of
// a container: the kubelet's back-off starts after the first restart): a crash (exit 1) or a sidecar's
// OOM kill.
type Restart struct {
	Key string `json:"key"`
	// Finished is the first container's finished_at; Reason containerd's reason for the exit
	// ("Error", "OOMKilled").
	Finished int64  `json:"finished"`
	Reason   string `json:"reason"`
	// Created and Started are the replacement's created_at and started_at.
	Created int64 `json:"created"`
	Started int64 `json:"started"`
	// Counted is when the bench first read a restart count of 1 in the kubelet's /pods (the status
	// manager's status, which a kubelet with an API server writes there), polled every JobPoll (0: not
	// polled for).
	Counted int64 `json:"counted,omitempty"`
	// ContainerdStopped and PlegNRIStopped are the created_at of each source's STOPPED for the first
	// container.
	ContainerdStopped int64 `json:"containerd_stopped"`
	PlegNRIStopped    int64 `json:"plegnri_stopped,omitempty"`
	// Removed says the kubelet had removed the first container before the bench read it: Finished and
	// Reason are from containerd's STOPPED of it, which carries its status.
	Removed bool `json:"removed,omitempty"`
}

// StartedMs is the time from the exit to the replacement's start.
func (r Restart) StartedMs() float64 { return ms(r.Finished, r.Started) }

// CountedMs is the time from the exit to the restart count in the kubelet's status (false: not polled).
func (r Restart) CountedMs() (float64, bool) { return ms(r.Finished, r.Counted), r.Counted != 0 }

// WorkloadSetup is what one setup of BenchmarkWorkloads measured, over every round.
type WorkloadSetup struct {
	Name   string      `json:"name"`
	Chains []InitChain `json:"init_chains"`
	Jobs   []Job       `json:"jobs"`
	// Crashes are restartPolicy Always pods whose container exits 1; OOMs pods whose sidecar (a
	// restartable init container) is OOM-killed.
	Crashes []Restart `json:"crashes,omitempty"`
	OOMs    []Restart `json:"sidecar_ooms,omitempty"`
}

// A WorkloadMeasure is one figure of a sample, keyed by where it was taken (false: not measured).
type WorkloadMeasure struct {
	Name string
	// Of returns the measure's values of a setup, keyed by sample (and step: "<key>/s<i>").
	Of func(WorkloadSetup) map[string]float64
}

// WorkloadMeasures are the report's measures, in its order.
var WorkloadMeasures = []WorkloadMeasure{
	{"init chain: sandbox created → app started", func(s WorkloadSetup) map[string]float64 {
		out := map[string]float64{}
		for _, c := range s.Chains {
			out[c.Key] = c.ChainMs()
		}
		return out
	}},
	{"init chain: each step, exit → next created", func(s WorkloadSetup) map[string]float64 {
		out := map[string]float64{}
		for _, c := range s.Chains {
			for i, v := range c.StepsMs() {
				out[fmt.Sprintf("%s/s%d", c.Key, i+1)] = v
			}
		}
		return out
	}},
	{"init chain: the chain less runc's work", func(s WorkloadSetup) map[string]float64 {
		out := map[string]float64{}
		for _, c := range s.Chains {
			out[c.Key] = c.ChainMs() - c.RunMs()
		}
		return out
	}},
	{"job: exit → Succeeded in the kubelet's status", func(s WorkloadSetup) map[string]float64 {
		out := map[string]float64{}
		for _, j := range s.Jobs {
			out[j.Key] = j.SucceededMs()
		}
		return out
	}},
	{"job: exit → sandbox stopped", func(s WorkloadSetup) map[string]float64 {
		out := map[string]float64{}
		for _, j := range s.Jobs {
			if v, ok := j.SandboxStoppedMs(); ok {
				out[j.Key] = v
			}
		}
		return out
	}},
	{"crash: exit → restart count in the kubelet's status", func(s WorkloadSetup) map[string]float64 {
		return restartMeasure(s.Crashes, Restart.CountedMs)
	}},
	{"crash: exit → replacement started", func(s WorkloadSetup) map[string]float64 {
		return restartMeasure(s.Crashes, func(r Restart) (float64, bool) { return r.StartedMs(), true })
	}},
	{"sidecar OOM-killed: exit → replacement started", func(s WorkloadSetup) map[string]float64 {
		return restartMeasure(s.OOMs, func(r Restart) (float64, bool) { return r.StartedMs(), true })
	}},
}

func restartMeasure(rs []Restart, of func(Restart) (float64, bool)) map[string]float64 {
	out := map[string]float64{}
	for _, r := range rs {
		if v, ok := of(r); ok {
			out[r.Key] = v
		}
	}
	return out
}

// SlowStep is a step of an init chain beyond which the kubelet did not act on the exit at once: it
// waited for something (its next relist, with GenericPLEG every second).
const SlowStep = 300.0

// Values returns the values of a keyed measure in the keys' order.
func Values(m map[string]float64) []float64 {
	out := make([]float64, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k])
	}
	return out
}

// CountAbove counts the values above limit.
func CountAbove(v []float64, limit float64) int {
	n := 0
	for _, x := range v {
		if x > limit {
			n++
		}
	}
	return n
}

// WorkloadComparisons compares, measure by measure, the setup named subject with each other setup: the
// subject's minus the other's, paired by sample key (and step).
func WorkloadComparisons(setups []WorkloadSetup, subject string) []Comparison {
	var a *WorkloadSetup
	for i := range setups {
		if setups[i].Name == subject {
			a = &setups[i]
		}
	}
	if a == nil {
		return nil
	}
	var out []Comparison
	for _, s := range setups {
		if s.Name == subject {
			continue
		}
		c := Comparison{A: subject, B: s.Name, Isolates: "the event source and its settings; the kubelet and the workload the same"}
		for _, m := range WorkloadMeasures {
			c.Measures = append(c.Measures, Compare(m.Name, m.Of(*a), m.Of(s)))
		}
		out = append(out, c)
	}
	return out
}

// WorkloadTable renders p50 / p90 / max of every measure per setup, and the slow steps.
func WorkloadTable(setups []WorkloadSetup) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("| measure | setup | n | p50 | p90 | max |")
	p("| --- | --- | ---: | ---: | ---: | ---: |")
	for _, m := range WorkloadMeasures {
		for _, s := range setups {
			v := Values(m.Of(s))
			p("| %s | %s | %d | %s | %s | %s |", m.Name, s.Name, len(v), Ms(benchreport.Median(v)),
				Ms(benchreport.Quantile(v, 0.9)), Ms(Max(v)))
		}
	}
	p("")
	p("Init-chain steps longer than %.0f ms (the exit not acted on at once), per setup:", SlowStep)
	p("")
	for _, s := range setups {
		steps := WorkloadMeasures[1].Of(s)
		var slow []string
		for _, k := range slices.Sorted(maps.Keys(steps)) {
			if steps[k] > SlowStep {
				slow = append(slow, fmt.Sprintf("%s %.0f ms", k, steps[k]))
			}
		}
		pods := map[string]bool{}
		for _, k := range slices.Sorted(maps.Keys(steps)) {
			if steps[k] > SlowStep {
				pods[k[:strings.LastIndexByte(k, '/')]] = true
			}
		}
		p("- %s: %d of %d steps, in %d of %d pods%s", s.Name, len(slow), len(steps), len(pods), len(s.Chains), listOrNothing(slow))
	}
	return b.String()
}

func listOrNothing(v []string) string {
	if len(v) == 0 {
		return "."
	}
	return ": " + strings.Join(v, ", ") + "."
}

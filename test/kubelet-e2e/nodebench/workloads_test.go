package nodebench

import (
	"slices"
	"strings"
	"testing"
)

// chain is an init chain whose sandbox was created at 0, each init container running 2 ms after it was
// created 10 ms after the step before, and whose step waits are given (ms).
func chain(key string, waits ...int64) InitChain {
	const ms = int64(1e6)
	c := InitChain{Key: key, SandboxCreated: 0}
	at := 100 * ms // the first init container is created 100 ms after the sandbox
	for range waits {
		c.Inits = append(c.Inits, Times{Created: at, Started: at + ms, Finished: at + 2*ms})
		at += 2 * ms
		at += waits[len(c.Inits)-1] * ms
	}
	c.App = Times{Created: at, Started: at + 5*ms}
	return c
}

func TestInitChain(t *testing.T) {
	c := chain("1/00", 30, 900, 40)
	if got := c.StepsMs(); !slices.Equal(got, []float64{30, 900, 40}) {
		t.Errorf("StepsMs = %v, want [30 900 40] (each exit to the next container's creation, the app's after the last)", got)
	}
	// 100 ms to the first init, 3 x 2 ms of running, 970 ms of steps, 5 ms of the app's start.
	if got := c.ChainMs(); got != 100+6+970+5 {
		t.Errorf("ChainMs = %v, want 1081", got)
	}
	if got := c.RunMs(); got != 6+5 {
		t.Errorf("RunMs = %v, want 11 (the init containers' runs and the app's start)", got)
	}
}

func TestJob(t *testing.T) {
	j := Job{Finished: 1e9, Succeeded: 1e9 + 25e6}
	if j.SucceededMs() != 25 {
		t.Errorf("SucceededMs = %v, want 25", j.SucceededMs())
	}
	if _, ok := j.SandboxStoppedMs(); ok {
		t.Error("SandboxStoppedMs says a stop was seen; none was")
	}
	j.SandboxStopped = 1e9 + 40e6
	if v, ok := j.SandboxStoppedMs(); !ok || v != 40 {
		t.Errorf("SandboxStoppedMs = %v %t, want 40 true", v, ok)
	}
}

func TestWorkloadComparisonsAndTable(t *testing.T) {
	fast := WorkloadSetup{Name: "fast", Chains: []InitChain{chain("1/00", 30, 30, 30), chain("1/01", 30, 30, 30)},
		Jobs: []Job{{Key: "1/00", Finished: 0, Succeeded: 20e6}}}
	slow := WorkloadSetup{Name: "slow", Chains: []InitChain{chain("1/00", 30, 900, 30), chain("1/01", 40, 40, 40)},
		Jobs: []Job{{Key: "1/00", Finished: 0, Succeeded: 500e6}}}
	cs := WorkloadComparisons([]WorkloadSetup{slow, fast}, "fast")
	if len(cs) != 1 || cs[0].A != "fast" || cs[0].B != "slow" {
		t.Fatalf("comparisons = %+v, want one: fast minus slow", cs)
	}
	steps := cs[0].Measure(WorkloadMeasures[1].Name)
	// Pairs by step: 0, -870, 0 (pod 00), -10 x 3 (pod 01): median of 6 paired differences.
	if steps == nil || steps.Paired.NA != 6 {
		t.Fatalf("step comparison = %+v, want 6 pairs", steps)
	}
	if job := cs[0].Measure(WorkloadMeasures[3].Name); job == nil || job.Paired.Diff != -480 {
		t.Errorf("job comparison = %+v, want -480 ms", job)
	}
	if WorkloadComparisons([]WorkloadSetup{slow}, "fast") != nil {
		t.Error("a comparison with a setup that did not run")
	}
	table := WorkloadTable([]WorkloadSetup{fast, slow})
	for _, want := range []string{"- fast: 0 of 6 steps, in 0 of 2 pods.", "- slow: 1 of 6 steps, in 1 of 2 pods: 1/00/s2 900 ms."} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
}

func TestRestartMeasures(t *testing.T) {
	counted := Restart{Key: "1/00", Finished: 1e9, Started: 1e9 + 80e6, Counted: 1e9 + 95e6}
	oom := Restart{Key: "1/00", Finished: 2e9, Started: 2e9 + 60e6, Reason: "OOMKilled"}
	s := WorkloadSetup{Name: "s", Crashes: []Restart{counted, {Key: "1/01", Finished: 1e9, Started: 1e9 + 90e6}}, OOMs: []Restart{oom}}
	byName := map[string]map[string]float64{}
	for _, m := range WorkloadMeasures {
		byName[m.Name] = m.Of(s)
	}
	// The second crash was not polled for its count: it has no value there, but its start counts.
	if got := byName["crash: exit → restart count in the kubelet's status"]; len(got) != 1 || got["1/00"] != 95 {
		t.Errorf("restart count measure = %v, want 1/00: 95", got)
	}
	if got := byName["crash: exit → replacement started"]; len(got) != 2 || got["1/00"] != 80 || got["1/01"] != 90 {
		t.Errorf("crash start measure = %v, want 1/00: 80, 1/01: 90", got)
	}
	if got := byName["sidecar OOM-killed: exit → replacement started"]; len(got) != 1 || got["1/00"] != 60 {
		t.Errorf("sidecar OOM measure = %v, want 1/00: 60", got)
	}
	// A setup of an older report, without these workloads, has no values (not zeros).
	for _, m := range WorkloadMeasures[len(WorkloadMeasures)-3:] {
		if got := m.Of(WorkloadSetup{Name: "old"}); len(got) != 0 {
			t.Errorf("%s of a setup without restarts = %v, want none", m.Name, got)
		}
	}
}

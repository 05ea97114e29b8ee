package main

import (
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/test/kind/internal/crashbench"
)

func TestRotation(t *testing.T) {
	nodes := []string{"cp", "w1", "w2"}
	perNode := map[string]map[string]int{}
	for r := range sideBySide {
		got := rotation(nodes, sideBySide, r)
		seen := map[string]bool{}
		for _, n := range nodes {
			s := got[n]
			if seen[s.name] {
				t.Errorf("round %d: %s runs on two nodes: %v", r, s.name, got)
			}
			seen[s.name] = true
			if perNode[n] == nil {
				perNode[n] = map[string]int{}
			}
			perNode[n][s.name]++
		}
	}
	for _, n := range nodes {
		for _, s := range sideBySide {
			if perNode[n][s.name] != 1 {
				t.Errorf("%s ran %d rounds on %s, want 1", s.name, perNode[n][s.name], n)
			}
		}
	}
}

func TestCompareSetups(t *testing.T) {
	at := func(ms ...int) []crashbench.Sample {
		var out []crashbench.Sample
		t0 := time.Unix(1000, 0)
		for _, m := range ms {
			out = append(out, crashbench.Sample{Exited: t0, Created: t0.Add(time.Duration(m) * time.Millisecond),
				Started: t0.Add(time.Duration(m+200) * time.Millisecond)})
		}
		return out
	}
	lines := compareSetups([]phase{
		{name: onGeneric.name, samples: at(600, 700, 800)},
		{name: onContainerd.name, samples: at(100, 150, 200)},
		{name: onPlegNRI.name, samples: at(40, 50, 60)},
	})
	if len(lines) != 3 {
		t.Fatalf("got %d lines: %q", len(lines), lines)
	}
	for _, want := range []string{"pleg-nri 50 ms, containerd's stream 150 ms (0.33x; goal <= 0.5x: met)", "(14.0x sooner; goal >= 10x: met)"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("created line %q lacks %q", lines[0], want)
		}
	}
	if want := "pleg-nri 250 ms, containerd's stream 350 ms (-100 ms; goal >= 50 ms sooner: met)"; !strings.Contains(lines[1], want) {
		t.Errorf("started line %q lacks %q", lines[1], want)
	}
	// 3 samples a setup, far apart: every interval is on one side of 0.
	for _, want := range []string{"created, against containerd's stream -100 ms (95 % interval", "against GenericPLEG -650 ms", "started, against containerd's stream -100 ms"} {
		if !strings.Contains(lines[2], want) {
			t.Errorf("difference line %q lacks %q", lines[2], want)
		}
	}
	if strings.Contains(lines[2], "noise") || strings.Count(lines[2], ": sooner)") != 3 {
		t.Errorf("difference line %q: want 3 differences told apart from noise", lines[2])
	}
	if got := compareSetups([]phase{{name: onPlegNRI.name}}); got != nil {
		t.Errorf("without every setup: %q, want nothing", got)
	}
}

func TestExitOrStartError(t *testing.T) {
	ok := exitOrStartError("n", "3")
	for s, want := range map[string]bool{"3 Error": true, "128 StartError": true, "128 Error": false, "0 Completed": false, "": false} {
		if got := ok(s); got != want {
			t.Errorf("exitOrStartError(%q) = %v, want %v", s, got, want)
		}
	}
}

// TestCompareRoll: each node's rollout p50 against pleg-nri's idle p50 on the cluster; only the
// samples whose exit fell in the rollout count.
func TestCompareRoll(t *testing.T) {
	t0 := time.Unix(1000, 0)
	sample := func(node string, at, createdMs int) crashbench.Sample {
		e := t0.Add(time.Duration(at) * time.Second)
		d := time.Duration(createdMs) * time.Millisecond
		return crashbench.Sample{Node: node, Exited: e, Created: e.Add(d), Started: e.Add(2 * d)}
	}
	var idle []crashbench.Sample
	for i := 0; i < 10; i++ {
		idle = append(idle, sample("a", i, 75), sample("b", i, 75+i%2))
	}
	phases := []phase{{name: onGeneric.name, samples: []crashbench.Sample{sample("a", 0, 900)}}, {name: onPlegNRI.name, samples: idle}}
	roll := phase{name: "rolling upgrade", from: t0.Add(100 * time.Second), to: t0.Add(200 * time.Second)}
	for i := 0; i < 5; i++ {
		roll.samples = append(roll.samples, sample("a", 110+i, 120), sample("b", 110+i, 180), sample("b", 300+i, 5000))
	}
	got := compareRoll(phases, roll, []string{"a", "b"})
	for _, want := range []string{"rolled through 2 nodes in 1m40s", "10 of 15 samples", "against pleg-nri idle (75 ms)", "a 120 ms (1.60x; the node idle 75 ms)",
		"b 180 ms (2.40x; the node idle 75 ms)", "goal within 2x: not met"} {
		if !strings.Contains(got, want) {
			t.Errorf("compareRoll = %q, want it to hold %q", got, want)
		}
	}
	roll.samples = roll.samples[:0]
	for i := 0; i < 5; i++ {
		roll.samples = append(roll.samples, sample("a", 110+i, 120), sample("b", 110+i, 140))
	}
	if got := compareRoll(phases, roll, []string{"a", "b"}); !strings.HasSuffix(got, "goal within 2x: met") {
		t.Errorf("compareRoll = %q, want the goal met", got)
	}
}

// TestFaultLine: an alert's figure against its for: plus one scrape interval, then plus one
// evaluation interval more.
func TestFaultLine(t *testing.T) {
	f := &fault{what: "x stopped", node: "w1", alert: "A", clears: true, pendingAfter: 4 * time.Second, firedAfter: 124 * time.Second, clearedAfter: 6 * time.Second}
	for _, c := range []struct {
		fired time.Duration
		want  string
	}{
		{124 * time.Second, "within for: + one scrape interval, 2m5s"},
		{129 * time.Second, "over for: + one scrape interval, 2m5s, within for: + one scrape and one evaluation interval, 2m10s"},
		{131 * time.Second, "later than for: + one scrape and one evaluation interval, 2m10s"},
	} {
		f.firedAfter = c.fired
		got := f.line(2*time.Minute, 5*time.Second)
		if !strings.Contains(got, c.want) || !strings.Contains(got, "pending 4s after the fault") || !strings.Contains(got, "cleared 6s after the repair") {
			t.Errorf("line = %q, want %q", got, c.want)
		}
	}
}

func TestShortUnixTime(t *testing.T) {
	got, err := shortUnixTime("1764263912.345678 pleg-nri-cluster-control-plane pleg-nri[812]: time=... level=WARN msg=\"" + evictLog + " with RESOURCE_EXHAUSTED\"")
	if err != nil || !got.Equal(time.Unix(1764263912, 345678000)) {
		t.Errorf("shortUnixTime = %v, %v", got.UnixNano(), err)
	}
	if got, err := shortUnixTime("1764263912 host x: y"); err != nil || !got.Equal(time.Unix(1764263912, 0)) {
		t.Errorf("shortUnixTime without a fraction = %v, %v", got, err)
	}
	for _, bad := range []string{"", "-- No entries --"} {
		if _, err := shortUnixTime(bad); err == nil {
			t.Errorf("shortUnixTime(%q) took it", bad)
		}
	}
}

func TestCountStartErrors(t *testing.T) {
	events := "2\tError: failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error setting cgroup config for procHooks process: unable to freeze\n" +
		"\tError: failed to create containerd task: OCI runtime start failed: exec failed\n" +
		"5\tLiveness probe failed: connection refused\n" +
		"1\tError: ErrImageNeverPull\n"
	if got := countStartErrors(events); got != 3 {
		t.Fatalf("countStartErrors = %d, want 3 (2 counted create failures, 1 start failure without a count)", got)
	}
	if got := countStartErrors(""); got != 0 {
		t.Fatalf("no events: %d", got)
	}
}

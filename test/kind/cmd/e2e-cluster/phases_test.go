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
	if len(lines) != 2 {
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

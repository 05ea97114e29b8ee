package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
)

// A fake results pair: HEAD's exits take 2-3 ms on pleg-nri's stream, BASE's 4-5 ms, and BASE's results
// hold a section HEAD's report does not know (a benchmark retired since).
const (
	headResults = `{"date": "2026-12-07T19:00:00Z", "machine": "2 CPUs, Linux 6.1.0, containerd v2.4.2, go1.26.8",
 "exit_latency": {"pods": 1, "batches": 1, "exits": [%s]},
 "pod_start": {"rounds": 1, "with_ms": [100, 101, 102], "without_ms": [99, 100, 101]}}`
	baseResults = `{"date": "2026-12-07T19:06:00Z", "machine": "2 CPUs, Linux 6.1.0, containerd v2.4.2, go1.26.8",
 "exit_latency": {"pods": 1, "batches": 1, "exits": [%s]},
 "state_reads": {"methods": [{"method": "ListContainers", "direct_us": [1], "proxied_us": [2]}]}}`
)

func exits(from float64) string {
	var parts []string
	for i := range 20 {
		parts = append(parts, fmt.Sprintf(`{"containerd_ms": 9, "pleg_nri_ms": %g, "published_ms": -1, "task_event_ms": -1, "wait_ms": -1, "emitted_ms": -1}`,
			from+float64(i)/20))
	}
	return strings.Join(parts, ",")
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	head := write("head.json", fmt.Sprintf(headResults, exits(2)))
	base := write("base.json", fmt.Sprintf(baseResults, exits(4)))
	runs := write("runs.tsv", "round\tside\tfirst\tstart\tend\tload_before\tload_after\texit\tresults\n"+
		"1\tHEAD\t1\t2026-12-07T19:00:00Z\t2026-12-07T19:05:10Z\t0.50 0.40 0.30\t1.90 1.00 0.60\t0\t"+head+"\n"+
		"1\tBASE\t0\t2026-12-07T19:05:11Z\t2026-12-07T19:10:00Z\t1.90 1.00 0.60\t2.00 1.30 0.70\t0\t"+base+"\n"+
		"2\tBASE\t1\t2026-12-07T19:10:01Z\t2026-12-07T19:15:00Z\t2.00 1.30 0.70\t2.00 1.30 0.70\t0\t"+base+"\n"+
		"2\tHEAD\t0\t2026-12-07T19:15:01Z\t2026-12-07T19:20:00Z\t2.00 1.30 0.70\t2.00 1.30 0.70\t0\t"+head+"\n")
	md := filepath.Join(dir, "bench-compare-a1ca225.md")
	c := &benchreport.Comparison{Command: "make bench-compare BASE=a1ca225 ROUNDS=2", Head: "ef29970", Base: "a1ca225", Machine: "2 CPUs"}
	if err := run(runs, md, c); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	got := string(data)
	for _, want := range []string{
		"| 1 | first | HEAD | 2026-12-07 19:00:00 | 5m10s | 0.50 0.40 0.30 | 1.90 1.00 0.60 | 0 |",
		"| 2 | first | BASE | 2026-12-07 19:10:01 | 4m59s |",
		// Pooled: 40 samples a side, HEAD's p50 2.45 ms, BASE's 4.45 ms.
		"| task exit → STOPPED received on pleg-nri's stream, p50 | 2.45 ms | 4.45 ms | 0.55× | −2.00 ms (",
		"| 40 / 40 | HEAD lower |",
		"| measure | 1 HEAD¹ | 1 BASE | 2 HEAD | 2 BASE¹ |",
		"pod start with pleg-nri, median (missing on BASE)",
		"Sections of BASE's results this report does not know (a benchmark the other side lacks; not compared): `state_reads`.",
		"No figure of pleg-nri's is higher on HEAD than on BASE beyond the interval.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the report lacks %q:\n%s", want, got)
		}
	}
}

func TestParseRunsErrors(t *testing.T) {
	for _, c := range []struct{ name, tsv, want string }{
		{"no runs", "round\tside\tfirst\tstart\tend\tload_before\tload_after\texit\tresults\n", "no runs"},
		{"short line", "round\tside\tfirst\tstart\tend\tload_before\tload_after\texit\tresults\n1\tHEAD\n", "line 2: 2 fields, want 9"},
		{"bad side", "round\tside\tfirst\tstart\tend\tload_before\tload_after\texit\tresults\n1\tOTHER\t1\t2026-12-07T19:00:00Z\t2026-12-07T19:00:00Z\t\t\t0\t/x\n", `side "OTHER"`},
		{"bad time", "round\tside\tfirst\tstart\tend\tload_before\tload_after\texit\tresults\n1\tHEAD\t1\tyesterday\t2026-12-07T19:00:00Z\t\t\t0\t/x\n", "start:"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseRuns(strings.NewReader(c.tsv))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one with %q", err, c.want)
			}
		})
	}
	// A run that wrote no results (it failed before any benchmark completed) has empty results.
	runs, err := parseRuns(strings.NewReader("round\tside\tfirst\tstart\tend\tload_before\tload_after\texit\tresults\n" +
		"1\tHEAD\t1\t2026-12-07T19:00:00Z\t2026-12-07T19:00:09Z\t\t\t1\t" + filepath.Join(t.TempDir(), "none.json") + "\n"))
	if err != nil || len(runs) != 1 || runs[0].Results == nil || runs[0].ExitCode != 1 {
		t.Errorf("runs %+v, error %v", runs, err)
	}
}

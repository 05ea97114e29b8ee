package e2enode

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pleg-nri/pleg-nri/test/cadvisorlag"
)

// tempDocs points the results and reports at a directory of the test's own.
func tempDocs(t *testing.T) {
	t.Helper()
	saved := docsDir
	docsDir = t.TempDir()
	t.Cleanup(func() { docsDir = saved })
}

// report writes the version's report from its results and returns it.
func report(t *testing.T, version string) string {
	t.Helper()
	if err := writeReport(version); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(docsPath(version, ".md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(md)
}

// wantInReport fails t for each of wants the report md lacks.
func wantInReport(t *testing.T, md string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

// TestCounts: failed, panicked and the like count as failed; skipped and pending as skipped.
func TestCounts(t *testing.T) {
	got := []testResult{{Status: "failed"}, {Status: "passed"}, {Status: "failed"}, {Status: "skipped"}, {Status: "pending"}, {Status: "timedout"}}
	r := suiteRun{Tests: got}
	if c := r.counts(); c != (counts{Passed: 1, Failed: 3, Skipped: 2}) {
		t.Errorf("counts = %+v", c)
	}
}

// TestReport: runs are kept per setup and selection (a new run replaces only its own), the report names
// every spec whose outcome differs with its failure, the specs failed everywhere, and the termination
// durations; genericRegressions names for a spec that passed with GenericPLEG only.
func TestReport(t *testing.T) {
	tempDocs(t)
	sel := selection{Name: "quick", Focus: "x", Skip: "y"}
	run := func(setup string, tests ...testResult) suiteRun {
		return suiteRun{Setup: setup, Selection: sel, Procs: 4, WallSeconds: 60, Tests: tests}
	}
	pass := func(name string, s float64) testResult { return testResult{Name: name, Status: "passed", Seconds: s} }
	fail := func(name, why string) testResult { return testResult{Name: name, Status: "failed", Failure: why} }
	old := run("pleg-nri", fail("a", "old"))
	runs := []suiteRun{
		run("generic", pass("a", 1), pass("should delete pod gracefully", 12), fail("c", "no image")),
		run("containerd", fail("a", "timed out"), pass("should delete pod gracefully", 17), fail("c", "no image")),
		run("pleg-nri", pass("a", 1), pass("should delete pod gracefully", 11), fail("c", "no image")),
	}
	for _, r := range append([]suiteRun{old}, runs...) {
		if err := saveRun("v1.2.3", r); err != nil {
			t.Fatal(err)
		}
	}
	if err := saveRun("v1.2.3", run("generic", pass("z", 1))); err != nil {
		t.Fatal(err)
	}
	got, err := loadResults("v1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Runs) != 3 || got.Runs[0].Setup != "generic" || got.Runs[0].Tests[0].Name != "z" || got.Runs[2].Tests[0].Status != "passed" {
		t.Fatalf("kept runs: %+v", got.Runs)
	}
	got.Runs[0] = runs[0]
	for _, r := range got.Runs {
		if err := saveRun("v1.2.3", r); err != nil {
			t.Fatal(err)
		}
	}
	md := report(t, "v1.2.3")
	wantInReport(t, md,
		"| generic | 2 | 1 | 0 |",
		"- `a`\n  - generic: passed (1.0 s)\n  - containerd: failed (0.0 s): timed out\n  - pleg-nri: passed (1.0 s)\n",
		"- `c`: no image",
		"| should delete pod gracefully | 12.0 | 17.0 | 11.0 |",
	)
	if got := genericRegressions(runs); len(got) != 1 || !strings.HasPrefix(got[0], `containerd: "a" passed with GenericPLEG, failed here: timed out`) {
		t.Errorf("genericRegressions = %q, want the one spec that failed with containerd's stream only", got)
	}
}

// TestTerminationDiffs: the paired p50 difference of the termination specs with its interval, for
// each evented setup against the setups before it, and none with fewer than minPairedSpecs specs.
func TestTerminationDiffs(t *testing.T) {
	var generic, plegNRI []float64
	for i := range minPairedSpecs {
		generic = append(generic, float64(2+10*i))
		plegNRI = append(plegNRI, float64(2+10*i)+0.5)
	}
	runs := []suiteRun{{Setup: "generic"}, {Setup: "pleg-nri"}}
	var b strings.Builder
	writeTerminationDiffs(&b, runs, [][]float64{generic, plegNRI})
	want := fmt.Sprintf("- pleg-nri minus generic, p50 of the per-spec differences: +0.50 s (95 %% interval +0.50 to +0.50 s over %d specs: later)\n", minPairedSpecs)
	if b.String() != "\n"+want {
		t.Fatalf("got %q, want %q", b.String(), want)
	}
	b.Reset()
	writeTerminationDiffs(&b, runs, [][]float64{generic[1:], plegNRI[1:]})
	if b.String() != "" {
		t.Fatalf("with %d specs: %q, want nothing", minPairedSpecs-1, b.String())
	}
}

// TestNoTerminations: a selection none of whose passed specs terminate pods says so instead of an
// empty table.
func TestNoTerminations(t *testing.T) {
	runs := []suiteRun{
		{Setup: "generic", Tests: []testResult{{Name: "resize", Status: "passed", Seconds: 3}}},
		{Setup: "pleg-nri", Tests: []testResult{{Name: "resize", Status: "passed", Seconds: 3}}},
	}
	var b strings.Builder
	writeTerminations(&b, runs)
	if got := b.String(); strings.Contains(got, "| spec |") || !strings.Contains(got, "\nNone: ") {
		t.Fatalf("got %q, want no table and a None line", got)
	}
}

// TestSkipped: a spec skipped at run time is listed with the suite's reason, and with the setups that
// skipped it when another ran it; a selection without one says None.
func TestSkipped(t *testing.T) {
	skip := func(name, why string) testResult { return testResult{Name: name, Status: "skipped", Failure: why} }
	runs := []suiteRun{
		{Setup: "generic", Tests: []testResult{skip("criu", "skipped - no CRIU"), skip("sctp", "skipped - no SCTP"), {Name: "a", Status: "passed"}}},
		{Setup: "pleg-nri", Tests: []testResult{skip("criu", "skipped - no CRIU"), {Name: "sctp", Status: "passed"}, {Name: "a", Status: "failed"}}},
	}
	var b strings.Builder
	writeSkipped(&b, runs)
	want := "\n### Specs that did not run (skipped by the suite itself, with its reason)\n\n" +
		"- `criu`: skipped - no CRIU\n" +
		"- `sctp`: skipped - no SCTP (skipped in generic only)\n"
	if got := b.String(); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	b.Reset()
	writeSkipped(&b, runs[1:])
	if got := b.String(); !strings.HasSuffix(got, "- `criu`: skipped - no CRIU\n") {
		t.Fatalf("one run: %q", got)
	}
	b.Reset()
	writeSkipped(&b, []suiteRun{{Setup: "generic", Tests: []testResult{{Name: "a", Status: "passed"}}}})
	if got := b.String(); !strings.HasSuffix(got, "\nNone.\n") {
		t.Fatalf("no skipped spec: %q", got)
	}
}

// TestReimport: a run read again from its JUnit report gets its specs (and their failures) anew and keeps
// what only the saving knew (commit, procs, start, wall time) when it is the run saved before (the same
// specs, outcomes and durations; the report's own timestamp is not the saving's); another run of the same
// setup and selection is saved as read.
func TestReimport(t *testing.T) {
	tempDocs(t)
	results := t.TempDir()
	write := func(setup, started string) {
		dir := filepath.Join(results, "v1.2.3", "quick", setup)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		report := `<testsuites time="3.5"><testsuite name="E2eNode Suite" timestamp="` + started + `">
<testcase name="[It] a [sig-node]" status="failed" time="3"><failure message="Timed out after 1s.&#xA;Expected&#xA;  &lt;int&gt;: 0"></failure></testcase>
</testsuite></testsuites>`
		if err := os.WriteFile(filepath.Join(dir, "junit.xml"), []byte(report), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sel := selection{Name: "quick", Focus: "x"}
	for _, r := range []suiteRun{
		{Setup: "generic", Selection: sel, Procs: 4, Started: "2026-01-01T00:00:00Z", WallSeconds: 61, Commit: "abc",
			Tests: []testResult{{Name: "a [sig-node]", Status: "failed", Seconds: 3, Failure: "Timed out after 1s."}}},
		{Setup: "pleg-nri", Selection: sel, Procs: 4, Started: "T0", WallSeconds: 62, Commit: "old",
			Tests: []testResult{{Name: "a [sig-node]", Status: "failed", Seconds: 4, Failure: "Timed out after 1s."}}},
	} {
		if err := saveRun("v1.2.3", r); err != nil {
			t.Fatal(err)
		}
	}
	write("generic", "T1")
	write("pleg-nri", "T2")
	if err := reimport("v1.2.3", "quick", results); err != nil {
		t.Fatal(err)
	}
	got, err := loadResults("v1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Runs) != 2 {
		t.Fatalf("runs: %+v", got.Runs)
	}
	g, p := got.Runs[0], got.Runs[1]
	if g.Commit != "abc" || g.Procs != 4 || g.WallSeconds != 61 || g.Started != "2026-01-01T00:00:00Z" || g.Tests[0].Failure != "Timed out after 1s. … Expected <int>: 0" {
		t.Errorf("the same run read again: %+v", g)
	}
	if p.Commit != "unknown" || p.Started != "T2" || p.WallSeconds != 3.5 {
		t.Errorf("another run: %+v", p)
	}
}

// TestCAdvisorLag: a sharded section's runs that recorded the kubelet's cAdvisor lag are added up per
// setup (a run without it is left out and not counted), and a section without any writes nothing.
func TestCAdvisorLag(t *testing.T) {
	shard := func(setup string, i int, l *cadvisorlag.Lags) suiteRun {
		return suiteRun{Setup: setup, Selection: selection{Name: "s", Shard: &shard{Of: "job", Index: i, Count: 2, Split: splitOrdered}}, CAdvisor: l}
	}
	runs := []suiteRun{
		shard("generic", 1, &cadvisorlag.Lags{PodsMs: []int64{21000}, CreatedMs: []int64{100, 9000}, StoppedMs: []int64{-30}, UnableToRead: 5}),
		shard("generic", 2, &cadvisorlag.Lags{CreatedMs: []int64{200}, StoppedMs: []int64{4000}}),
		shard("pleg-nri", 1, nil),
		shard("pleg-nri", 2, &cadvisorlag.Lags{CreatedMs: []int64{150}}),
	}
	secs := reportSections(runs)
	if len(secs) != 1 {
		t.Fatalf("sections: %+v", secs)
	}
	var b strings.Builder
	writeCAdvisorLag(&b, secs[0])
	for _, want := range []string{
		"| generic | 2 | 1, 21.00 / 21.00 / 21.00 s | 3, 0.20 / 9.00 / 9.00 s | 2, -0.03 / 4.00 / 4.00 s | 1 | 5 |\n",
		"| pleg-nri | 1 | none | 1, 0.15 / 0.15 / 0.15 s | none | 0 | 0 |\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("got %q, want it to contain %q", b.String(), want)
		}
	}
	for i := range runs {
		runs[i].CAdvisor = nil
	}
	b.Reset()
	writeCAdvisorLag(&b, reportSections(runs)[0])
	if b.String() != "" {
		t.Fatalf("no run recorded it: %q", b.String())
	}
}

// TestRepeats: a selection run again keeps each run beside the first (saveRun replaces only the same
// number), the first runs alone make the section's tables, and the repeats name every spec whose outcome
// was not the same in every run of a setup, with each run's outcome; none flaked says so.
func TestRepeats(t *testing.T) {
	tempDocs(t)
	pass := func(name string) testResult { return testResult{Name: name, Status: "passed", Seconds: 1} }
	fail := func(name, why string) testResult { return testResult{Name: name, Status: "failed", Failure: why} }
	run := func(setup string, n int, commit string, tests ...testResult) suiteRun {
		return suiteRun{Setup: setup, Selection: selection{Name: "quick", Run: n}, Procs: 4, WallSeconds: 600, Commit: commit, Tests: tests}
	}
	for _, r := range []suiteRun{
		run("generic", 0, "c1", pass("a"), pass("b"), fail("n", "node")),
		run("pleg-nri", 0, "c1", pass("a"), pass("b"), fail("n", "node")),
		run("pleg-nri", 2, "c0", fail("a", "old")), // replaced by the next run 2
		run("pleg-nri", 2, "c2", pass("a"), fail("b", "timed out"), fail("n", "node")),
		run("pleg-nri", 3, "c3", pass("a"), pass("b"), fail("n", "node")),
	} {
		if err := saveRun("v1.2.3", r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := loadResults("v1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Runs) != 4 {
		t.Fatalf("kept %d runs, want 4: %+v", len(got.Runs), got.Runs)
	}
	md := report(t, "v1.2.3")
	wantInReport(t, md,
		"| pleg-nri | 2 | 1 | 0 | 10m0s | 4 |  | c1 |\n", // the first run's row; the repeats have none
		"### Specs whose outcome differs between setups\n\nNone.\n",
		"| generic | 1 | 1 (c1): 2 / 1 / 0, 10m0s | - (one run) | 1 |\n",
		"| pleg-nri | 3 | 1 (c1): 2 / 1 / 0, 10m0s; 2 (c2): 1 / 2 / 0, 10m0s; 3 (c3): 2 / 1 / 0, 10m0s | 1 | 1 |\n",
		"- pleg-nri: `b`\n  - run 1: passed (1.0 s)\n  - run 2: failed (0.0 s): timed out\n  - run 3: passed (1.0 s)\n",
	)
	if strings.Count(md, "## Selection") != 1 { // before the orphan below
		t.Errorf("the repeats made sections of their own:\n%s", md)
	}

	// Repeats whose selection has no first run kept still show.
	orphan := run("pleg-nri", 2, "c4", pass("a"))
	orphan.Selection.Name = "other"
	if err := saveRun("v1.2.3", orphan); err != nil {
		t.Fatal(err)
	}
	md = report(t, "v1.2.3")
	if want := "## Selection \"other\", repeated runs only (no run 1 kept)\n\n### Repeated runs (flakes)"; !strings.Contains(md, want) ||
		!strings.Contains(md, "| pleg-nri | 1 | 2 (c4): 1 / 0 / 0, 10m0s | - (one run) | 0 |") {
		t.Errorf("report lacks the orphan repeat (%q):\n%s", want, md)
	}

	var b strings.Builder
	writeRepeats(&b, []suiteRun{run("pleg-nri", 0, "c1", pass("a"))}, []suiteRun{run("pleg-nri", 2, "c2", pass("a"))})
	if !strings.Contains(b.String(), "No spec flaked") {
		t.Errorf("two equal runs: %q", b.String())
	}
	b.Reset()
	writeRepeats(&b, []suiteRun{run("pleg-nri", 0, "c1", pass("a"))}, nil)
	if b.String() != "" {
		t.Errorf("no repeats: %q, want nothing", b.String())
	}
}

// TestShardWallDiffs: the setups' wall times are compared shard by shard over the shards both ran, with
// the sums beside; fewer than minPairedSpecs shared shards give nothing.
func TestShardWallDiffs(t *testing.T) {
	part := func(setup string, i int, wall float64) suiteRun {
		return suiteRun{Setup: setup, WallSeconds: wall,
			Selection: selection{Name: "s", Shard: &shard{Of: "job", Index: i, Count: 8, Split: splitOrdered}}}
	}
	var generic, plegNRI mergedRun
	generic.Setup, plegNRI.Setup = "generic", "pleg-nri"
	for i := 1; i <= 8; i++ {
		generic.Parts = append(generic.Parts, part("generic", i, 600))
		if i != 8 { // pleg-nri lacks shard 8: it is left out of the pairs and of both sums
			plegNRI.Parts = append(plegNRI.Parts, part("pleg-nri", i, 630))
		}
	}
	var b strings.Builder
	writeShardWallDiffs(&b, reportSection{Shards: 8, Runs: []mergedRun{generic, plegNRI}})
	want := "- pleg-nri minus generic, p50 of the per-shard differences: +30 s (95 % interval +30 to +30 s over 7 shards: later); sums 1h13m30s against 1h10m0s (+5.0 %)\n"
	if !strings.HasSuffix(b.String(), want) {
		t.Fatalf("got %q, want it to end in %q", b.String(), want)
	}
	b.Reset()
	plegNRI.Parts = plegNRI.Parts[:minPairedSpecs-1]
	writeShardWallDiffs(&b, reportSection{Shards: 8, Runs: []mergedRun{generic, plegNRI}})
	if b.String() != "" {
		t.Fatalf("with %d shared shards: %q, want nothing", minPairedSpecs-1, b.String())
	}
}

// TestCheckRepeat: a repeat must select what the selection's kept run 1 selected; a first run, or a
// repeat of a selection with no run 1 kept, is not checked.
func TestCheckRepeat(t *testing.T) {
	tempDocs(t)
	if err := saveRun("v1.2.3", suiteRun{Setup: "generic", Selection: selection{Name: "quick", Focus: "F", Skip: "S"}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sel  selection
		fail bool
	}{
		{selection{Name: "quick", Focus: "F", Skip: "S", Run: 2}, false},
		{selection{Name: "quick", Focus: "MirrorPod", Skip: "S", Run: 2}, true},
		{selection{Name: "quick", Focus: "F", Skip: "other", Run: 3}, true},
		{selection{Name: "quick", Focus: "MirrorPod", Skip: "S"}, false}, // run 1: replaces the kept one
		{selection{Name: "new", Focus: "X", Run: 2}, false},
	} {
		err := checkRepeat("v1.2.3", c.sel)
		if (err != nil) != c.fail {
			t.Errorf("checkRepeat(%+v) = %v, want an error: %v", c.sel, err, c.fail)
		}
	}
}

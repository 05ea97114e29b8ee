package e2enode

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestParseShard(t *testing.T) {
	for in, want := range map[string][2]int{"1/6": {1, 6}, "6/6": {6, 6}, " 2/3 ": {2, 3}, "1/1": {1, 1}} {
		i, n, err := parseShard(in)
		if err != nil || i != want[0] || n != want[1] {
			t.Errorf("parseShard(%q) = %d, %d, %v; want %d, %d", in, i, n, err, want[0], want[1])
		}
	}
	for _, in := range []string{"", "0/6", "7/6", "1/0", "1", "a/6", "1/b", "-1/6", "1/6/2"} {
		if _, _, err := parseShard(in); err == nil {
			t.Errorf("parseShard(%q) accepted", in)
		}
	}
	if got := shardName("job", 3, 12); got != "job-shard-3of12" {
		t.Errorf("shardName = %q", got)
	}
}

// TestShardOf: the shards of a list are disjoint, cover it (each name once, duplicates of a name
// together), differ in size by one at most, and do not depend on the list's order.
func TestShardOf(t *testing.T) {
	var names []string
	for i := range 534 {
		names = append(names, fmt.Sprintf("[sig-node] spec %03d [NodeConformance]", (i*7919)%534))
	}
	names = append(names, names[10]) // a name twice (two specs with the same text) goes to one shard
	reversed := slices.Clone(names)
	slices.Reverse(reversed)
	for _, count := range []int{1, 5, 12, 534} {
		seen := map[string]int{}
		minSize, maxSize := len(names), 0
		for index := 1; index <= count; index++ {
			part := shardOf(names, index, count)
			if !reflect.DeepEqual(part, shardOf(reversed, index, count)) {
				t.Fatalf("%d/%d depends on the order of the list", index, count)
			}
			if !slices.IsSorted(part) {
				t.Errorf("%d/%d not sorted", index, count)
			}
			for _, n := range part {
				seen[n]++
			}
			minSize, maxSize = min(minSize, len(part)), max(maxSize, len(part))
		}
		if len(seen) != 534 {
			t.Errorf("%d shards cover %d names, want 534", count, len(seen))
		}
		for n, k := range seen {
			if k != 1 {
				t.Errorf("%d shards: %q in %d shards", count, n, k)
			}
		}
		if maxSize-minSize > 1 {
			t.Errorf("%d shards: sizes %d to %d", count, minSize, maxSize)
		}
	}
	if got := shardOf([]string{"d", "a", "c", "b", "e"}, 2, 2); !reflect.DeepEqual(got, []string{"b", "d"}) {
		t.Errorf("shardOf(a..e, 2, 2) = %q, want b, d", got)
	}
}

// TestShardFocus: the focus matches what ginkgo matches it against (the suite's description, a space,
// the spec's text) for exactly the names given, whatever they contain.
func TestShardFocus(t *testing.T) {
	in := []string{
		"[sig-node] Pods should be updated [NodeConformance] [Conformance]",
		"[sig-node] Probing container should *not* be restarted with a /healthz http liveness probe [NodeConformance]",
		"[sig-node] a (b) c? d+ e|f $g ^h \\i {j} [Feature:X.Y]",
		"[sig-node] Pods",
	}
	out := []string{
		"[sig-node] Pods should be updated [NodeConformance] [Conformance] too",
		"[sig-node] Pods should be updated [NodeConformance]",
		"[sig-node] Pods ",
		"[sig-node] Probing container should not be restarted with a /healthz http liveness probe [NodeConformance]",
		"[sig-node] a (b) c? d+ e",
	}
	re := regexp.MustCompile(shardFocus("E2eNode Suite", in))
	for _, n := range in {
		if !re.MatchString("E2eNode Suite " + n) {
			t.Errorf("focus misses %q", n)
		}
		if re.MatchString(n) || re.MatchString("Other Suite "+n) {
			t.Errorf("focus matches %q without the suite's description", n)
		}
	}
	for _, n := range out {
		if re.MatchString("E2eNode Suite " + n) {
			t.Errorf("focus matches %q", n)
		}
	}
}

func TestReadDryRun(t *testing.T) {
	const report = `[{"SuiteDescription": "E2eNode Suite", "SpecReports": [
  {"ContainerHierarchyTexts": null, "LeafNodeType": "SynchronizedBeforeSuite", "LeafNodeText": "", "State": "passed"},
  {"ContainerHierarchyTexts": ["[sig-node] Pods", "", "when x"], "LeafNodeType": "It", "LeafNodeText": "should y [NodeConformance]", "State": "passed"},
  {"ContainerHierarchyTexts": ["[sig-node] Slow"], "LeafNodeType": "It", "LeafNodeText": "z [Slow]", "State": "skipped"},
  {"ContainerHierarchyTexts": ["[sig-node] A"], "LeafNodeType": "It", "LeafNodeText": "b [Feature:C]", "State": "passed"}
]}]`
	desc, names, err := readDryRun([]byte(report))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"[sig-node] A b [Feature:C]", "[sig-node] Pods when x should y [NodeConformance]"}; desc != "E2eNode Suite" || !reflect.DeepEqual(names, want) {
		t.Errorf("readDryRun = %q, %q; want E2eNode Suite, %q", desc, names, want)
	}
	if _, _, err := readDryRun([]byte(`[]`)); err == nil {
		t.Error("readDryRun accepted a report without a suite")
	}
}

// TestShardedReport: each shard's run is kept under its own selection name; the report merges a
// selection's shards per setup (counts, wall times summed, the shards present and missing, a table per
// shard), compares setups only over the specs both ran, and keeps an unsharded run of the same
// selection apart.
func TestShardedReport(t *testing.T) {
	saved := docsDir
	docsDir = t.TempDir()
	t.Cleanup(func() { docsDir = saved })
	pass := func(name string, s float64) testResult { return testResult{Name: name, Status: "passed", Seconds: s} }
	fail := func(name, why string) testResult {
		return testResult{Name: name, Status: "failed", Seconds: 3, Failure: why}
	}
	run := func(setup string, index int, wall float64, tests ...testResult) suiteRun {
		sel := selection{Name: shardName("job", index, 3), Focus: "F", Skip: "S",
			Shard: &shard{Of: "job", Index: index, Count: 3, Specs: len(tests), Selected: 6}}
		return suiteRun{Setup: setup, Selection: sel, Procs: 4, WallSeconds: wall, Started: fmt.Sprintf("2026-11-26T0%d:00:00Z", index), Commit: "abc", Tests: tests}
	}
	shard1 := []testResult{pass("a", 1), fail("d", "no image")}
	runs := []suiteRun{
		run("generic", 1, 600, shard1...),
		run("containerd", 1, 610, shard1...),
		run("pleg-nri", 1, 590, shard1...),
		// Shard 3 before shard 2, as another session might have run it.
		run("generic", 3, 100, pass("c", 2), pass("f should delete gracefully", 10)),
		run("containerd", 3, 120, fail("c", "timed out"), pass("f should delete gracefully", 15)),
		run("pleg-nri", 3, 90, pass("c", 2), pass("f should delete gracefully", 9)),
		// Shard 2 with generic only (the session ended): its specs are compared with nothing.
		run("generic", 2, 200, pass("b", 1), fail("e", "generic only")),
		// An unsharded run of the same selection stays a section of its own.
		{Setup: "generic", Selection: selection{Name: "job", Focus: "F", Skip: "S"}, Procs: 4, WallSeconds: 7000, Tests: []testResult{pass("a", 1)}},
	}
	for _, r := range runs {
		if err := saveRun("v1.2.3", r); err != nil {
			t.Fatal(err)
		}
	}
	// Running shard 3 of generic again replaces only it.
	again := run("generic", 3, 110, pass("c", 2), pass("f should delete gracefully", 11))
	if err := saveRun("v1.2.3", again); err != nil {
		t.Fatal(err)
	}
	got, err := loadResults("v1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Runs) != len(runs) {
		t.Fatalf("kept %d runs, want %d", len(got.Runs), len(runs))
	}
	secs := reportSections(got.Runs)
	if len(secs) != 2 {
		t.Fatalf("sections: %+v", secs)
	}
	var sharded reportSection
	for _, s := range secs {
		if s.Shards == 3 {
			sharded = s
		}
	}
	if len(sharded.Runs) != 3 || sharded.Runs[0].Setup != "generic" || sharded.Runs[2].Setup != "pleg-nri" {
		t.Fatalf("merged runs: %+v", sharded.Runs)
	}
	g := sharded.Runs[0]
	if g.WallSeconds != 910 || len(g.Tests) != 6 || !reflect.DeepEqual(g.shardsPresent(), []int{1, 2, 3}) || g.Started != "2026-11-26T01:00:00Z" {
		t.Errorf("generic merged: wall %v, %d tests, shards %v, started %s", g.WallSeconds, len(g.Tests), g.shardsPresent(), g.Started)
	}
	if p := sharded.Runs[2]; !reflect.DeepEqual(p.shardsPresent(), []int{1, 3}) || p.WallSeconds != 680 {
		t.Errorf("pleg-nri merged: shards %v, wall %v", p.shardsPresent(), p.WallSeconds)
	}
	if err := writeReport("v1.2.3"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(docsPath("v1.2.3", ".md"))
	if err != nil {
		t.Fatal(err)
	}
	md := string(data)
	for _, want := range []string{
		"## Selection \"job\", in 3 shards\n",
		"focus `F`, skip `S`: 6 specs, cut into 3 shards",
		"| generic | 4 | 2 | 0 | 15m10s | 1, 2, 3 (3 of 3) | none | 4 | 2026-11-26T01:00:00Z | abc |",
		"| containerd | 2 | 2 | 0 | 12m10s | 1, 3 (2 of 3) | 2 | 4 |",
		"| pleg-nri | 3 | 1 | 0 | 11m20s | 1, 3 (2 of 3) | 2 | 4 |",
		"| shard | specs | generic | containerd | pleg-nri |",
		"| 1/3 | 2 | 1 / 1 / 0, 10m0s | 1 / 1 / 0, 10m10s | 1 / 1 / 0, 9m50s |",
		"| 2/3 | 2 | 1 / 1 / 0, 3m20s | not run | not run |",
		"| 3/3 | 2 | 2 / 0 / 0, 1m50s | 1 / 1 / 0, 2m0s | 2 / 0 / 0, 1m30s |",
		"- `c`\n  - generic: passed (2.0 s)\n  - containerd: failed (3.0 s): timed out\n  - pleg-nri: passed (2.0 s)\n",
		"- `d`: no image\n",
		"- `e`: generic only (ran in generic only: the other setups lack its shard)\n",
		"| f should delete gracefully | 11.0 | 15.0 | 9.0 |",
		"## Selection \"job\"\n\nfocus `F`, skip `S`\n\n| setup |",
		"| generic | 1 | 0 | 0 | 1h56m40s | 4 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	// Specs that ran in one setup only are no difference.
	for _, notWant := range []string{"- `b`", "- `e`\n", "not run (its shard is missing)"} {
		if strings.Contains(md, notWant) {
			t.Errorf("report has %q:\n%s", notWant, md)
		}
	}
}

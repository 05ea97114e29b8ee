package e2enode

import (
	"fmt"
	"os"
	"path/filepath"
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
	if got := shardName("job", splitOrdered, 3, 12); got != "job-ordered-shard-3of12" {
		t.Errorf("shardName = %q", got)
	}
	if got := shardName("job", "", 3, 12); got != "job-shard-3of12" {
		t.Errorf("shardName of the first split = %q, want the name its runs were stored under", got)
	}
}

// singletons is names, one group each.
func singletons(names []string) [][]string {
	out := make([][]string, len(names))
	for i, n := range names {
		out[i] = []string{n}
	}
	return out
}

// TestShardOf: the shards of a list of groups are disjoint, cover it (each name once), keep each group
// whole, differ in size by one at most (by less than the largest group with groups), do not depend on
// the order of the list or of a group, and with groups of one are the round robin the first runs used.
func TestShardOf(t *testing.T) {
	var names []string
	for i := range 534 {
		names = append(names, fmt.Sprintf("[sig-node] spec %03d [NodeConformance]", (i*7919)%534))
	}
	// Three Ordered containers of 12, 5 and 2 specs; the rest alone.
	groups := [][]string{names[0:12], names[100:105], names[300:302]}
	for _, n := range names[12:100] {
		groups = append(groups, []string{n})
	}
	for _, n := range append(slices.Clone(names[105:300]), names[302:]...) {
		groups = append(groups, []string{n})
	}
	reversed := slices.Clone(groups)
	slices.Reverse(reversed)
	for i, g := range reversed {
		reversed[i] = slices.Clone(g)
		slices.Reverse(reversed[i])
	}
	for _, count := range []int{1, 5, 12, 100} {
		where := map[string]int{}
		minSize, maxSize := len(names), 0
		for index := 1; index <= count; index++ {
			part := shardOf(groups, index, count)
			if !reflect.DeepEqual(part, shardOf(reversed, index, count)) {
				t.Fatalf("%d/%d depends on the order of the list", index, count)
			}
			if !slices.IsSorted(part) {
				t.Errorf("%d/%d not sorted", index, count)
			}
			for _, n := range part {
				if _, dup := where[n]; dup {
					t.Errorf("%d shards: %q in two shards", count, n)
				}
				where[n] = index
			}
			minSize, maxSize = min(minSize, len(part)), max(maxSize, len(part))
		}
		if len(where) != 534 {
			t.Errorf("%d shards cover %d names, want 534", count, len(where))
		}
		for _, g := range groups[:3] {
			for _, n := range g {
				if where[n] != where[g[0]] {
					t.Errorf("%d shards: the group of %q split (%q in shard %d, not %d)", count, g[0], n, where[n], where[g[0]])
				}
			}
		}
		if maxSize-minSize > 1 && maxSize-minSize >= 12 {
			t.Errorf("%d shards: sizes %d to %d", count, minSize, maxSize)
		}
	}
	// Groups of one: round robin over the sorted names, the split the first runs used.
	if got := shardOf(singletons([]string{"d", "a", "c", "b", "e"}), 2, 2); !reflect.DeepEqual(got, []string{"b", "d"}) {
		t.Errorf("shardOf(a..e, 2, 2) = %q, want b, d", got)
	}
	// The largest group first, to shard 1; then each to the smallest shard.
	g := [][]string{{"z"}, {"a"}, {"m1", "m2", "m3"}, {"b"}, {"c"}}
	for index, want := range map[int][]string{1: {"m1", "m2", "m3"}, 2: {"a", "c"}, 3: {"b", "z"}} {
		if got := shardOf(g, index, 3); !reflect.DeepEqual(got, want) {
			t.Errorf("shardOf(%q, %d, 3) = %q, want %q", g, index, got, want)
		}
	}
}

// TestOrderedGroups: the specs under one outermost Ordered container are one group, whatever decorates
// the containers inside it, read from the source the locations point at; a container named Ordered
// in a string is not Ordered; a name listed twice is one spec; a location the source does not have is
// an error, not a guess.
func TestOrderedGroups(t *testing.T) {
	root := t.TempDir()
	const file = "k8s.io/kubernetes@v9.9.9/test/e2e_node/x_test.go"
	src := `package e2enode

var _ = SIGDescribe("Lifecycle", func() {
	ginkgo.When("plain", func() {
		ginkgo.It("a", func() {})
	})
	ginkgo.When("ordered", ginkgo.Ordered, func() {
		ginkgo.When("inner", ginkgo.Ordered, func() {
			ginkgo.It("b", func() {})
		})
		ginkgo.It("c", func() {})
	})
	ginkgo.When("Ordered in its text, not decorated", func() {
		ginkgo.It("d", func() {})
	})
	ginkgo.When(
		"split over lines", Ordered,
		func() {
			ginkgo.It("e", func() {})
			ginkgo.It("f", func() {})
		})
})
`
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(file)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, file), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	at := func(lines ...int) []codeLocation {
		var out []codeLocation
		for _, l := range lines {
			out = append(out, codeLocation{FileName: file, LineNumber: l})
		}
		return out
	}
	specs := []dryRunSpec{
		{Name: "Lifecycle plain a", Containers: at(3, 4)},
		{Name: "Lifecycle ordered inner b", Containers: at(3, 7, 8)},
		{Name: "Lifecycle ordered c", Containers: at(3, 7)},
		{Name: "Lifecycle Ordered in its text d", Containers: at(3, 13)},
		{Name: "Lifecycle split e", Containers: at(3, 16)},
		{Name: "Lifecycle split f", Containers: at(3, 16)},
		{Name: "Lifecycle plain a", Containers: at(3, 4)},
	}
	d := &sourceDecorators{root: root}
	got, err := orderedGroups(specs, d.isOrdered)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"Lifecycle plain a"},
		{"Lifecycle ordered inner b", "Lifecycle ordered c"},
		{"Lifecycle Ordered in its text d"},
		{"Lifecycle split e", "Lifecycle split f"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("orderedGroups = %q, want %q", got, want)
	}
	for _, l := range []int{7, 8, 16} {
		if ok, err := d.isOrdered(codeLocation{FileName: file, LineNumber: l}); !ok || err != nil {
			t.Errorf("line %d: Ordered = %v, %v; want true", l, ok, err)
		}
	}
	for _, l := range []int{3, 4, 13, 17, 18} {
		if ok, err := d.isOrdered(codeLocation{FileName: file, LineNumber: l}); ok || err != nil {
			t.Errorf("line %d: Ordered = %v, %v; want false", l, ok, err)
		}
	}
	missing := []dryRunSpec{{Name: "gone", Containers: []codeLocation{{FileName: "k8s.io/kubernetes@v9.9.9/nope_test.go", LineNumber: 3}}}}
	if _, err := orderedGroups(missing, d.isOrdered); err == nil {
		t.Error("orderedGroups guessed for a file the source does not have")
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
  {"ContainerHierarchyTexts": ["[sig-node] Pods", "", "when x"], "ContainerHierarchyLocations": [{"FileName": "k8s.io/kubernetes@v1.37.2/test/e2e_node/pods_test.go", "LineNumber": 40}, {"FileName": "k8s.io/kubernetes@v1.37.2/test/e2e_node/pods_test.go", "LineNumber": 52}, {"FileName": "k8s.io/kubernetes@v1.37.2/test/e2e_node/pods_test.go", "LineNumber": 60}], "LeafNodeType": "It", "LeafNodeText": "should y [NodeConformance]", "State": "passed"},
  {"ContainerHierarchyTexts": ["[sig-node] Slow"], "LeafNodeType": "It", "LeafNodeText": "z [Slow]", "State": "skipped"},
  {"ContainerHierarchyTexts": ["[sig-node] A"], "LeafNodeType": "It", "LeafNodeText": "b [Feature:C]", "State": "passed"}
]}]`
	desc, specs, err := readDryRun([]byte(report))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"[sig-node] A b [Feature:C]", "[sig-node] Pods when x should y [NodeConformance]"}; desc != "E2eNode Suite" || !reflect.DeepEqual(specNames(specs), want) {
		t.Errorf("readDryRun = %q, %q; want E2eNode Suite, %q", desc, specNames(specs), want)
	}
	if want := []codeLocation{{"k8s.io/kubernetes@v1.37.2/test/e2e_node/pods_test.go", 40}, {"k8s.io/kubernetes@v1.37.2/test/e2e_node/pods_test.go", 52}, {"k8s.io/kubernetes@v1.37.2/test/e2e_node/pods_test.go", 60}}; !reflect.DeepEqual(specs[1].Containers, want) {
		t.Errorf("the containers' locations: %+v, want %+v", specs[1].Containers, want)
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
	tempDocs(t)
	pass := func(name string, s float64) testResult { return testResult{Name: name, Status: "passed", Seconds: s} }
	fail := func(name, why string) testResult {
		return testResult{Name: name, Status: "failed", Seconds: 3, Failure: why}
	}
	run := func(setup string, index int, wall float64, tests ...testResult) suiteRun {
		sel := selection{Name: shardName("job", splitOrdered, index, 3), Focus: "F", Skip: "S",
			Shard: &shard{Of: "job", Split: splitOrdered, Index: index, Count: 3, Specs: len(tests), Selected: 6}}
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
		// A shard of the first split, stored before the others: a section of its own, after them.
		{Setup: "generic", Selection: selection{Name: shardName("job", "", 1, 3), Focus: "F", Skip: "S",
			Shard: &shard{Of: "job", Index: 1, Count: 3, Specs: 2, Selected: 6}}, Procs: 4, WallSeconds: 50,
			Tests: []testResult{pass("a", 1), fail("c", "init-3 never started")}},
	}
	// The first split's shard was saved first.
	runs = append(runs[len(runs)-1:], runs[:len(runs)-1]...)
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
	if len(secs) != 3 || !secs[2].superseded() || secs[0].superseded() || secs[1].superseded() {
		t.Fatalf("sections: %+v", secs)
	}
	var sharded reportSection
	for _, s := range secs {
		if s.Shards == 3 && s.Split == splitOrdered {
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
	md := report(t, "v1.2.3")
	wantInReport(t, md,
		"## Selection \"job\", in 3 shards\n",
		"focus `F`, skip `S`: 6 specs, cut into 3 shards (`make e2e-node SHARD=i/3`: the specs of each Ordered container together",
		"## Selection \"job\", in 3 shards, the first split (superseded)\n",
		"| generic | 1 | 1 | 0 | 50s | 1 (1 of 3) | 2, 3 | 4 |",
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
	)
	// Specs that ran in one setup only are no difference.
	for _, notWant := range []string{"- `b`", "- `e`\n", "not run (its shard is missing)"} {
		if strings.Contains(md, notWant) {
			t.Errorf("report has %q:\n%s", notWant, md)
		}
	}
}

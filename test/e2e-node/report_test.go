package e2enode

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/atomicfile"
	"github.com/pleg-nri/pleg-nri/test/cadvisorlag"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
	"github.com/pleg-nri/pleg-nri/test/e2eimages"
	"github.com/pleg-nri/pleg-nri/test/junit"
)

// selection is which specs a run ran.
type selection struct {
	Name  string `json:"name"`
	Focus string `json:"focus"`
	Skip  string `json:"skip"`
	// Shard is set when the run ran one shard of the selection Focus and Skip select (E2E_NODE_SHARD).
	Shard *shard `json:"shard,omitempty"`
	// Run is which run of the selection this is (E2E_NODE_RUN): 0 or 1 the first, whose tables the
	// report shows; 2, 3, ... the repeats kept beside it, to show a flake (see writeRepeats).
	Run int `json:"run,omitempty"`
	// runFocus, when set, is the focus ginkgo runs with instead of Focus: a shard's exact names.
	runFocus string
}

// checkRepeat refuses a repeat (sel.Run > 1) of a selection whose kept run 1 selected other specs: its
// specs would all count as flakes. Another focus is another selection (E2E_NODE_SELECTION).
func checkRepeat(version string, sel selection) error {
	if sel.run() == 1 {
		return nil
	}
	r, err := loadResults(version)
	if err != nil {
		return err
	}
	for _, old := range r.Runs {
		if old.Selection.Name == sel.Name && old.Selection.run() == 1 && (old.Selection.Focus != sel.Focus || old.Selection.Skip != sel.Skip) {
			return fmt.Errorf("run %d of selection %q with focus %q and skip %q, but its run 1 (%s, %s) had focus %q and skip %q: "+
				"a repeat must select the same specs (name another focus with E2E_NODE_SELECTION)",
				sel.run(), sel.Name, sel.Focus, sel.Skip, old.Setup, old.Started, old.Selection.Focus, old.Selection.Skip)
		}
	}
	return nil
}

// run is the number of the run: 1 for the first (Run unset).
func (s selection) run() int { return max(s.Run, 1) }

// ginkgoFocus is the focus ginkgo runs the selection with.
func (s selection) ginkgoFocus() string {
	if s.runFocus != "" {
		return s.runFocus
	}
	return s.Focus
}

// testResult is one spec of a run, as ginkgo's JUnit report gives it.
type testResult = junit.Result

// suiteRun is one setup's run of a selection.
type suiteRun struct {
	Setup       string             `json:"setup"`
	Selection   selection          `json:"selection"`
	Procs       int                `json:"procs"`
	Started     string             `json:"started"`
	WallSeconds float64            `json:"wall_seconds"`
	Commit      string             `json:"commit"`
	Images      []e2eimages.Result `json:"images,omitempty"`
	Tests       []testResult       `json:"tests"`
	// CAdvisor is how far the kubelet's cAdvisor lagged behind the kubelet in the run, from the
	// kubelet's log (nil for runs saved before it was recorded, or whose log could not be read).
	CAdvisor *cadvisorlag.Lags `json:"cadvisor_lag,omitempty"`
}

type counts = junit.Counts

func (r suiteRun) counts() counts { return junit.Count(r.Tests) }

// readJUnit reads the specs a run selected from a ginkgo JUnit report (junit.Read).
func readJUnit(path string) ([]testResult, error) { return junit.Read(path) }

// results is docs/e2e-node-<version>.json: the latest run of each setup and selection.
type results struct {
	Version string     `json:"version"`
	Runs    []suiteRun `json:"runs"`
}

// docsDir is where the results and the report go: the tree's docs (a test of the report sets its own).
var docsDir = func() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(self), "..", "..", "docs")
}()

func docsPath(version, ext string) string {
	return filepath.Join(docsDir, "e2e-node-"+version+ext)
}

func loadResults(version string) (results, error) {
	r := results{Version: version}
	data, err := os.ReadFile(docsPath(version, ".json"))
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(data, &r)
}

// saveRun keeps run in the version's results, in place of an earlier run of the same setup, selection
// and run number (runs of other setups, selections and numbers stay: the report is built from every
// session's).
func saveRun(version string, run suiteRun) error {
	r, err := loadResults(version)
	if err != nil {
		return err
	}
	kept := r.Runs[:0]
	for _, old := range r.Runs {
		if old.Setup != run.Setup || old.Selection.Name != run.Selection.Name || old.Selection.run() != run.Selection.run() {
			kept = append(kept, old)
		}
	}
	r.Runs = append(kept, run)
	sort.SliceStable(r.Runs, func(a, b int) bool {
		if r.Runs[a].Selection.Name != r.Runs[b].Selection.Name {
			return r.Runs[a].Selection.Name < r.Runs[b].Selection.Name
		}
		if r.Runs[a].Selection.run() != r.Runs[b].Selection.run() {
			return r.Runs[a].Selection.run() < r.Runs[b].Selection.run()
		}
		return setupIndex(r.Runs[a].Setup) < setupIndex(r.Runs[b].Setup)
	})
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(docsPath(version, ".json"), append(data, '\n'), 0o644)
}

func setupIndex(name string) int {
	for i, s := range setups {
		if s.Name == name {
			return i
		}
	}
	return len(setups)
}

// terminationTest matches the specs that time a pod's termination (the kubelet's 5 s cache wait on
// 1.35/1.36 shows there).
var terminationTest = regexp.MustCompile(`(?i)terminat|graceful|delete`)

// writeReport renders docs/e2e-node-<version>.md from the version's results.
func writeReport(version string) error {
	r, err := loadResults(version)
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Upstream's node e2e suite on kubelet %s, per PLEG setup\n\n", version)
	b.WriteString("Generated by `make e2e-node` (test/e2e-node) from `docs/e2e-node-" + version + ".json`; each\n" +
		"selection's latest run per setup (a selection run again, `RUN=n`, keeps each run: its \"Repeated\n" +
		"runs\"). generic: GenericPLEG on containerd; containerd: EventedPLEG on containerd's own stream;\n" +
		"pleg-nri: EventedPLEG on pleg-nri's endpoint. Same containerd, same kubelet binary, same machine, one\n" +
		"setup after the other. The summary of all versions: `docs/e2e-node.md`.\n")
	repeats := map[string][]suiteRun{}
	for _, run := range r.Runs {
		if run.Selection.run() > 1 {
			repeats[run.Selection.Name] = append(repeats[run.Selection.Name], run)
		}
	}
	for _, sec := range reportSections(r.Runs) {
		runs := make([]suiteRun, len(sec.Runs))
		for i, m := range sec.Runs {
			runs[i] = m.suiteRun
		}
		if sec.Shards == 0 {
			fmt.Fprintf(&b, "\n## Selection %q\n\n", sec.Name)
			fmt.Fprintf(&b, "focus `%s`, skip `%s`\n\n", sec.Focus, sec.Skip)
			b.WriteString("| setup | passed | failed | skipped | wall time | procs | run started | commit |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
			for _, run := range runs {
				c := run.counts()
				fmt.Fprintf(&b, "| %s | %d | %d | %d | %s | %d | %s | %s |\n", run.Setup, c.Passed, c.Failed, c.Skipped,
					seconds(run.WallSeconds), run.Procs, run.Started, run.Commit)
			}
		} else {
			writeShardedTables(&b, sec)
		}
		writeDifferences(&b, runs, sec.Shards > 0)
		writeFailures(&b, runs, sec.Shards > 0)
		writeSkipped(&b, runs)
		writeTerminations(&b, runs)
		writeCAdvisorLag(&b, sec)
		if sec.Shards == 0 {
			writeRepeats(&b, runs, repeats[sec.Name])
			delete(repeats, sec.Name)
		}
	}
	// Repeats of a selection none of whose first runs is kept: shown on their own, not dropped.
	for _, name := range slices.Sorted(maps.Keys(repeats)) {
		fmt.Fprintf(&b, "\n## Selection %q, repeated runs only (no run 1 kept)\n", name)
		writeRepeats(&b, nil, repeats[name])
	}
	return atomicfile.WriteFile(docsPath(version, ".md"), []byte(b.String()), 0o644)
}

// writeCAdvisorLag writes, for a section whose runs recorded it, how far the kubelet's cAdvisor lagged
// behind the kubelet's own creates and stops per setup (package cadvisorlag says why it matters).
func writeCAdvisorLag(b *strings.Builder, sec reportSection) {
	if !slices.ContainsFunc(sec.Runs, func(m mergedRun) bool { return m.CAdvisor != nil }) {
		return
	}
	b.WriteString("\n### The kubelet's cAdvisor behind the kubelet (from the kubelet's log)\n\n" +
		"Per setup, from its runs that recorded it: pods the kubelet synced for the first time, to cAdvisor adding " +
		"their cgroup (until then a read of the pod's usage fails); containers the kubelet created, to cAdvisor adding them; " +
		"containers the kubelet stopped itself, from the stop's return to cAdvisor destroying them " +
		"(negative: before it returned); the kubelet's \"unable to read memory usage\" (an in-place resize's " +
		"memory check that could not read the pod's usage from cAdvisor). No event source is on this path: " +
		"it measures the node.\n\n" +
		"| setup | runs | pods: n, lag p50 / p90 / max | created: n, lag p50 / p90 / max | stopped: n, lag p50 / p90 / max | destroyed after the stop returned | unable to read memory usage |\n" +
		"| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, m := range sec.Runs {
		if m.CAdvisor == nil {
			continue
		}
		n := 0
		for _, p := range m.Parts {
			if p.CAdvisor != nil {
				n++
			}
		}
		l := m.CAdvisor
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %d | %d |\n", m.Setup, n, cadvisorlag.SummarySeconds(l.PodsMs), cadvisorlag.SummarySeconds(l.CreatedMs), cadvisorlag.SummarySeconds(l.StoppedMs), l.Late(), l.UnableToRead)
	}
}

func seconds(s float64) string { return (time.Duration(s) * time.Second).String() }

// reportSection is one selection of the report: its runs, one per setup; for a selection run in
// shards (make e2e-node SHARD=i/N), the runs of its N shards merged per setup.
type reportSection struct {
	Name        string
	Focus, Skip string
	// Shards is N for a selection run in N shards (0: not sharded); Selected its number of specs;
	// Split how it was cut (shard.Split).
	Shards, Selected int
	Split            string
	Runs             []mergedRun
}

// mergedRun is one setup's runs of a section: its specs, wall times summed, and which shards it has.
type mergedRun struct {
	suiteRun
	// Parts are the shards' runs merged, by shard.
	Parts []suiteRun
}

// shardsPresent are the shards of m, in order.
func (m mergedRun) shardsPresent() []int {
	var out []int
	for _, p := range m.Parts {
		out = append(out, p.Selection.Shard.Index)
	}
	return out
}

// reportSections groups the first runs by selection, in order of first appearance; the shards of a selection
// cut into N shards the same way are one section (cut into another N, or another way, another).
func reportSections(runs []suiteRun) []reportSection {
	var out []reportSection
	index := map[string]int{}
	for _, run := range runs {
		if run.Selection.run() > 1 {
			continue // writeRepeats shows it, beside its selection's first run
		}
		key, sec := run.Selection.Name, reportSection{Name: run.Selection.Name, Focus: run.Selection.Focus, Skip: run.Selection.Skip}
		if sh := run.Selection.Shard; sh != nil {
			key = fmt.Sprintf("%s\x00%d\x00%s", sh.Of, sh.Count, sh.Split)
			sec.Name, sec.Shards, sec.Selected, sec.Split = sh.Of, sh.Count, sh.Selected, sh.Split
		}
		i, ok := index[key]
		if !ok {
			i = len(out)
			index[key] = i
			out = append(out, sec)
		}
		out[i].Runs = append(out[i].Runs, mergedRun{suiteRun: run, Parts: []suiteRun{run}})
	}
	for i := range out {
		if out[i].Shards > 0 {
			out[i].Runs = mergeShards(out[i].Runs)
		}
	}
	// The first split's runs, superseded, after the rest.
	sort.SliceStable(out, func(a, b int) bool { return !out[a].superseded() && out[b].superseded() })
	return out
}

// superseded says the section holds runs of the first, round-robin split.
func (s reportSection) superseded() bool { return s.Shards > 0 && s.Split == "" }

// mergeShards makes one run per setup (in the setups' order) of the shards' runs: every spec of every
// shard, the wall times summed, the earliest start, the commits and numbers of processes seen.
func mergeShards(runs []mergedRun) []mergedRun {
	bySetup := map[string]*mergedRun{}
	var names []string
	for _, r := range runs {
		m, ok := bySetup[r.Setup]
		if !ok {
			m = &mergedRun{suiteRun: suiteRun{Setup: r.Setup, Selection: r.Selection, Procs: r.Procs, Started: r.Started}}
			m.Selection.Name = r.Selection.Shard.Of
			m.Selection.Shard = nil
			bySetup[r.Setup] = m
			names = append(names, r.Setup)
		}
		m.Parts = append(m.Parts, r.suiteRun)
	}
	sort.SliceStable(names, func(a, b int) bool { return setupIndex(names[a]) < setupIndex(names[b]) })
	out := make([]mergedRun, 0, len(names))
	for _, name := range names {
		m := bySetup[name]
		sort.SliceStable(m.Parts, func(a, b int) bool { return m.Parts[a].Selection.Shard.Index < m.Parts[b].Selection.Shard.Index })
		var commits []string
		for _, p := range m.Parts {
			m.Tests = append(m.Tests, p.Tests...)
			m.WallSeconds += p.WallSeconds
			if p.Started < m.Started {
				m.Started = p.Started
			}
			if p.Procs != m.Procs {
				m.Procs = 0
			}
			if !slices.Contains(commits, p.Commit) {
				commits = append(commits, p.Commit)
			}
			if p.CAdvisor != nil {
				if m.CAdvisor == nil {
					m.CAdvisor = &cadvisorlag.Lags{}
				}
				m.CAdvisor.Add(*p.CAdvisor)
			}
		}
		m.Commit = strings.Join(commits, ", ")
		sort.SliceStable(m.Tests, func(a, b int) bool { return m.Tests[a].Name < m.Tests[b].Name })
		out = append(out, *m)
	}
	return out
}

// writeShardedTables writes a sharded section's tables: per setup, its shards merged and which shards
// it has (a missing shard shows there, and its specs are in no comparison of that setup); then per
// shard and setup.
func writeShardedTables(b *strings.Builder, sec reportSection) {
	switch sec.Split {
	case splitOrdered:
		fmt.Fprintf(b, "\n## Selection %q, in %d shards\n\n", sec.Name, sec.Shards)
		fmt.Fprintf(b, "focus `%s`, skip `%s`: %d specs, cut into %d shards (`make e2e-node SHARD=i/%d`: the specs "+
			"of each Ordered container together, every other spec alone; the groups dealt largest first, each to "+
			"the shard with the fewest specs).", sec.Focus, sec.Skip, sec.Selected, sec.Shards, sec.Shards)
	default:
		fmt.Fprintf(b, "\n## Selection %q, in %d shards, the first split (superseded)\n\n", sec.Name, sec.Shards)
		fmt.Fprintf(b, "focus `%s`, skip `%s`: %d specs, cut into %d shards (the names sorted, the k-th from 0 in "+
			"shard k mod %d + 1). This split ran the later specs of an Ordered container without the earlier "+
			"ones they build on, which failed them alike in every setup; the split that keeps Ordered containers "+
			"whole replaces it, and these runs are kept as they ran.", sec.Focus, sec.Skip, sec.Selected, sec.Shards, sec.Shards)
	}
	b.WriteString(" Per setup, the shards it has, merged: the wall time is their sum. Setups are compared only " +
		"over the specs both ran.\n\n")
	b.WriteString("| setup | passed | failed | skipped | wall time (sum) | shards present | shards missing | procs | runs started (first) | commits |\n" +
		"| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, m := range sec.Runs {
		c := m.counts()
		present := m.shardsPresent()
		var have, missing []string
		for i := 1; i <= sec.Shards; i++ {
			if slices.Contains(present, i) {
				have = append(have, strconv.Itoa(i))
			} else {
				missing = append(missing, strconv.Itoa(i))
			}
		}
		procs := strconv.Itoa(m.Procs)
		if m.Procs == 0 {
			procs = "mixed"
		}
		fmt.Fprintf(b, "| %s | %d | %d | %d | %s | %s (%d of %d) | %s | %s | %s | %s |\n", m.Setup, c.Passed, c.Failed, c.Skipped,
			seconds(m.WallSeconds), strings.Join(have, ", "), len(have), sec.Shards, orNone(strings.Join(missing, ", ")), procs, m.Started, m.Commit)
	}
	b.WriteString("\n#### Per shard (passed / failed / skipped, wall time)\n\n| shard | specs |")
	for _, m := range sec.Runs {
		fmt.Fprintf(b, " %s |", m.Setup)
	}
	b.WriteString("\n| --- | --- |" + strings.Repeat(" --- |", len(sec.Runs)) + "\n")
	for i := 1; i <= sec.Shards; i++ {
		var cells []string
		specs := 0
		for _, m := range sec.Runs {
			cell := "not run"
			for _, p := range m.Parts {
				if p.Selection.Shard.Index == i {
					c := p.counts()
					cell = fmt.Sprintf("%d / %d / %d, %s", c.Passed, c.Failed, c.Skipped, seconds(p.WallSeconds))
					specs = p.Selection.Shard.Specs
				}
			}
			cells = append(cells, cell)
		}
		if specs > 0 {
			fmt.Fprintf(b, "| %d/%d | %d | %s |\n", i, sec.Shards, specs, strings.Join(cells, " | "))
		}
	}
	writeShardWallDiffs(b, sec)
}

// comparedPairs are the pairs of setups the report compares, as indexes {i, j} into setups: each
// evented setup against every setup before it (GenericPLEG is the baseline, never the first of a pair).
func comparedPairs(setups []string) [][2]int {
	var out [][2]int
	for i, s := range setups {
		if s == "generic" {
			continue
		}
		for j := range i {
			out = append(out, [2]int{i, j})
		}
	}
	return out
}

// writeShardWallDiffs compares the setups' wall times shard by shard: the setups of a shard ran the same
// specs one after the other, so the per-shard difference is paired, and its p50 and interval say whether
// a difference of the sums is more than the machine's noise between runs. Only shards both setups ran;
// nothing below minPairedSpecs shards.
func writeShardWallDiffs(b *strings.Builder, sec reportSection) {
	wall := func(m mergedRun) map[int]float64 {
		out := map[int]float64{}
		for _, p := range m.Parts {
			out[p.Selection.Shard.Index] = p.WallSeconds
		}
		return out
	}
	setups := make([]string, len(sec.Runs))
	for i, m := range sec.Runs {
		setups[i] = m.Setup
	}
	wrote := false
	for _, pair := range comparedPairs(setups) {
		i, j := pair[0], pair[1]
		a, other := wall(sec.Runs[i]), wall(sec.Runs[j])
		var x, y []float64
		for k := 1; k <= sec.Shards; k++ {
			wa, okA := a[k]
			wb, okB := other[k]
			if okA && okB {
				x, y = append(x, wa), append(y, wb)
			}
		}
		d := benchreport.PairedQuantileDiff(x, y, 0.5)
		if math.IsNaN(d.Diff) || d.NA < minPairedSpecs {
			continue
		}
		if !wrote {
			b.WriteString("\nWall time shard by shard (the setups of a shard ran its specs one after the other):\n\n")
			wrote = true
		}
		var sumA, sumB float64
		for k := range x {
			sumA, sumB = sumA+x[k], sumB+y[k]
		}
		fmt.Fprintf(b, "- %s minus %s, p50 of the per-shard differences: %+.0f s (95 %% interval %+.0f to %+.0f s over %d shards: %s); sums %s against %s (%+.1f %%)\n",
			sec.Runs[i].Setup, sec.Runs[j].Setup, d.Diff, d.Lo, d.Hi, d.NA, d.Verdict(), seconds(sumA), seconds(sumB), 100*(sumA-sumB)/sumB)
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// outcome maps a spec's name to its result in a run.
func outcome(run suiteRun) map[string]testResult {
	m := make(map[string]testResult, len(run.Tests))
	for _, t := range run.Tests {
		m[t.Name] = t
	}
	return m
}

// outcomes is outcome of each run, in order.
func outcomes(runs []suiteRun) []map[string]testResult {
	outs := make([]map[string]testResult, len(runs))
	for i, run := range runs {
		outs[i] = outcome(run)
	}
	return outs
}

// failed says a spec's status is a failure (failed, panicked, timed out, ...), not a pass, a skip or nothing.
func failed(status string) bool {
	return status != "passed" && status != "skipped" && status != "pending" && status != ""
}

// describe is a spec's outcome in a run: its status and duration, and its failure when it has one.
func describe(t testResult) string {
	if t.Failure != "" {
		return fmt.Sprintf("%s (%.1f s): %s", t.Status, t.Seconds, t.Failure)
	}
	return fmt.Sprintf("%s (%.1f s)", t.Status, t.Seconds)
}

// differs says the spec name's outcome is not the same in every run of outs. With ranOnly the runs
// without it are left out; else a run without it differs from one with it.
func differs(outs []map[string]testResult, name string, ranOnly bool) bool {
	seen, first := false, ""
	for _, out := range outs {
		t, ok := out[name]
		if !ok && ranOnly {
			continue
		}
		if !seen {
			seen, first = true, t.Status
		} else if t.Status != first {
			return true
		}
	}
	return false
}

func allNames(runs []suiteRun) []string {
	seen := map[string]bool{}
	var names []string
	for _, run := range runs {
		for _, t := range run.Tests {
			if !seen[t.Name] {
				seen[t.Name] = true
				names = append(names, t.Name)
			}
		}
	}
	sort.Strings(names)
	return names
}

// writeRepeats shows, when a selection was run again (E2E_NODE_RUN), every run of each setup and every
// spec whose outcome was not the same in all of them: a flake, whichever way. first are the selection's
// first runs (one per setup), more its repeats.
func writeRepeats(b *strings.Builder, first, more []suiteRun) {
	if len(more) == 0 {
		return
	}
	b.WriteString("\n### Repeated runs (flakes)\n\n")
	b.WriteString("The selection run again (`RUN=n`), each run kept beside the first: per setup, its runs (number, commit,\n" +
		"passed / failed / skipped, wall time), and the specs whose outcome was not the same in every run (a spec\n" +
		"missing from a run counts as differing).\n\n")
	b.WriteString("| setup | runs | each run | specs that flaked | failed in every run |\n| --- | --- | --- | --- | --- |\n")
	type flake struct {
		setup, name string
		runs        []suiteRun
	}
	var flakes []flake
	all := append(slices.Clone(first), more...)
	slices.SortStableFunc(all, func(a, c suiteRun) int {
		if d := setupIndex(a.Setup) - setupIndex(c.Setup); d != 0 {
			return d
		}
		return a.Selection.run() - c.Selection.run()
	})
	for len(all) > 0 {
		n := 1
		for n < len(all) && all[n].Setup == all[0].Setup {
			n++
		}
		runs := all[:n:n]
		all = all[n:]
		outs := outcomes(runs)
		var each []string
		for _, run := range runs {
			c := run.counts()
			each = append(each, fmt.Sprintf("%d (%s): %d / %d / %d, %s", run.Selection.run(), run.Commit, c.Passed, c.Failed, c.Skipped, seconds(run.WallSeconds)))
		}
		flaked, failedAll := 0, 0
		for _, name := range allNames(runs) {
			if differs(outs, name, false) {
				flaked++
				flakes = append(flakes, flake{runs[0].Setup, name, runs})
			} else if failed(outs[0][name].Status) {
				failedAll++
			}
		}
		flakedCell := strconv.Itoa(flaked)
		if len(runs) == 1 {
			flakedCell = "- (one run)"
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %d |\n", runs[0].Setup, len(runs), strings.Join(each, "; "), flakedCell, failedAll)
	}
	b.WriteString("\n")
	if len(flakes) == 0 {
		b.WriteString("No spec flaked: every spec had the same outcome in every run of its setup.\n")
		return
	}
	for _, f := range flakes {
		fmt.Fprintf(b, "- %s: `%s`\n", f.setup, f.name)
		for _, run := range f.runs {
			t, ok := outcome(run)[f.name]
			switch {
			case !ok:
				fmt.Fprintf(b, "  - run %d: not in the run\n", run.Selection.run())
			default:
				fmt.Fprintf(b, "  - run %d: %s\n", run.Selection.run(), describe(t))
			}
		}
	}
}

// writeDifferences names every spec whose outcome differs between runs. With ranOnly (a sharded
// selection, where a setup may lack a shard) a spec differs only if setups that ran it disagree; else
// a spec missing from a run differs too.
func writeDifferences(b *strings.Builder, runs []suiteRun, ranOnly bool) {
	b.WriteString("\n### Specs whose outcome differs between setups\n\n")
	outs := outcomes(runs)
	n := 0
	for _, name := range allNames(runs) {
		if !differs(outs, name, ranOnly) {
			continue
		}
		n++
		fmt.Fprintf(b, "- `%s`\n", name)
		for i, run := range runs {
			t, ok := outs[i][name]
			switch {
			case !ok && ranOnly:
				fmt.Fprintf(b, "  - %s: not run (its shard is missing)\n", run.Setup)
			case !ok:
				fmt.Fprintf(b, "  - %s: not in the run\n", run.Setup)
			default:
				fmt.Fprintf(b, "  - %s: %s\n", run.Setup, describe(t))
			}
		}
	}
	if n == 0 {
		b.WriteString("None.\n")
	}
}

// writeFailures names the specs that failed in every run; with ranOnly, in every run that ran them
// (saying which, when not all did).
func writeFailures(b *strings.Builder, runs []suiteRun, ranOnly bool) {
	b.WriteString("\n### Specs that failed in every setup (the node's, not the event source's)\n\n")
	outs := outcomes(runs)
	n := 0
	for _, name := range allNames(runs) {
		all, first := true, ""
		var ran []string
		for i, run := range runs {
			t, ok := outs[i][name]
			if !ok && ranOnly {
				continue
			}
			if !failed(t.Status) {
				all = false
			}
			if len(ran) == 0 {
				first = t.Failure
			}
			ran = append(ran, run.Setup)
		}
		if all {
			n++
			fmt.Fprintf(b, "- `%s`: %s", name, first)
			if len(ran) < len(runs) {
				fmt.Fprintf(b, " (ran in %s only: the other setups lack its shard)", strings.Join(ran, ", "))
			}
			b.WriteString("\n")
		}
	}
	if n == 0 {
		b.WriteString("None.\n")
	}
}

// writeSkipped names the specs the selection chose that did not run: skipped or pending in some run,
// each with the reason the suite gave (the first run's that skipped it), and the setups that skipped it
// when not every setup that ran it did (such a spec also differs between setups).
func writeSkipped(b *strings.Builder, runs []suiteRun) {
	b.WriteString("\n### Specs that did not run (skipped by the suite itself, with its reason)\n\n")
	outs := outcomes(runs)
	n := 0
	for _, name := range allNames(runs) {
		var skipped []string
		reason, ran := "", 0
		for i, run := range runs {
			t, ok := outs[i][name]
			if !ok {
				continue
			}
			ran++
			if t.Status == "skipped" || t.Status == "pending" {
				if len(skipped) == 0 {
					reason = t.Failure
				}
				skipped = append(skipped, run.Setup)
			}
		}
		if len(skipped) == 0 {
			continue
		}
		n++
		fmt.Fprintf(b, "- `%s`: %s", name, orNone(reason))
		if len(skipped) < ran {
			fmt.Fprintf(b, " (skipped in %s only)", strings.Join(skipped, ", "))
		}
		b.WriteString("\n")
	}
	if n == 0 {
		b.WriteString("None.\n")
	}
}

func writeTerminations(b *strings.Builder, runs []suiteRun) {
	b.WriteString("\n### Durations of the specs that terminate pods (seconds, passed runs only)\n\n")
	var rows strings.Builder
	outs := outcomes(runs)
	durations := make([][]float64, len(runs))
	for _, name := range allNames(runs) {
		if !terminationTest.MatchString(name) {
			continue
		}
		all := true
		for i := range runs {
			if outs[i][name].Status != "passed" {
				all = false
			}
		}
		if !all {
			continue
		}
		fmt.Fprintf(&rows, "| %s |", name)
		for i := range runs {
			fmt.Fprintf(&rows, " %.1f |", outs[i][name].Seconds)
			durations[i] = append(durations[i], outs[i][name].Seconds)
		}
		rows.WriteString("\n")
	}
	if rows.Len() == 0 {
		b.WriteString("None: no spec of this selection that terminates pods passed in every setup.\n")
		return
	}
	b.WriteString("| spec |")
	for _, run := range runs {
		fmt.Fprintf(b, " %s |", run.Setup)
	}
	b.WriteString("\n| --- |" + strings.Repeat(" --- |", len(runs)) + "\n")
	b.WriteString(rows.String())
	b.WriteString("| **sum** |")
	for _, d := range durations {
		sum := 0.0
		for _, s := range d {
			sum += s
		}
		fmt.Fprintf(b, " **%.1f** |", sum)
	}
	b.WriteString("\n| **p50** |")
	for i := range runs {
		fmt.Fprintf(b, " **%.1f** |", median(durations[i]))
	}
	b.WriteString("\n")
	writeTerminationDiffs(b, runs, durations)
}

// writeTerminationDiffs says, for each evented setup against those before it in runs, the p50 of
// the per-spec differences of the termination specs' durations with a 95 % bootstrap interval over
// the specs (paired: each spec against itself in the other setup, so a 70 s spec and a 2 s one do not
// widen the interval). Most of these specs poll every 1-2 s, so a single spec moves in steps of that
// size whatever the event source: the interval is what tells a setup's shift from those steps.
// minPairedSpecs is the fewest specs writeTerminationDiffs gives an interval for: with fewer, every
// resampling draws the same few differences and the interval says nothing about noise.
const minPairedSpecs = 6

func writeTerminationDiffs(b *strings.Builder, runs []suiteRun, durations [][]float64) {
	setups := make([]string, len(runs))
	for i, r := range runs {
		setups[i] = r.Setup
	}
	wrote := false
	for _, pair := range comparedPairs(setups) {
		i, j := pair[0], pair[1]
		d := benchreport.PairedQuantileDiff(durations[i], durations[j], 0.5)
		if math.IsNaN(d.Diff) || d.NA < minPairedSpecs {
			continue
		}
		if !wrote {
			b.WriteString("\n")
			wrote = true
		}
		fmt.Fprintf(b, "- %s minus %s, p50 of the per-spec differences: %+.2f s (95 %% interval %+.2f to %+.2f s over %d specs: %s)\n",
			runs[i].Setup, runs[j].Setup, d.Diff, d.Lo, d.Hi, d.NA, d.Verdict())
	}
}

// genericRegressions lists each spec that passed with GenericPLEG in runs and did not pass with an
// evented setup of runs.
func genericRegressions(runs []suiteRun) []string {
	var generic *suiteRun
	for i := range runs {
		if runs[i].Setup == "generic" {
			generic = &runs[i]
		}
	}
	if generic == nil {
		return nil
	}
	base := outcome(*generic)
	var out []string
	for _, run := range runs {
		if run.Setup == "generic" {
			continue
		}
		got := outcome(run)
		for _, name := range allNames([]suiteRun{*generic}) {
			if base[name].Status != "passed" {
				continue
			}
			if r := got[name]; r.Status != "passed" {
				out = append(out, fmt.Sprintf("%s: %q passed with GenericPLEG, %s here: %s", run.Setup, name, r.Status, r.Failure))
			}
		}
	}
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// sameSpecs says a and b are one run's specs: the same names, outcomes and durations, in order.
func sameSpecs(a, b []testResult) bool {
	return slices.EqualFunc(a, b, func(x, y testResult) bool {
		return x.Name == y.Name && x.Status == y.Status && x.Seconds == y.Seconds
	})
}

// reimport saves again the runs of a selection of version from the JUnit reports they left in
// <results>/<version>/<selection>/<setup>/: the wall time is the report's, the start its timestamp,
// focus and skip its properties; the number of processes and the commit are not in it (0, "unknown"),
// but for a run saved before, which keeps what its saving measured (sameSpecs).
func reimport(version, sel, results string) error {
	for _, s := range setups {
		path := junitPath(filepath.Join(results, version, sel, s.Name))
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			continue
		}
		j, err := junit.Parse(path)
		if err != nil {
			return err
		}
		tests, err := readJUnit(path)
		if err != nil {
			return err
		}
		run := suiteRun{Setup: s.Name, Selection: selection{Name: sel}, WallSeconds: j.Time, Tests: tests, Commit: "unknown"}
		if len(j.Suites) > 0 {
			run.Started = j.Suites[0].Timestamp
		}
		// The selection the run wrote beside its report (a shard's says which shard), else the report's
		// focus and skip.
		if saved, err := os.ReadFile(filepath.Join(filepath.Dir(path), "selection.json")); err == nil {
			if err := json.Unmarshal(saved, &run.Selection); err != nil {
				return fmt.Errorf("%s: %w", filepath.Join(filepath.Dir(path), "selection.json"), err)
			}
		} else if len(j.Suites) > 0 {
			for _, p := range j.Suites[0].Properties {
				switch p.Name {
				case "FocusStrings":
					run.Selection.Focus = p.Value
				case "SkipStrings":
					run.Selection.Skip = p.Value
				}
			}
		}
		// The same run saved before (same setup and selection, the same specs with the same
		// durations): only its specs are read again (a newer junit.Summary of their failures); its
		// commit, procs, images, start and wall time, which the saving measured, stay.
		saved, err := loadResults(version)
		if err != nil {
			return err
		}
		for _, old := range saved.Runs {
			if old.Setup == run.Setup && old.Selection.Name == run.Selection.Name && old.Selection.run() == run.Selection.run() && sameSpecs(old.Tests, run.Tests) {
				old.Tests = run.Tests
				run = old
			}
		}
		// The kubelet's log, read again when it is there (what it says does not change; the reading may).
		if l, err := cadvisorlag.ReadFile(filepath.Join(filepath.Dir(path), "report", "kubelet.log")); err == nil {
			run.CAdvisor = &l
		}
		if err := saveRun(version, run); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "e2e-node: saved %s %s %s again from %s (commit %s)\n", version, sel, s.Name, path, run.Commit)
	}
	return nil
}

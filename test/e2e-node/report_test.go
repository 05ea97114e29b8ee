package e2enode

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
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
	"github.com/pleg-nri/pleg-nri/test/e2eimages"
)

// selection is which specs a run ran.
type selection struct {
	Name  string `json:"name"`
	Focus string `json:"focus"`
	Skip  string `json:"skip"`
	// Shard is set when the run ran one shard of the selection Focus and Skip select (E2E_NODE_SHARD).
	Shard *shard `json:"shard,omitempty"`
	// runFocus, when set, is the focus ginkgo runs with instead of Focus: a shard's exact names.
	runFocus string
}

// ginkgoFocus is the focus ginkgo runs the selection with.
func (s selection) ginkgoFocus() string {
	if s.runFocus != "" {
		return s.runFocus
	}
	return s.Focus
}

// testResult is one spec of a run, as ginkgo's JUnit report gives it.
type testResult struct {
	Name string `json:"name"`
	// Status is ginkgo's: passed, failed, skipped, pending, panicked, interrupted, timedout, aborted.
	Status  string  `json:"status"`
	Seconds float64 `json:"seconds"`
	Failure string  `json:"failure,omitempty"`
}

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
}

type counts struct{ Passed, Failed, Skipped int }

func (r suiteRun) counts() counts {
	var c counts
	for _, t := range r.Tests {
		switch t.Status {
		case "passed":
			c.Passed++
		case "skipped", "pending":
			c.Skipped++
		default:
			c.Failed++
		}
	}
	return c
}

// junit is the part of ginkgo's JUnit report read here.
type junit struct {
	Time   float64 `xml:"time,attr"`
	Suites []struct {
		Timestamp  string `xml:"timestamp,attr"`
		Properties []struct {
			Name  string `xml:"name,attr"`
			Value string `xml:"value,attr"`
		} `xml:"properties>property"`
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Status  string  `xml:"status,attr"`
			Time    float64 `xml:"time,attr"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// readJUnit reads the specs a run selected from a ginkgo JUnit report: the "[It]" entries but those
// the focus and skip left out (skipped with the bare message "skipped"; a spec that skips itself says
// why, and is kept). Suite setup and teardown nodes that failed count as failed specs of their own.
func readJUnit(path string) ([]testResult, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var j junit
	if err := xml.Unmarshal(data, &j); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []testResult
	for _, s := range j.Suites {
		for _, c := range s.Cases {
			if !strings.HasPrefix(c.Name, "[It] ") && c.Status == "passed" {
				continue
			}
			if c.Status == "skipped" && c.Skipped != nil && c.Skipped.Message == "skipped" {
				continue
			}
			r := testResult{Name: specName(c.Name), Status: c.Status, Seconds: c.Time}
			switch {
			case c.Failure != nil:
				r.Failure = firstLine(c.Failure.Message)
			case c.Error != nil:
				r.Failure = firstLine(c.Error.Message)
			case c.Skipped != nil:
				r.Failure = firstLine(c.Skipped.Message)
			}
			if r.Status == "" {
				r.Status = "passed"
				if r.Failure != "" {
					r.Status = "failed"
				}
			}
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, errors.New(path + ": no spec in the report")
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, nil
}

// specName is a JUnit test case's name without ginkgo's "[It] " and the list of labels it appends
// ("... [NodeConformance] [sig-node, NodeConformance]"), each of which the name already carries.
func specName(junitName string) string {
	name := strings.TrimPrefix(junitName, "[It] ")
	i := strings.LastIndex(name, " [")
	if i < 0 || !strings.HasSuffix(name, "]") {
		return name
	}
	for _, label := range strings.Split(name[i+2:len(name)-1], ", ") {
		if !strings.Contains(name[:i], "["+label+"]") && !strings.Contains(name[:i], label) {
			return name
		}
	}
	return name[:i]
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

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

// saveRun keeps run in the version's results, in place of an earlier run of the same setup and
// selection (runs of other setups and selections stay: the report is built from every session's).
func saveRun(version string, run suiteRun) error {
	r, err := loadResults(version)
	if err != nil {
		return err
	}
	kept := r.Runs[:0]
	for _, old := range r.Runs {
		if old.Setup != run.Setup || old.Selection.Name != run.Selection.Name {
			kept = append(kept, old)
		}
	}
	r.Runs = append(kept, run)
	sort.SliceStable(r.Runs, func(a, b int) bool {
		if r.Runs[a].Selection.Name != r.Runs[b].Selection.Name {
			return r.Runs[a].Selection.Name < r.Runs[b].Selection.Name
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
		"selection's latest run per setup. generic: GenericPLEG on containerd; containerd: EventedPLEG on\n" +
		"containerd's own stream; pleg-nri: EventedPLEG on pleg-nri's endpoint. Same containerd, same kubelet\n" +
		"binary, same machine, one setup after the other.\n")
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
		writeTerminations(&b, runs)
	}
	return atomicfile.WriteFile(docsPath(version, ".md"), []byte(b.String()), 0o644)
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

// reportSections groups runs by selection, in order of first appearance; the shards of a selection
// cut into N shards the same way are one section (cut into another N, or another way, another).
func reportSections(runs []suiteRun) []reportSection {
	var out []reportSection
	index := map[string]int{}
	for _, run := range runs {
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

// writeDifferences names every spec whose outcome differs between runs. With ranOnly (a sharded
// selection, where a setup may lack a shard) a spec differs only if setups that ran it disagree; else
// a spec missing from a run differs too.
func writeDifferences(b *strings.Builder, runs []suiteRun, ranOnly bool) {
	b.WriteString("\n### Specs whose outcome differs between setups\n\n")
	outs := make([]map[string]testResult, len(runs))
	for i, run := range runs {
		outs[i] = outcome(run)
	}
	n := 0
	for _, name := range allNames(runs) {
		differ, seen, first := false, false, ""
		for i := range runs {
			t, ok := outs[i][name]
			if !ok && ranOnly {
				continue
			}
			if !seen {
				seen, first = true, t.Status
			} else if t.Status != first {
				differ = true
			}
		}
		if !differ {
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
			case t.Failure != "":
				fmt.Fprintf(b, "  - %s: %s (%.1f s): %s\n", run.Setup, t.Status, t.Seconds, t.Failure)
			default:
				fmt.Fprintf(b, "  - %s: %s (%.1f s)\n", run.Setup, t.Status, t.Seconds)
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
	outs := make([]map[string]testResult, len(runs))
	for i, run := range runs {
		outs[i] = outcome(run)
	}
	n := 0
	for _, name := range allNames(runs) {
		all, first := true, ""
		var ran []string
		for i, run := range runs {
			t, ok := outs[i][name]
			if !ok && ranOnly {
				continue
			}
			if s := t.Status; s == "passed" || s == "skipped" || s == "pending" || s == "" {
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

func writeTerminations(b *strings.Builder, runs []suiteRun) {
	b.WriteString("\n### Durations of the specs that terminate pods (seconds, passed runs only)\n\n")
	b.WriteString("| spec |")
	for _, run := range runs {
		fmt.Fprintf(b, " %s |", run.Setup)
	}
	b.WriteString("\n| --- |" + strings.Repeat(" --- |", len(runs)) + "\n")
	outs := make([]map[string]testResult, len(runs))
	for i, run := range runs {
		outs[i] = outcome(run)
	}
	sums := make([]float64, len(runs))
	durations := make([][]float64, len(runs))
	counted := 0
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
		counted++
		fmt.Fprintf(b, "| %s |", name)
		for i := range runs {
			fmt.Fprintf(b, " %.1f |", outs[i][name].Seconds)
			sums[i] += outs[i][name].Seconds
			durations[i] = append(durations[i], outs[i][name].Seconds)
		}
		b.WriteString("\n")
	}
	if counted > 0 {
		b.WriteString("| **sum** |")
		for i := range runs {
			fmt.Fprintf(b, " **%.1f** |", sums[i])
		}
		b.WriteString("\n| **p50** |")
		for i := range runs {
			fmt.Fprintf(b, " **%.1f** |", median(durations[i]))
		}
		b.WriteString("\n")
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

// reimport saves again the runs of a selection of version from the JUnit reports they left in
// <results>/<version>/<selection>/<setup>/: the wall time is the report's, the start its timestamp,
// focus and skip its properties; the number of processes and the commit are not in it (0, "unknown").
func reimport(version, sel, results string) error {
	for _, s := range setups {
		path := junitPath(filepath.Join(results, version, sel, s.Name))
		data, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		var j junit
		if err := xml.Unmarshal(data, &j); err != nil {
			return fmt.Errorf("%s: %w", path, err)
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
		if err := saveRun(version, run); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "e2e-node: saved %s %s %s again from %s\n", version, sel, s.Name, path)
	}
	return nil
}

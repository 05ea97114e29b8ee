package e2enode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// shardEnv runs one shard of the selection: "i/N" (1 <= i <= N) runs the i-th of N parts (make
// e2e-node SHARD=i/N). Ginkgo has no sharding flag: the suite's binary lists the specs the selection's
// focus and skip select (ginkgo --dry-run), the names are sorted, and spec k of that list (from 0) goes
// to shard k mod N + 1; the shard runs with a focus of exactly its specs' names.
const shardEnv = "E2E_NODE_SHARD"

// shard says a run ran one part of a selection.
type shard struct {
	// Of is the selection's name ("job"); the run's own selection name is shardName(Of, Index, Count).
	Of    string `json:"of"`
	Index int    `json:"index"`
	Count int    `json:"count"`
	// Specs is how many specs the shard has, Selected how many the whole selection has.
	Specs    int `json:"specs"`
	Selected int `json:"selected"`
}

// parseShard reads "i/N".
func parseShard(s string) (index, count int, err error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "/")
	if ok {
		index, err = strconv.Atoi(a)
		if err == nil {
			count, err = strconv.Atoi(b)
		}
	}
	if !ok || err != nil || count < 1 || index < 1 || index > count {
		return 0, 0, fmt.Errorf("%s=%q: want i/N with 1 <= i <= N, as 2/6", shardEnv, s)
	}
	return index, count, nil
}

func shardName(of string, index, count int) string {
	return fmt.Sprintf("%s-shard-%dof%d", of, index, count)
}

// shardOf is shard index (1-based) of count of names: the names sorted and deduplicated, every
// count-th from the index-th on. The split depends only on the set of names, so every session that
// lists the same suite with the same focus and skip cuts the same shards, and they differ in size by
// one spec at most.
func shardOf(names []string, index, count int) []string {
	sorted := append([]string(nil), names...)
	sort.Strings(sorted)
	var out []string
	k := 0
	for i, n := range sorted {
		if i > 0 && n == sorted[i-1] {
			continue
		}
		if k%count == index-1 {
			out = append(out, n)
		}
		k++
	}
	return out
}

// shardFocus is a ginkgo focus that selects exactly the specs named: ginkgo matches --focus against
// the suite's description, a space and the spec's text (its containers' and its It's texts, joined
// with spaces), which is the name --dry-run reports.
func shardFocus(description string, names []string) string {
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = regexp.QuoteMeta(n)
	}
	return "^" + regexp.QuoteMeta(description+" ") + "(?:" + strings.Join(quoted, "|") + ")$"
}

// dryRunReport is the part of ginkgo's JSON report read here.
type dryRunReport []struct {
	SuiteDescription string `json:"SuiteDescription"`
	SpecReports      []struct {
		ContainerHierarchyTexts []string `json:"ContainerHierarchyTexts"`
		LeafNodeType            string   `json:"LeafNodeType"`
		LeafNodeText            string   `json:"LeafNodeText"`
		State                   string   `json:"State"`
	} `json:"SpecReports"`
}

// readDryRun returns the suite's description and the names of the specs a ginkgo --dry-run selected
// (reported "passed"; those focus and skip leave out are "skipped"), as ginkgo's FullText: the
// non-empty container texts and the leaf's, joined with spaces.
func readDryRun(data []byte) (string, []string, error) {
	var r dryRunReport
	if err := json.Unmarshal(data, &r); err != nil {
		return "", nil, err
	}
	if len(r) == 0 {
		return "", nil, errors.New("no suite in the report")
	}
	var names []string
	for _, s := range r[0].SpecReports {
		if s.LeafNodeType != "It" || s.State != "passed" {
			continue
		}
		var texts []string
		for _, t := range append(append([]string(nil), s.ContainerHierarchyTexts...), s.LeafNodeText) {
			if t != "" {
				texts = append(texts, t)
			}
		}
		names = append(names, strings.Join(texts, " "))
	}
	sort.Strings(names)
	return r[0].SuiteDescription, names, nil
}

// listSpecs runs the suite's binary with ginkgo --dry-run (one process, as ginkgo requires) with focus
// and skip in dir, and returns the suite's description and the selected specs' names, sorted.
func listSpecs(ctx context.Context, dir, focus, skip string) (string, []string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	args := []string{"--dry-run", "--procs=1", "--no-color", "--output-dir=" + dir, "--json-report=dry-run.json"}
	if focus != "" {
		args = append(args, "--focus="+focus)
	}
	if skip != "" {
		args = append(args, "--skip="+skip)
	}
	args = append(args, filepath.Join(suiteDir, "e2e_node.test"))
	cmd := exec.CommandContext(ctx, filepath.Join(suiteDir, "ginkgo"), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	_ = os.WriteFile(filepath.Join(dir, "dry-run.log"), out, 0o644)
	m, _ := filepath.Glob(filepath.Join(dir, "*dry-run.json"))
	if len(m) != 1 {
		return "", nil, fmt.Errorf("ginkgo --dry-run left no JSON report in %s (%v); see dry-run.log there", dir, err)
	}
	data, rerr := os.ReadFile(m[0])
	if rerr != nil {
		return "", nil, rerr
	}
	desc, names, rerr := readDryRun(data)
	if rerr != nil {
		return "", nil, fmt.Errorf("%s: %w", m[0], rerr)
	}
	if len(names) == 0 {
		return "", nil, fmt.Errorf("ginkgo --dry-run selected no spec (%v); see %s", err, filepath.Join(dir, "dry-run.log"))
	}
	return desc, names, nil
}

// cutShard turns sel into its shard index of count: it lists the selection's specs, takes the shard's,
// and checks with a second dry run that the focus made of their names selects exactly them.
func cutShard(ctx context.Context, sel selection, index, count int, dir string) (selection, []string, error) {
	desc, all, err := listSpecs(ctx, filepath.Join(dir, "all"), sel.Focus, sel.Skip)
	if err != nil {
		return sel, nil, err
	}
	part := shardOf(all, index, count)
	if len(part) == 0 {
		return sel, nil, fmt.Errorf("shard %d of %d of %d specs is empty: use fewer shards", index, count, len(all))
	}
	out := sel
	out.Name = shardName(sel.Name, index, count)
	out.Shard = &shard{Of: sel.Name, Index: index, Count: count, Specs: len(part), Selected: len(all)}
	out.runFocus = shardFocus(desc, part)
	_, got, err := listSpecs(ctx, filepath.Join(dir, "shard"), out.runFocus, sel.Skip)
	if err != nil {
		return sel, nil, fmt.Errorf("checking the shard's focus: %w", err)
	}
	if strings.Join(got, "\n") != strings.Join(part, "\n") {
		return sel, nil, fmt.Errorf("the shard's focus selects %d specs, not its %d: %s", len(got), len(part), diffNames(part, got))
	}
	return out, part, nil
}

// diffNames names what want and got do not share (the first few).
func diffNames(want, got []string) string {
	in := func(l []string) map[string]bool {
		m := map[string]bool{}
		for _, n := range l {
			m[n] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var d []string
	for _, n := range want {
		if !g[n] {
			d = append(d, "missing "+strconv.Quote(n))
		}
	}
	for _, n := range got {
		if !w[n] {
			d = append(d, "extra "+strconv.Quote(n))
		}
	}
	if len(d) > 5 {
		d = append(d[:5], fmt.Sprintf("and %d more", len(d)-5))
	}
	return strings.Join(d, "; ")
}

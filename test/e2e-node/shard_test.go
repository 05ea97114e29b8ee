package e2enode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/pleg-nri/pleg-nri/test/e2eimages"
)

// shardEnv runs one shard of the selection: "i/N" (1 <= i <= N) runs the i-th of N parts (make
// e2e-node SHARD=i/N). Ginkgo has no sharding flag: the suite's binary lists the specs the selection's
// focus and skip select (ginkgo --dry-run), they are cut into groups a shard must not split (the specs
// of one Ordered container, which share state from spec to spec, together; every other spec alone),
// the groups are dealt to the N shards (shardOf), and the shard runs with a focus of exactly its
// specs' names.
const shardEnv = "E2E_NODE_SHARD"

// splitOrdered names how shardOf cuts a selection: Ordered containers kept whole. The first runs
// (2026-11-26) cut the sorted names round robin (an empty Split), which ran the later specs of an
// Ordered container without the earlier ones they build on, so they failed alike in every setup; their
// runs stay in the report as a section of their own.
const splitOrdered = "ordered"

// shard says a run ran one part of a selection.
type shard struct {
	// Of is the selection's name ("job"); the run's own selection name is shardName(Of, Split, Index, Count).
	Of    string `json:"of"`
	Index int    `json:"index"`
	Count int    `json:"count"`
	// Split is how the selection was cut (splitOrdered; empty: the first runs' round robin).
	Split string `json:"split,omitempty"`
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

// shardName is the selection name a shard's runs are kept under: job-ordered-shard-3of12 (the first
// runs' round-robin split: job-shard-3of12).
func shardName(of, split string, index, count int) string {
	if split != "" {
		of += "-" + split
	}
	return fmt.Sprintf("%s-shard-%dof%d", of, index, count)
}

// shardOf is shard index (1-based) of count of groups, its names sorted: the groups dealt largest
// first (ties: by their first name), each to the shard with the fewest specs so far (ties: the lowest
// index). The split depends only on the groups, so every session that lists the same suite with the
// same focus and skip cuts the same shards; with groups of one spec each it is round robin over the
// sorted names, and shards differ in size by one spec at most, or by less than the largest group.
func shardOf(groups [][]string, index, count int) []string {
	sorted := make([][]string, 0, len(groups))
	for _, g := range groups {
		if len(g) > 0 {
			g = slices.Clone(g)
			sort.Strings(g)
			sorted = append(sorted, g)
		}
	}
	sort.SliceStable(sorted, func(a, b int) bool {
		if len(sorted[a]) != len(sorted[b]) {
			return len(sorted[a]) > len(sorted[b])
		}
		return sorted[a][0] < sorted[b][0]
	})
	sizes := make([]int, count)
	var out []string
	for _, g := range sorted {
		to := 0
		for i := range sizes {
			if sizes[i] < sizes[to] {
				to = i
			}
		}
		sizes[to] += len(g)
		if to == index-1 {
			out = append(out, g...)
		}
	}
	sort.Strings(out)
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

// codeLocation is where ginkgo says a node was declared.
type codeLocation struct {
	FileName   string `json:"FileName"`
	LineNumber int    `json:"LineNumber"`
}

// dryRunSpec is a spec a dry run selected: its name and where its containers were declared,
// outermost first.
type dryRunSpec struct {
	Name       string
	Containers []codeLocation
}

// dryRunReport is the part of ginkgo's JSON report read here.
type dryRunReport []struct {
	SuiteDescription string `json:"SuiteDescription"`
	SpecReports      []struct {
		ContainerHierarchyTexts     []string       `json:"ContainerHierarchyTexts"`
		ContainerHierarchyLocations []codeLocation `json:"ContainerHierarchyLocations"`
		LeafNodeType                string         `json:"LeafNodeType"`
		LeafNodeText                string         `json:"LeafNodeText"`
		State                       string         `json:"State"`
	} `json:"SpecReports"`
}

// readDryRun returns the suite's description and the specs a ginkgo --dry-run selected (reported
// "passed"; those focus and skip leave out are "skipped"), sorted by name. A spec's name is ginkgo's
// FullText: the non-empty container texts and the leaf's, joined with spaces.
func readDryRun(data []byte) (string, []dryRunSpec, error) {
	var r dryRunReport
	if err := json.Unmarshal(data, &r); err != nil {
		return "", nil, err
	}
	if len(r) == 0 {
		return "", nil, errors.New("no suite in the report")
	}
	var specs []dryRunSpec
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
		specs = append(specs, dryRunSpec{Name: strings.Join(texts, " "), Containers: s.ContainerHierarchyLocations})
	}
	sort.SliceStable(specs, func(i, j int) bool { return specs[i].Name < specs[j].Name })
	return r[0].SuiteDescription, specs, nil
}

// specNames are the specs' names.
func specNames(specs []dryRunSpec) []string {
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.Name
	}
	return out
}

// orderedGroups cuts specs into the groups a shard must not split: the specs under one outermost
// Ordered container together (ginkgo runs them in order in one process, and each builds on what the
// ones before it did), every other spec alone; a name listed twice (two specs with the same text,
// which one focus selects together) is in one group. isOrdered says whether the container declared at
// a location is Ordered (ginkgo's JSON report does not say: sourceDecorators reads it from the
// source).
func orderedGroups(specs []dryRunSpec, isOrdered func(codeLocation) (bool, error)) ([][]string, error) {
	var keys []string
	groups := map[string][]string{}
	keyOf := map[string]string{}
	for _, s := range specs {
		if _, seen := keyOf[s.Name]; seen {
			continue
		}
		key := "spec\x00" + s.Name
		for _, c := range s.Containers {
			ordered, err := isOrdered(c)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", s.Name, err)
			}
			if ordered {
				key = fmt.Sprintf("ordered\x00%s:%d", c.FileName, c.LineNumber)
				break
			}
		}
		if _, ok := groups[key]; !ok {
			keys = append(keys, key)
		}
		groups[key] = append(groups[key], s.Name)
		keyOf[s.Name] = key
	}
	out := make([][]string, len(keys))
	for i, k := range keys {
		out[i] = groups[k]
	}
	return out, nil
}

// sourceDecorators tells from the suite's source whether a container is Ordered: it parses the file
// of the location (a path relative to the module cache when the binary was built with -trimpath, as
// k8s.io/kubernetes@v1.37.2/test/e2e_node/x_test.go) and looks at the call declaring the container on
// that line for an argument named Ordered (ginkgo.Ordered, or Ordered dot-imported).
type sourceDecorators struct {
	// root is where relative file names are found (the module cache).
	root  string
	files map[string]map[int]bool
}

func (d *sourceDecorators) isOrdered(loc codeLocation) (bool, error) {
	path := loc.FileName
	if !filepath.IsAbs(path) {
		path = filepath.Join(d.root, path)
	}
	lines, ok := d.files[path]
	if !ok {
		var err error
		if lines, err = orderedCalls(path); err != nil {
			return false, fmt.Errorf("reading the container at %s:%d: %w", loc.FileName, loc.LineNumber, err)
		}
		if d.files == nil {
			d.files = map[string]map[int]bool{}
		}
		d.files[path] = lines
	}
	return lines[loc.LineNumber], nil
}

// orderedCalls are the lines of the Go file at path on which a call with an argument named Ordered
// starts or opens its parentheses (the line ginkgo records for a container is one of the two).
func orderedCalls(path string) (map[int]bool, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	lines := map[int]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		for _, arg := range call.Args {
			var name string
			switch a := arg.(type) {
			case *ast.Ident:
				name = a.Name
			case *ast.SelectorExpr:
				name = a.Sel.Name
			}
			if name == "Ordered" {
				lines[fset.Position(call.Pos()).Line] = true
				lines[fset.Position(call.Lparen).Line] = true
				break
			}
		}
		return true
	})
	return lines, nil
}

// listSpecs runs the suite's binary with ginkgo --dry-run (one process, as ginkgo requires) with focus
// and skip in dir, and returns the suite's description and the selected specs, sorted by name.
func listSpecs(ctx context.Context, dir, focus, skip string) (string, []dryRunSpec, error) {
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
	desc, specs, rerr := readDryRun(data)
	if rerr != nil {
		return "", nil, fmt.Errorf("%s: %w", m[0], rerr)
	}
	if len(specs) == 0 {
		return "", nil, fmt.Errorf("ginkgo --dry-run selected no spec (%v); see %s", err, filepath.Join(dir, "dry-run.log"))
	}
	return desc, specs, nil
}

// cutShard turns sel into its shard index of count: it lists the selection's specs, groups the specs
// of each Ordered container, takes the shard's, and checks with a second dry run that the focus made
// of their names selects exactly them. It returns the shard's names and the sizes of the Ordered
// containers kept whole.
func cutShard(ctx context.Context, sel selection, index, count int, dir string) (selection, []string, []int, error) {
	desc, specs, err := listSpecs(ctx, filepath.Join(dir, "all"), sel.Focus, sel.Skip)
	if err != nil {
		return sel, nil, nil, err
	}
	modcache, err := e2eimages.GoEnv("GOMODCACHE")
	if err != nil {
		return sel, nil, nil, err
	}
	src := &sourceDecorators{root: modcache}
	groups, err := orderedGroups(specs, src.isOrdered)
	if err != nil {
		return sel, nil, nil, err
	}
	var ordered []int
	for _, g := range groups {
		if len(g) > 1 {
			ordered = append(ordered, len(g))
		}
	}
	part := shardOf(groups, index, count)
	if len(part) == 0 {
		return sel, nil, nil, fmt.Errorf("shard %d of %d of %d specs is empty: use fewer shards", index, count, len(specs))
	}
	out := sel
	out.Name = shardName(sel.Name, splitOrdered, index, count)
	out.Shard = &shard{Of: sel.Name, Split: splitOrdered, Index: index, Count: count, Specs: len(part), Selected: len(specs)}
	out.runFocus = shardFocus(desc, part)
	_, got, err := listSpecs(ctx, filepath.Join(dir, "shard"), out.runFocus, sel.Skip)
	if err != nil {
		return sel, nil, nil, fmt.Errorf("checking the shard's focus: %w", err)
	}
	if names := specNames(got); strings.Join(names, "\n") != strings.Join(part, "\n") {
		return sel, nil, nil, fmt.Errorf("the shard's focus selects %d specs, not its %d: %s", len(names), len(part), diffNames(part, names))
	}
	return out, part, ordered, nil
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

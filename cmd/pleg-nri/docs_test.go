package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
)

// TestOperationsDocNamesWhatExists: docs/operations.md names every metric, config key and alert, and
// every metric, config key, alert, make target, repository file and command flag it names exists.
func TestOperationsDocNamesWhatExists(t *testing.T) {
	data, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)

	// Metrics: both ways (pleg-nri's own; a histogram by its base name).
	names := exposedNames(t)
	for n := range names {
		if !strings.HasPrefix(n, "pleg_nri_") {
			continue
		}
		base := n
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			if strings.HasSuffix(n, s) && names[strings.TrimSuffix(n, s)] {
				base = strings.TrimSuffix(n, s)
			}
		}
		if !strings.Contains(doc, "`"+base+"`") {
			t.Errorf("docs/operations.md does not describe the metric %s", base)
		}
	}
	// Every name the guide gives exists, but the old names of its renames table.
	current := doc
	if i := strings.Index(doc, "### Metric names changed"); i >= 0 {
		end := strings.Index(doc[i:], "\n## ")
		if end < 0 {
			t.Fatal("the renames section has no end")
		}
		current = doc[:i] + doc[i+end:]
	}
	// The retired keys' section names what is gone on purpose, and names every retired key.
	retired, current := section(t, current, "### Retired keys")
	for k := range config.Retired {
		if !strings.Contains(retired, "| `"+k+"` |") {
			t.Errorf("docs/operations.md's Retired keys do not list %s", k)
		}
	}
	for _, n := range regexp.MustCompile(`\bpleg_nri_[a-z0-9_]+`).FindAllString(current, -1) {
		if !names[n] {
			t.Errorf("docs/operations.md names the metric %s, which does not exist", n)
		}
	}

	// config.Config keys: both ways.
	keys := map[string]bool{}
	for _, k := range config.Keys() {
		keys[k] = true
		if !strings.Contains(doc, "`"+k+"`") {
			t.Errorf("docs/operations.md does not describe the config key %s", k)
		}
	}
	table := current[strings.Index(current, "## Configuration"):strings.Index(current, "## Metrics and alerts")]
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z-]+)`(?:, `([a-z-]+)`)? \\|").FindAllStringSubmatch(table, -1) {
		for _, k := range m[1:] {
			if k != "" && !keys[k] {
				t.Errorf("docs/operations.md describes the config key %s, which does not exist", k)
			}
		}
	}

	// Alerts: both ways.
	rulesData, err := os.ReadFile("../../deploy/prometheus/pleg-nri-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct{ Rules []struct{ Alert string } }
	}
	if err := yaml.Unmarshal(rulesData, &rules); err != nil {
		t.Fatal(err)
	}
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			if !strings.Contains(doc, "`"+r.Alert+"`") {
				t.Errorf("docs/operations.md does not name the alert %s", r.Alert)
			}
		}
	}
	// node-problem-detector's condition and reasons (deploy/npd) share the prefix: named as they are
	// in its monitor configuration.
	npdData, err := os.ReadFile("../../deploy/npd/pleg-nri-monitor.json")
	if err != nil {
		t.Fatal(err)
	}
	var npd struct {
		Conditions []struct{ Type, Reason string }
		Rules      []struct{ Condition, Reason string }
	}
	if err := yaml.Unmarshal(npdData, &npd); err != nil {
		t.Fatal(err)
	}
	npdNames := map[string]bool{}
	for _, c := range npd.Conditions {
		npdNames[c.Type], npdNames[c.Reason] = true, true
	}
	for _, r := range npd.Rules {
		npdNames[r.Condition], npdNames[r.Reason] = true, true
	}
	for _, a := range regexp.MustCompile(`\b(PlegNRI[A-Za-z]+|KubeletEventedPLEG[A-Za-z]+)\b`).FindAllString(current, -1) {
		if !alerts[a] && !npdNames[a] {
			t.Errorf("docs/operations.md names the alert %s, which is not in the rules (nor a condition or reason of deploy/npd)", a)
		}
	}

	// make targets.
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("`(?:sudo )?make ([a-z0-9-]+)").FindAllStringSubmatch(doc, -1) {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(m[1]) + `:`).Match(mk) {
			t.Errorf("docs/operations.md names make %s, which is not a target", m[1])
		}
	}
	for _, m := range regexp.MustCompile(`(?m)^make ([a-z0-9-]+)`).FindAllStringSubmatch(doc, -1) {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(m[1]) + `:`).Match(mk) {
			t.Errorf("docs/operations.md names make %s, which is not a target", m[1])
		}
	}

	// Repository files.
	for _, m := range regexp.MustCompile("`((?:deploy|docs|cmd|test)/[A-Za-z0-9_./-]+|nri\\.conf\\.example)`").FindAllStringSubmatch(doc, -1) {
		if _, err := os.Stat(filepath.Join("../..", m[1])); err != nil {
			t.Errorf("docs/operations.md names %s, which is not in the repository", m[1])
		}
	}

	// The flags of pleg-nri events and pleg-nri kubelet-config in the examples.
	flagRe := regexp.MustCompile(`(?:^|\s)(--?[a-z][a-z-]*)`)
	for _, line := range strings.Split(doc, "\n") {
		for _, cmd := range []string{"pleg-nri events", "pleg-nri kubelet-config"} {
			i := strings.Index(line, cmd)
			if i < 0 {
				continue
			}
			rest := line[i+len(cmd):]
			if j := strings.IndexAny(rest, "`#&|"); j >= 0 {
				rest = rest[:j]
			}
			for _, m := range flagRe.FindAllStringSubmatch(rest, -1) {
				var err error
				if cmd == "pleg-nri events" {
					_, err = parseEventsFlags([]string{m[1] + "=x"}, func(string) string { return "" }, io.Discard)
				} else {
					err = runKubeletConfig([]string{m[1] + "=x", "--config", "/nonexistent"}, io.Discard, io.Discard)
				}
				if err != nil && strings.Contains(err.Error(), "not defined") {
					t.Errorf("docs/operations.md: %s has no flag %s (%q)", cmd, m[1], strings.TrimSpace(line))
				}
			}
		}
	}
}

// TestDocFlagCheckCatchesUnknown: the flag check of the test above finds a flag that does not exist.
func TestDocFlagCheckCatchesUnknown(t *testing.T) {
	_, err := parseEventsFlags([]string{"--podname=x"}, func(string) string { return "" }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not defined") {
		t.Errorf("parseEventsFlags(--podname): %v", err)
	}
	var b bytes.Buffer
	if err := runKubeletConfig([]string{"--endpoint=x"}, &b, &b); err == nil || !strings.Contains(err.Error(), "not defined") {
		t.Errorf("runKubeletConfig(--endpoint): %v", err)
	}
}

// section returns the section of doc under heading (to the next heading of any level) and doc without
// it; a heading doc lacks fails the test.
func section(t *testing.T, doc, heading string) (sec, rest string) {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("docs/operations.md has no %q", heading)
	}
	end := len(doc)
	if j := regexp.MustCompile(`\n#{2,3} `).FindStringIndex(doc[i+1:]); j != nil {
		end = i + 1 + j[0]
	}
	return doc[i:end], doc[:i] + doc[end:]
}

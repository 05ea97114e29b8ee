package e2enode

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestSpecName(t *testing.T) {
	for in, want := range map[string]string{
		"[It] [sig-node] ContainerLogPath Pod should print log to correct log path [NodeConformance] [sig-node, NodeConformance]": "[sig-node] ContainerLogPath Pod should print log to correct log path [NodeConformance]",
		"[It] a [b]":                     "a [b]",
		"[SynchronizedBeforeSuite]":      "[SynchronizedBeforeSuite]",
		"[It] x [Feature:Y] [Feature:Y]": "x [Feature:Y]",
	} {
		if got := specName(in); got != want {
			t.Errorf("specName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReadJUnit(t *testing.T) {
	const report = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" failures="1">
  <testsuite name="E2eNode Suite" tests="5">
    <testcase name="[SynchronizedBeforeSuite]" classname="E2eNode Suite" status="passed" time="4.2"></testcase>
    <testcase name="[It] [sig-node] A passes [NodeConformance] [sig-node, NodeConformance]" status="passed" time="8.5"></testcase>
    <testcase name="[It] [sig-node] B fails [NodeConformance] [sig-node, NodeConformance]" status="failed" time="42.1">
      <failure message="Timed out after 30.001s.&#xA;more" type="failed">details</failure>
    </testcase>
    <testcase name="[It] [sig-node] C filtered [Slow] [sig-node, Slow]" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-node] D skips itself [sig-node]" status="skipped" time="0.1"><skipped message="skipped - no GPU"></skipped></testcase>
    <testcase name="[SynchronizedAfterSuite]" status="failed" time="1"><failure message="services did not stop"></failure></testcase>
  </testsuite>
</testsuites>`
	path := filepath.Join(t.TempDir(), "junit.xml")
	if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readJUnit(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []testResult{
		{Name: "[SynchronizedAfterSuite]", Status: "failed", Seconds: 1, Failure: "services did not stop"},
		{Name: "[sig-node] A passes [NodeConformance]", Status: "passed", Seconds: 8.5},
		{Name: "[sig-node] B fails [NodeConformance]", Status: "failed", Seconds: 42.1, Failure: "Timed out after 30.001s."},
		{Name: "[sig-node] D skips itself", Status: "skipped", Seconds: 0.1, Failure: "skipped - no GPU"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("readJUnit =\n%+v\nwant\n%+v", got, want)
	}
	r := suiteRun{Tests: got}
	if c := r.counts(); c != (counts{Passed: 1, Failed: 2, Skipped: 1}) {
		t.Errorf("counts = %+v", c)
	}
}

// TestReport: runs are kept per setup and selection (a new run replaces only its own), the report names
// every spec whose outcome differs with its failure, the specs failed everywhere, and the termination
// durations; genericRegressions names for a spec that passed with GenericPLEG only.
func TestReport(t *testing.T) {
	saved := docsDir
	docsDir = t.TempDir()
	t.Cleanup(func() { docsDir = saved })
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
	if err := writeReport("v1.2.3"); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(docsPath("v1.2.3", ".md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| generic | 2 | 1 | 0 |",
		"- `a`\n  - generic: passed (1.0 s)\n  - containerd: failed (0.0 s): timed out\n  - pleg-nri: passed (1.0 s)\n",
		"- `c`: no image",
		"| should delete pod gracefully | 12.0 | 17.0 | 11.0 |",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if got := genericRegressions(runs); len(got) != 1 || !strings.HasPrefix(got[0], `containerd: "a" passed with GenericPLEG, failed here: timed out`) {
		t.Errorf("genericRegressions = %q, want the one spec that failed with containerd's stream only", got)
	}
}

func TestSplitRegistry(t *testing.T) {
	for _, c := range []struct {
		name, host, rest string
		ok               bool
	}{
		{"registry.k8s.io/e2e-test-images/agnhost:2.62", "registry.k8s.io", "e2e-test-images/agnhost:2.62", true},
		{"localhost:5000/pause:testing", "localhost:5000", "pause:testing", true},
		{"busybox:1.37", "", "", false},
		{"library/busybox:1.37", "", "", false},
	} {
		host, rest, ok := splitRegistry(c.name)
		if host != c.host || rest != c.rest || ok != c.ok {
			t.Errorf("splitRegistry(%q) = %q, %q, %v; want %q, %q, %v", c.name, host, rest, ok, c.host, c.rest, c.ok)
		}
	}
}

package junit

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
		if got := SpecName(in); got != want {
			t.Errorf("SpecName(%q) = %q, want %q", in, got, want)
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
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []Result{
		{Name: "[SynchronizedAfterSuite]", Status: "failed", Seconds: 1, Failure: "services did not stop"},
		{Name: "[sig-node] A passes [NodeConformance]", Status: "passed", Seconds: 8.5},
		{Name: "[sig-node] B fails [NodeConformance]", Status: "failed", Seconds: 42.1, Failure: "Timed out after 30.001s. … more"},
		{Name: "[sig-node] D skips itself", Status: "skipped", Seconds: 0.1, Failure: "skipped - no GPU"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Read =\n%+v\nwant\n%+v", got, want)
	}
}

func TestSummary(t *testing.T) {
	resize := "Verifying pod resources resize state. Pod: {\n  \"metadata\": {\n    \"name\": \"resize-test-8skkk\"\n  }\n}\n: [\n" +
		"container restart counts don't match expected: [\nTimed out after 60.000s.\nExpected success, but got an error:\n" +
		"    <*errors.errorString | 0xdf13b34af0>: \n    oom_score_adj value 0 not equal to expected -997 for container c1\n" +
		"    {\n        s: \"oom_score_adj value 0 not equal to expected -997 for container c1\",\n    }\n]\n]\n" +
		"    {\n        s: \"[\\ncontainer restart counts don't match expected: [\\n    {\\n        s: \\\"oom\\\",\\n    }\\n]\",\n    }"
	long := strings.Repeat("é", 200)
	for _, c := range []struct{ in, want string }{
		{"services did not stop", "services did not stop"},
		{"  one line  \n", "one line"},
		{"Timed out after 60.001s.\nExpected\n    <string>: a\nto equal\n    <string>: b\n",
			"Timed out after 60.001s. … Expected <string>: a to equal <string>: b"},
		{resize, "Verifying pod resources resize state. Pod: { … oom_score_adj value 0 not equal to expected -997 for container c1"},
		{"cmd [ip link add dummy1 type dummy], stderr \"x\"\ncmd [ip link add dummy1 type dummy], stderr \"x\"",
			"cmd [ip link add dummy1 type dummy], stderr \"x\""},
		{long, strings.Repeat("é", 150) + "..."},
	} {
		if got := Summary(c.in); got != c.want {
			t.Errorf("Summary(%q) =\n%q\nwant\n%q", c.in, got, c.want)
		}
	}
}

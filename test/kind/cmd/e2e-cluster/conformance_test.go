package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/pleg-nri/pleg-nri/test/e2eimages"
	"github.com/pleg-nri/pleg-nri/test/junit"
)

// TestConformanceReport: a spec that passed with GenericPLEG only is a regression of the setup it
// failed in; the report names every spec whose outcome differs, with its failure, the specs failed in
// every setup, and the images not built.
func TestConformanceReport(t *testing.T) {
	pass := func(name string) junit.Result { return junit.Result{Name: name, Status: "passed", Seconds: 3} }
	fail := func(name, why string) junit.Result { return junit.Result{Name: name, Status: "failed", Failure: why} }
	res := conformanceResults{Version: "v1.2.3", Commit: "abc", Focus: conformanceFocus,
		Images: []e2eimages.Result{{Name: "a:1", Built: true}, {Name: "b@sha256:00", Why: "pinned by digest"}},
		Runs: []conformanceRun{
			{Setup: "generic", Procs: 4, WallSeconds: 61, Tests: []junit.Result{pass("x"), pass("y"), fail("z", "no image"), pass("w")}},
			{Setup: "containerd", Procs: 4, WallSeconds: 62, StreamErrs: map[string]float64{"n1": 1}, Tests: []junit.Result{fail("x", "timed out"), pass("y"), fail("z", "no image"), pass("w")}},
			{Setup: "pleg-nri", Procs: 4, WallSeconds: 63, StreamErrs: map[string]float64{"n1": 0}, Tests: []junit.Result{pass("x"), fail("y", "took 10 s"), fail("z", "no image")}},
		}}
	if got, want := conformanceRegressions(res.Runs, "pleg-nri"), []string{"w", "y"}; !reflect.DeepEqual(got, want) {
		t.Errorf("regressions of pleg-nri = %v, want %v", got, want)
	}
	if got, want := conformanceRegressions(res.Runs, "containerd"), []string{"x"}; !reflect.DeepEqual(got, want) {
		t.Errorf("regressions of containerd = %v, want %v", got, want)
	}
	md := conformanceReport(res)
	for _, want := range []string{
		"| GenericPLEG (kind's kubelets as made) | 3 | 1 | 0 | 1m1s | 4 | - |",
		"| EventedPLEG on containerd's stream | 2 | 2 | 0 | 1m2s | 4 | n1 1 |",
		"| EventedPLEG on pleg-nri (the chart, kubelet switch on) | 1 | 2 | 0 | 1m3s | 4 | n1 0 |",
		"## Specs whose outcome differs between the setups (3)",
		"- w: generic: passed; containerd: passed; pleg-nri: not run",
		"- x: generic: passed; containerd: failed (timed out); pleg-nri: passed",
		"- y: generic: passed; containerd: passed; pleg-nri: failed (took 10 s)",
		"## Specs that failed in every setup (1)\n\n- z: no image",
		"1 of the 2 images", "- `b@sha256:00`: pinned by digest",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q:\n%s", want, md)
		}
	}
}

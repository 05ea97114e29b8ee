package front

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// TestQueryAnswers: Query returns the front's answer, and says whether the front gave none or one it
// cannot read; with no front, the dial's error.
func TestQueryAnswers(t *testing.T) {
	for _, tc := range []struct {
		name, answer, want string
	}{
		{"info", "{\"protocol\":1,\"version\":\"v9\",\"pid\":7}\n", ""},
		{"none", "", "no answer from the front"},
		{"unterminated", "{\"version\":\"v9\"}", "no answer from the front"},
		{"not JSON", "ok\n", "bad answer from the front"},
	} {
		runDir := testutil.ShortTempDir(t, "qa-")
		testutil.ServeAnswer(t, filepath.Join(runDir, ControlSocketName), tc.answer)
		info, err := Query(runDir, "info")
		switch {
		case tc.want == "" && (err != nil || info.Version != "v9" || info.PID != 7):
			t.Errorf("%s: Query = %+v, %v; want version v9, pid 7", tc.name, info, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: Query error %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := Query(testutil.ShortTempDir(t, "qa-"), "info"); err == nil {
		t.Error("Query with no front: no error")
	}
}

// TestGathererBadMetrics: a front whose metrics do not parse is the scrape's error, naming the front;
// no front is no metrics and no error; of a front's metrics only pleg-nri's and the runtime's are kept.
func TestGathererBadMetrics(t *testing.T) {
	runDir := testutil.ShortTempDir(t, "gb-")
	if fams, err := (&Gatherer{RunDir: runDir}).Gather(); fams != nil || err != nil {
		t.Errorf("no front: %v, %v; want nothing", fams, err)
	}
	testutil.ServeAnswer(t, filepath.Join(runDir, ControlSocketName), "pleg_nri_x{ 1\n")
	if _, err := (&Gatherer{RunDir: runDir}).Gather(); err == nil || !strings.HasPrefix(err.Error(), "front metrics: ") {
		t.Errorf("bad metrics: %v, want a front metrics error", err)
	}
	good := testutil.ShortTempDir(t, "gb-")
	testutil.ServeAnswer(t, filepath.Join(good, ControlSocketName), "# TYPE pleg_nri_a counter\npleg_nri_a 1\n# TYPE other_b counter\nother_b 2\n# TYPE go_c gauge\ngo_c 3\n")
	fams, err := (&Gatherer{RunDir: good}).Gather()
	var names []string
	for _, f := range fams {
		names = append(names, f.GetName())
	}
	if err != nil || strings.Join(names, ",") != "go_c,pleg_nri_a" {
		t.Errorf("Gather = %v, %v; want go_c and pleg_nri_a", names, err)
	}
}

package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReportErr: the verdict names the failed checks first, then a cleanup that failed; a run that
// passed (or skipped) every check and removed its pods is no error.
func TestReportErr(t *testing.T) {
	for _, tc := range []struct {
		name string
		rep  Report
		want string
	}{
		{"passed", Report{Endpoint: "e", Results: []Result{{ID: "a", Outcome: Pass}, {ID: "b", Outcome: Skip}}}, ""},
		{"failed", Report{Endpoint: "unix:///x.sock", Results: []Result{{ID: "a", Outcome: Fail}, {ID: "b", Outcome: Pass}, {ID: "c", Outcome: Fail}}, Cleanup: "left"},
			"2 of 3 checks failed against unix:///x.sock"},
		{"cleanup", Report{Endpoint: "e", RunID: "r1", Results: []Result{{ID: "a", Outcome: Pass}}, Cleanup: "pod p: busy"},
			"the run's pods could not all be removed (label " + RunLabel + "=r1): pod p: busy"},
	} {
		err := tc.rep.Err()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || err.Error() != tc.want) {
			t.Errorf("%s: Err() = %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestFileLines counts a file's lines across its reads (a file larger than one read buffer), a last
// line without its newline not counted; a missing file is an error.
func TestFileLines(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		data string
		want int
	}{
		"empty":        {"", 0},
		"three":        {"a\nb\nc\n", 3},
		"unterminated": {"a\nb", 1},
		"large":        {strings.Repeat(strings.Repeat("x", 99)+"\n", 2000), 2000},
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(tc.data), 0o644); err != nil {
			t.Fatal(err)
		}
		if n, err := FileLines(path); n != tc.want || err != nil {
			t.Errorf("%s: FileLines = %d, %v; want %d", name, n, err, tc.want)
		}
	}
	if _, err := FileLines(filepath.Join(dir, "missing")); err == nil {
		t.Error("FileLines of a missing file: no error")
	}
	if _, err := FileLines(dir); err == nil || !strings.Contains(err.Error(), "failed to read") {
		t.Errorf("FileLines of a directory: %v, want a read error", err)
	}
}

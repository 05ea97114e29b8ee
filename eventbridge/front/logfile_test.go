package front

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestLogFileCap: the log file is rotated once to .1 before it would pass its cap, so the two together
// hold the last lines, in order, each file within the cap; the descriptors it was given (stdout and
// stderr in the front) follow it; a file found over the cap is rotated at the first write.
func TestLogFileCap(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, logName)
	if err := os.WriteFile(path, bytes.Repeat([]byte("old\n"), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	spare, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer spare.Close()
	const max = 1000
	l, err := openLogFile(path, max, int(spare.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer l.f.Close()
	line := func(i int) string { return fmt.Sprintf("line %03d %s\n", i, strings.Repeat("x", 90)) }
	for i := range 95 {
		if _, err := l.Write([]byte(line(i))); err != nil {
			t.Fatal(err)
		}
	}
	// What the process writes to its stderr lands in the current file.
	if _, err := syscall.Write(int(spare.Fd()), []byte("crash\n")); err != nil {
		t.Fatal(err)
	}
	cur, _ := os.ReadFile(path)
	prev, _ := os.ReadFile(path + ".1")
	if len(cur) > max+len("crash\n") || len(prev) > max {
		t.Errorf("log files of %d and %d bytes, want at most %d each", len(cur), len(prev), max)
	}
	if !strings.HasSuffix(string(cur), line(94)+"crash\n") {
		t.Errorf("the log file does not end with the last line and stderr's:\n%s", cur)
	}
	if strings.Contains(string(prev)+string(cur), "old") {
		t.Error("the file found over the cap was not rotated away")
	}
	// The two files hold the last lines written, in order, none cut.
	all := strings.TrimSuffix(string(prev)+string(cur), "crash\n")
	first := 95 - strings.Count(all, "\n")
	want := ""
	for i := first; i < 95; i++ {
		want += line(i)
	}
	if all != want || first > 95-max/len(line(0)) {
		t.Errorf("the log files hold lines %d to 94 (want at least the last %d, whole):\n%s", first, max/len(line(0)), all)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("files in the run directory: %v, want %s and %s.1", entries, logName, logName)
	}
}

// TestLogFileCannotRotate: when the file cannot be renamed to .1 (a directory stands there), it is
// truncated instead, saying so in its first line, and stays within its cap; a symbolic link at the
// log's path is refused, not followed.
func TestLogFileCannotRotate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, logName)
	if err := os.MkdirAll(filepath.Join(path+".1", "busy"), 0o700); err != nil {
		t.Fatal(err)
	}
	const max = 300
	l, err := openLogFile(path, max)
	if err != nil {
		t.Fatal(err)
	}
	defer l.f.Close()
	line := strings.Repeat("y", 99) + "\n"
	for range 4 {
		if _, err := l.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	cur, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(cur), "pleg-nri front: cannot rotate "+path) || !strings.HasSuffix(string(cur), line) {
		t.Errorf("the log file after a failed rotation:\n%s", cur)
	}
	if len(cur) > max+len(line) || l.size != int64(len(cur)) {
		t.Errorf("the log file holds %d bytes (counted %d), want them counted and at most %d", len(cur), l.size, max+len(line))
	}

	target := filepath.Join(dir, "elsewhere")
	link := filepath.Join(dir, "link.log")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := openLogFile(link, max); err == nil {
		t.Error("a symbolic link at the log's path was followed")
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("the link's target was created: %v", err)
	}
}

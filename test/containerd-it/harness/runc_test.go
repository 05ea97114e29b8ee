package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRuncWrapper: the wrapper runs its command before a delete only, then runc with every argument.
func TestRuncWrapper(t *testing.T) {
	dir := t.TempDir()
	runc, marker, wrapper := filepath.Join(dir, "runc"), filepath.Join(dir, "before"), filepath.Join(dir, "wrapper")
	if err := os.WriteFile(runc, []byte("#!/bin/sh\necho runc \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wrapper, []byte(runcWrapper(runc, "echo x >> "+marker)), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args   []string
		before bool
	}{
		{[]string{"--root", "/r", "state", "id"}, false},
		{[]string{"--root", "/r", "delete", "--force", "id"}, true},
	} {
		_ = os.Remove(marker)
		out, err := exec.Command(wrapper, tc.args...).CombinedOutput()
		if want := "runc " + strings.Join(tc.args, " ") + "\n"; err != nil || string(out) != want {
			t.Errorf("%v: %v %q, want %q", tc.args, err, out, want)
		}
		if _, err := os.Stat(marker); (err == nil) != tc.before {
			t.Errorf("%v: the command before delete ran: %v, want %v", tc.args, err == nil, tc.before)
		}
	}
}

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/pleg"
)

// TestDaemonUnusableCheckpoint: the real binary with a corrupt checkpoint, and with one written for
// another runtime endpoint, in its state-dir: it logs it, sets it aside as checkpoint.unusable, serves
// as on a first start, and writes a good checkpoint of its own when it stops.
func TestDaemonUnusableCheckpoint(t *testing.T) {
	other := filepath.Join(t.TempDir(), "other")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	// A valid checkpoint of another runtime: what the daemon writes when it stops.
	{
		dir := testutil.ShortTempDir(t, "pn-")
		sock := filepath.Join(dir, "run", "cri.sock")
		args := append(absentUpstreams(dir), "--listen", "unix://"+sock, "--state-dir", other)
		d := startDaemon(t, sock, 0o022, args...)
		if code := d.stop(t); code != 0 {
			t.Fatalf("exit status %d", code)
		}
	}
	foreign, err := os.ReadFile(filepath.Join(other, "checkpoint"))
	if err != nil {
		t.Fatalf("no checkpoint written at shutdown: %v", err)
	}
	for name, data := range map[string][]byte{
		"corrupt":       []byte("plegnri\x00\x01\x00\x00\x00garbage that is not a checkpoint"),
		"other version": append([]byte("plegnri\x00\x63\x00\x00\x00"), foreign[12:]...),
		"other runtime": foreign,
	} {
		t.Run(name, func(t *testing.T) {
			dir := testutil.ShortTempDir(t, "pn-")
			state := filepath.Join(dir, "state")
			if err := os.MkdirAll(state, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(state, "checkpoint"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(dir, "run", "cri.sock")
			// absentUpstreams names another containerd socket than the daemon above: another runtime.
			d := startDaemon(t, sock, 0o022, append(absentUpstreams(dir), "--listen", "unix://"+sock)...)
			if code := d.stop(t); code != 0 {
				t.Errorf("exit status %d, want 0", code)
			}
			if !strings.Contains(d.out.String(), "unusable checkpoint ignored") {
				t.Errorf("no log line about the unusable checkpoint:\n%s", d.out.String())
			}
			aside, err := os.ReadFile(filepath.Join(state, "checkpoint.unusable"))
			if err != nil || string(aside) != string(data) {
				t.Errorf("the unusable checkpoint was not set aside unchanged: %v", err)
			}
			ck, err := pleg.ReadCheckpoint(filepath.Join(state, "checkpoint"))
			if err != nil {
				t.Fatalf("the checkpoint written at shutdown: %v", err)
			}
			if want := "unix://" + filepath.Join(dir, "absent-containerd.sock"); ck.Scope != want {
				t.Errorf("checkpoint scope %q, want %q", ck.Scope, want)
			}
		})
	}
}

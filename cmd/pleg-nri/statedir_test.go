package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

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

// TestDaemonStateDirLock (issue 26): two cores never share a state directory. A second daemon on the
// state-dir of a running one waits pleg.DefaultStateLockWait for it, then exits naming it; one started while the
// holder is still there goes on once the holder lets go (a restart whose predecessor is still stopping).
func TestDaemonStateDirLock(t *testing.T) {
	state := filepath.Join(testutil.ShortTempDir(t, "pn-"), "state")
	dir1 := testutil.ShortTempDir(t, "pn-")
	sock1 := filepath.Join(dir1, "run", "cri.sock")
	first := startDaemon(t, sock1, 0o022, append(absentUpstreams(dir1), "--listen", "unix://"+sock1, "--state-dir", state)...)

	t.Run("second core", func(t *testing.T) {
		dir2 := testutil.ShortTempDir(t, "pn-")
		code, out := runToExit(t, append(absentUpstreams(dir2), "--listen", "unix://"+filepath.Join(dir2, "run", "cri.sock"), "--state-dir", state)...)
		if code != 1 {
			t.Errorf("exit status %d, want 1; output:\n%s", code, out)
		}
		want := fmt.Sprintf("in use by another pleg-nri core (pid %d)", first.cmd.Process.Pid)
		if line := lastLine(out); !strings.Contains(line, `config key "state-dir"`) || !strings.Contains(line, want) {
			t.Errorf("last line %q does not say config key \"state-dir\" ... %s", line, want)
		}
		if _, err := os.Stat(filepath.Join(dir2, "run")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the second core created its socket directory: %v", err)
		}
	})

	t.Run("successor", func(t *testing.T) {
		dir2 := testutil.ShortTempDir(t, "pn-")
		sock2 := filepath.Join(dir2, "run", "cri.sock")
		second := spawnDaemon(t, sock2, 0o022, append(absentUpstreams(dir2), "--listen", "unix://"+sock2, "--state-dir", state)...)
		if err := testutil.Poll(context.Background(), 20*time.Second, "the successor to wait for the lock", func() (bool, error) {
			return strings.Contains(second.out.String(), "the state directory is locked by another pleg-nri core"), nil
		}); err != nil {
			t.Fatalf("%v:\n%s", err, second.out.String())
		}
		if code := first.stop(t); code != 0 {
			t.Errorf("the first core's exit status %d, want 0", code)
		}
		second.waitServing(t, sock2)
		if got, _ := os.ReadFile(filepath.Join(state, pleg.StateLockName)); strings.TrimSpace(string(got)) != strconv.Itoa(second.cmd.Process.Pid) {
			t.Errorf("the lock file says %q, want the successor's pid %d", got, second.cmd.Process.Pid)
		}
	})
}

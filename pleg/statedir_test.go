package pleg

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestLockStateDir: the state directory is made 0700 and locked with the holder's pid in its lock
// file; a second lock waits at most its bound and names the holder; it gets the lock once the first
// is released; a state directory that is a file is refused.
func TestLockStateDir(t *testing.T) {
	// In a bubble the waits are exact and take no time.
	synctest.Test(t, testLockStateDir)
}

func testLockStateDir(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "state")
	unlock, err := LockStateDir(ctx, dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state dir: %v, %v; want a 0700 directory", fi.Mode(), err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, StateLockName)); strings.TrimSpace(string(got)) != fmt.Sprint(os.Getpid()) {
		t.Errorf("lock file holds %q, want this pid", got)
	}
	start := time.Now()
	_, err = LockStateDir(ctx, dir, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) || !strings.Contains(err.Error(), "another pleg-nri core") {
		t.Fatalf("second lock: %v, want an error naming the holder", err)
	}
	if waited := time.Since(start); waited < 200*time.Millisecond || waited > 300*time.Millisecond {
		t.Errorf("the second lock gave up after %s, want its bound 200ms (at most one poll more)", waited)
	}

	released := make(chan struct{})
	go func() {
		time.Sleep(100 * time.Millisecond)
		unlock()
		close(released)
	}()
	unlock2, err := LockStateDir(ctx, dir, 10*time.Second)
	if err != nil {
		t.Fatalf("lock after the holder released it: %v", err)
	}
	<-released
	unlock2()

	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LockStateDir(ctx, file, time.Second); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a file as the state dir: %v", err)
	}
}

// TestLockStateDirRefusesUntrusted: a state directory that is a symbolic link, that others may write
// to or that another user owns is refused with an error naming it and what is wrong; a lock file that
// is a symbolic link is refused, and what it names is left alone.
func TestLockStateDirRefusesUntrusted(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	real := filepath.Join(root, "real")
	if err := os.Mkdir(real, 0o700); err != nil {
		t.Fatal(err)
	}
	mkdir := func(mode os.FileMode, uid int) func(string) error {
		return func(dir string) error {
			if err := os.Mkdir(dir, 0o700); err != nil {
				return err
			}
			if err := os.Chmod(dir, mode); err != nil {
				return err
			}
			return os.Chown(dir, uid, uid)
		}
	}
	for _, tc := range []struct {
		name  string
		setup func(dir string) error
		want  string
	}{
		{"symlink", func(dir string) error { return os.Symlink(real, dir) }, "is a symbolic link"},
		{"world-writable", mkdir(0o777, 0), "writable by its group or by others (mode 0777)"},
		{"group-writable", mkdir(0o770, 0), "writable by its group or by others (mode 0770)"},
		{"another user's", mkdir(0o700, 65534), "owned by uid 65534"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(root, strings.ReplaceAll(tc.name, " ", "-"))
			if err := tc.setup(dir); err != nil {
				t.Fatal(err)
			}
			unlock, err := LockStateDir(ctx, dir, time.Second)
			if err == nil {
				unlock()
				t.Fatal("LockStateDir succeeded")
			}
			if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to name %s and say %q", err, dir, tc.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("left in %s: %v", dir, entries)
			}
		})
	}

	t.Run("lock is a symlink", func(t *testing.T) {
		dir := filepath.Join(root, "state")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(root, "precious")
		if err := os.WriteFile(target, []byte("keep me"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(dir, StateLockName)); err != nil {
			t.Fatal(err)
		}
		unlock, err := LockStateDir(ctx, dir, time.Second)
		if err == nil {
			unlock()
			t.Error("LockStateDir succeeded on a lock file that is a symbolic link")
		}
		if got, _ := os.ReadFile(target); string(got) != "keep me" {
			t.Errorf("the file the link named was written: %q", got)
		}
	})
}

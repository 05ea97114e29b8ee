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

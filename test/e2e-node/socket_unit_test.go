package e2enode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLinkSocket: the link points at the socket for the run, its directory made and removed with it; a
// file already at the path is never replaced.
func TestLinkSocket(t *testing.T) {
	tmp := t.TempDir()
	sock := filepath.Join(tmp, "live.sock")
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(tmp, "run", "containerd", "containerd.sock")
	unlink, err := linkSocket(path, sock)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(path); err != nil || got != sock {
		t.Fatalf("link = %q, %v", got, err)
	}
	if _, err := linkSocket(path, "/tmp/y.sock"); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("a second link over the first: %v", err)
	}
	// A killed run's link, to a socket that is gone, is replaced.
	stale := filepath.Join(tmp, "stale.sock")
	if err := os.Symlink(filepath.Join(tmp, "gone.sock"), stale); err != nil {
		t.Fatal(err)
	}
	if _, err := linkSocket(stale, sock); err != nil {
		t.Fatalf("over a dangling link: %v", err)
	}
	if got, _ := os.Readlink(stale); got != sock {
		t.Fatalf("stale link now points at %q", got)
	}
	if _, err := linkSocket(stale, "/tmp/z.sock"); err == nil {
		t.Fatal("a live link was replaced")
	}
	if err := unlink(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Dir(path)); !os.IsNotExist(err) {
		t.Fatalf("the directory it made is left: %v", err)
	}
	// A directory that was there stays.
	dir := filepath.Join(tmp, "run")
	if unlink, err = linkSocket(filepath.Join(dir, "c.sock"), "/tmp/x.sock"); err != nil {
		t.Fatal(err)
	}
	if err := unlink(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the directory that was there: %v", err)
	}
}

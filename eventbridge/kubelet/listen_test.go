package kubelet

import (
	"context"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

func listenT(t *testing.T, address string) net.Listener {
	t.Helper()
	l, err := Listen(context.Background(), address)
	if err != nil {
		t.Fatalf("Listen(%s): %v", address, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func perm(t *testing.T, path string) fs.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestListenCreatesDirectoryAndSocket(t *testing.T) {
	old := syscall.Umask(0o077) // the modes must not depend on the umask
	defer syscall.Umask(old)

	dir := filepath.Join(testutil.ShortTempDir(t, "eb-"), "run")
	sock := filepath.Join(dir, "cri.sock")
	l := listenT(t, "unix://"+sock)

	if got := perm(t, dir); got != 0o750 {
		t.Errorf("directory mode %o, want 750", got)
	}
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		t.Errorf("%s is not a socket: %s", sock, fi.Mode())
	}
	if got := fi.Mode().Perm(); got != 0o660 {
		t.Errorf("socket mode %o, want 660", got)
	}

	// It answers.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()

	// Closing the listener removes the socket.
	_ = l.Close()
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket still there after close: %v", err)
	}
}

// TestListenUnusableDirectory: a socket directory whose parent is missing, that is a file, or in which
// the socket cannot be made gives an error naming the path, and leaves nothing behind.
func TestListenUnusableDirectory(t *testing.T) {
	root := testutil.ShortTempDir(t, "eb-")
	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	long := filepath.Join(root, "run", strings.Repeat("x", 120)+".sock") // longer than sun_path
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing parent", filepath.Join(root, "missing", "run", "cri.sock"), "its parent " + filepath.Join(root, "missing") + " does not exist"},
		{"directory is a file", filepath.Join(file, "cri.sock"), file + " is not a directory"},
		{"path too long", long, "failed to listen on " + long},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Listen(context.Background(), "unix://"+tc.path)
			if err == nil {
				_ = l.Close()
				t.Fatal("Listen succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
			entries, _ := os.ReadDir(root)
			if len(entries) != 1 || entries[0].Name() != "file" {
				t.Errorf("left in %s: %v, want only the file", root, entries)
			}
			if b, _ := os.ReadFile(file); string(b) != "keep me" {
				t.Errorf("file changed: %q", b)
			}
		})
	}
}

// TestListenCloseLeavesReplacedSocket: closing the listener removes its socket, but not a file that took
// its place.
func TestListenCloseLeavesReplacedSocket(t *testing.T) {
	dir := testutil.ShortTempDir(t, "eb-")
	sock := filepath.Join(dir, "cri.sock")
	l := listenT(t, sock)
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("not yours"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, sock); err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
	if b, err := os.ReadFile(sock); err != nil || string(b) != "not yours" {
		t.Errorf("the file that replaced the socket: %q, %v", b, err)
	}
}

func TestListenLeavesExistingDirectory(t *testing.T) {
	dir := testutil.ShortTempDir(t, "eb-")
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	listenT(t, filepath.Join(dir, "cri.sock"))
	if got := perm(t, dir); got != 0o755 {
		t.Errorf("existing directory mode changed to %o", got)
	}
}

func TestListenReplacesStaleSocket(t *testing.T) {
	sock := filepath.Join(testutil.ShortTempDir(t, "eb-"), "cri.sock")
	// A socket file nobody listens on, as a crashed run leaves it.
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ul.SetUnlinkOnClose(false)
	_ = ul.Close()
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("no stale socket: %v", err)
	}

	listenT(t, sock)
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("new socket does not answer: %v", err)
	}
	_ = c.Close()
	if got := perm(t, sock); got != 0o660 {
		t.Errorf("socket mode %o, want 660", got)
	}
}

func TestListenRefusesLiveSocket(t *testing.T) {
	sock := filepath.Join(testutil.ShortTempDir(t, "eb-"), "cri.sock")
	other, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	_, err = Listen(context.Background(), sock)
	if err == nil || !strings.Contains(err.Error(), "another server is listening") {
		t.Fatalf("Listen on a live socket: %v", err)
	}
	// The other server's socket is untouched.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("other server's socket broken: %v", err)
	}
	_ = c.Close()
}

func TestListenRefusesNonSocket(t *testing.T) {
	dir := testutil.ShortTempDir(t, "eb-")
	for name, setup := range map[string]func(path string) error{
		"regular file": func(path string) error { return os.WriteFile(path, []byte("keep me"), 0o600) },
		"directory":    func(path string) error { return os.Mkdir(path, 0o700) },
		"symlink":      func(path string) error { return os.Symlink("/dev/null", path) },
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".sock")
			if err := setup(path); err != nil {
				t.Fatal(err)
			}
			before, _ := os.Lstat(path)
			_, err := Listen(context.Background(), "unix://"+path)
			if err == nil || !strings.Contains(err.Error(), "is not a socket") || !strings.Contains(err.Error(), path) {
				t.Fatalf("Listen: %v, want a 'not a socket' error naming the path", err)
			}
			after, err := os.Lstat(path)
			if err != nil || after.Mode() != before.Mode() || after.ModTime() != before.ModTime() {
				t.Fatalf("path changed: %v", err)
			}
			if name == "regular file" {
				if b, _ := os.ReadFile(path); string(b) != "keep me" {
					t.Errorf("file content changed: %q", b)
				}
			}
		})
	}
}

func TestListenTCP(t *testing.T) {
	l, err := ListenConfig{AllowTCP: true}.Listen(context.Background(), "tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Addr().Network() != "tcp" {
		t.Errorf("network %s", l.Addr().Network())
	}
}

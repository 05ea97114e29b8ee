package kubelet

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"unsafe"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/internal/endpointtest"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// nobody is the user of the tests' unprivileged clients.
const nobody = 65534

// logTo returns a context whose logger writes to the returned buffer.
func logTo() (context.Context, *bytes.Buffer) {
	var buf bytes.Buffer
	logger := logrus.New()
	logger.SetOutput(&buf)
	logger.SetLevel(logrus.DebugLevel)
	return log.WithLogger(context.Background(), logrus.NewEntry(logger)), &buf
}

// TestListenRefusesTCPUnlessAllowed: a tcp:// address is refused with an error that says why and names
// the key that allows it; allowed, it listens and warns, on loopback too.
func TestListenRefusesTCPUnlessAllowed(t *testing.T) {
	l, err := Listen(context.Background(), "tcp://127.0.0.1:0")
	if err == nil {
		_ = l.Close()
		t.Fatal("Listen on TCP without allow-tcp-listen succeeded")
	}
	for _, want := range []string{"tcp://127.0.0.1:0", "no authentication", "allow-tcp-listen"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}

	ctx, out := logTo()
	l, err = ListenConfig{AllowTCP: true}.Listen(ctx, "tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
	if got := out.String(); !strings.Contains(got, "level=warning") || !strings.Contains(got, "without authentication") {
		t.Errorf("no warning about the unauthenticated TCP endpoint on loopback; the log:\n%s", got)
	}
}

// dialResult is what an unprivileged client got from a socket.
type dialResult struct {
	// read is what it read before the end of the connection (or the timeout).
	read []byte
	// err is the error of connect, or of the read that ended (nil: the server closed the connection).
	err error
}

// dialAs connects to the unix socket at path as uid (and gid uid, no supplementary groups) and reads
// until the server closes the connection or 3 s have passed. The credentials are changed on a locked
// thread with raw system calls, which change that thread's only (syscall.Setuid changes every thread's);
// the thread ends with its goroutine.
func dialAs(t *testing.T, uid int, path string) dialResult {
	t.Helper()
	ch := make(chan dialResult, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes away with its credentials
		ch <- func() dialResult {
			for _, c := range []struct {
				trap, a1, a2, a3 uintptr
			}{
				{syscall.SYS_SETGROUPS, 0, 0, 0},
				{syscall.SYS_SETRESGID, ^uintptr(0), uintptr(uid), ^uintptr(0)},
				{syscall.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)},
			} {
				if _, _, errno := syscall.RawSyscall(c.trap, c.a1, c.a2, c.a3); errno != 0 {
					return dialResult{err: errno}
				}
			}
			fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				return dialResult{err: err}
			}
			defer syscall.Close(fd)
			if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
				return dialResult{err: err}
			}
			if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &syscall.Timeval{Sec: 3}); err != nil {
				return dialResult{err: err}
			}
			var got []byte
			buf := make([]byte, 64)
			for {
				n, err := syscall.Read(fd, buf)
				if n > 0 {
					got = append(got, buf[:n]...)
				}
				if err != nil || n == 0 {
					return dialResult{read: got, err: err}
				}
			}
		}()
	}()
	return endpointtest.Recv(t, ch, "the unprivileged client")
}

// openToAll makes the socket at path and its directory usable by every user, as a mistake or a hand
// would: the listener is then the only thing that keeps others out.
func openToAll(t *testing.T, path string) {
	t.Helper()
	if err := os.Chmod(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
}

// checkRefusesOthers: l, listening on path, closes a connection of another user at once and returns
// root's.
func checkRefusesOthers(t *testing.T, l net.Listener, path string) {
	t.Helper()
	var refused atomic.Int32
	OnRefusedPeer(l, func() { refused.Add(1) })
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	defer func() {
		_ = l.Close()
		for c := range accepted {
			_ = c.Close()
		}
	}()

	r := dialAs(t, nobody, path)
	if r.err != nil && !errors.Is(r.err, syscall.ECONNRESET) {
		t.Errorf("uid %d: the connection was not closed at once: %v (read %q)", nobody, r.err, r.read)
	}
	root, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	c := endpointtest.Recv(t, accepted, "root's connection")
	defer c.Close()
	cred, err := peerCred(c.(*net.UnixConn))
	if err != nil {
		t.Fatal(err)
	}
	if cred.Uid != 0 {
		t.Errorf("Accept returned a connection of uid %d", cred.Uid)
	}
	if got := refused.Load(); got != 1 {
		t.Errorf("refused-peer hook called %d times, want 1", got)
	}
}

// TestListenRefusesOtherUsers: a socket from Listen accepts only root and its owner, even when its
// mode lets everyone connect.
func TestListenRefusesOtherUsers(t *testing.T) {
	path := filepath.Join(testutil.ShortTempDir(t, "eb-"), "cri.sock")
	ctx, out := logTo()
	l, err := Listen(ctx, "unix://"+path)
	if err != nil {
		t.Fatal(err)
	}
	openToAll(t, path)
	checkRefusesOthers(t, l, path)
	if got := out.String(); !strings.Contains(got, "level=warning") || !strings.Contains(got, "uid=65534") {
		t.Errorf("no warning naming the refused uid; the log:\n%s", got)
	}
}

// TestHandedOverListenerRefusesOtherUsers: so does the listener a successor makes of a handed-over
// socket (the front's takeover).
func TestHandedOverListenerRefusesOtherUsers(t *testing.T) {
	path := filepath.Join(testutil.ShortTempDir(t, "eb-"), "cri.sock")
	old, b := sendListener(t, path, []byte("x"))
	_, files, err := ReceiveFiles(b, 64, 1)
	if err != nil || len(files) != 1 {
		t.Fatalf("%d files, %v", len(files), err)
	}
	succ, err := FileListener(context.Background(), files[0], path)
	files[0].Close()
	if err != nil {
		t.Fatal(err)
	}
	KeepSocketFile(old)
	_ = old.Close()
	if a := succ.Addr().String(); a != path {
		t.Errorf("the handed-over listener's address is %s, want %s", a, path)
	}
	openToAll(t, path)
	checkRefusesOthers(t, succ, path)
}

// TestListenAcceptsItsOwner: a listener of a process that is not root accepts its own user's
// connections (and root's), not another's.
func TestListenAcceptsItsOwner(t *testing.T) {
	path := filepath.Join(testutil.ShortTempDir(t, "eb-"), "cri.sock")
	l := listenT(t, path)
	l.(*unixListener).peers.euid = nobody // as if this process ran as nobody
	openToAll(t, path)
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	r := dialAs(t, nobody-1, path)
	if r.err != nil && !errors.Is(r.err, syscall.ECONNRESET) {
		t.Errorf("uid %d: not closed at once: %v", nobody-1, r.err)
	}
	go func() { _ = dialAs(t, nobody, path) }()
	c := endpointtest.Recv(t, accepted, "the owner's connection")
	if c == nil {
		t.Fatal("Accept failed")
	}
	defer c.Close()
	if cred, err := peerCred(c.(*net.UnixConn)); err != nil || cred.Uid != nobody {
		t.Errorf("accepted %+v, %v; want uid %d", cred, err, nobody)
	}
	_ = l.Close()
}

// TestListenSocketAppearsWithItsMode: the socket's name never shows a socket with another mode than
// its final one: watched with inotify, the name appears and its attributes never change afterwards
// (bind creates the file with the umask's mode; a chmod after it leaves a window in which others may
// connect through a directory that lets them). So too when the socket is bound in a private directory
// (where unshare is not allowed).
func TestListenSocketAppearsWithItsMode(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	t.Run("listen", func(t *testing.T) {
		checkAppearsWithMode(t, func(path string) (net.Listener, error) { return Listen(context.Background(), path) })
	})
	t.Run("private directory", func(t *testing.T) {
		checkAppearsWithMode(t, func(path string) (net.Listener, error) { return bindViaPrivateDir(path) })
	})
	if got := syscall.Umask(0o077); got != 0o077 {
		t.Errorf("the process's umask changed to %03o", got)
	}
}

func checkAppearsWithMode(t *testing.T, listen func(path string) (net.Listener, error)) {
	dir := testutil.ShortTempDir(t, "eb-")
	path := filepath.Join(dir, "cri.sock")
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	// IN_DELETE too: else two creations in a row would be merged into one event.
	if _, err := syscall.InotifyAddWatch(fd, dir, syscall.IN_CREATE|syscall.IN_MOVED_TO|syscall.IN_ATTRIB|syscall.IN_DELETE); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		l, err := listen(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := perm(t, path); got != SocketPerm {
			t.Errorf("socket mode %o, want %o", got, SocketPerm)
		}
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("the socket does not answer: %v", err)
		}
		_ = c.Close()
		_ = l.Close()
		_ = os.Remove(path)
	}
	var events []string
	buf := make([]byte, 64<<10)
	n, err := syscall.Read(fd, buf)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off+syscall.SizeofInotifyEvent <= n; {
		ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[off]))
		name := strings.TrimRight(string(buf[off+syscall.SizeofInotifyEvent:off+syscall.SizeofInotifyEvent+int(ev.Len)]), "\x00")
		off += syscall.SizeofInotifyEvent + int(ev.Len)
		if name != "cri.sock" {
			continue
		}
		switch {
		case ev.Mask&syscall.IN_ATTRIB != 0:
			events = append(events, "attrib")
		case ev.Mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0:
			events = append(events, "appears")
		}
	}
	if len(events) != 3 {
		t.Errorf("the socket's name: %v, want it to appear 3 times and its mode never to change", events)
	}
	for _, e := range events {
		if e != "appears" {
			t.Fatalf("the socket's name: %v: its attributes changed after it appeared", events)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left in %s: %v", dir, entries)
	}
}

// TestListenRefusesUntrustedDirectory: an existing socket directory that is a symbolic link, that others
// may write to, or that another user owns is refused with an error naming it and what is wrong, and
// nothing is created in it.
func TestListenRefusesUntrustedDirectory(t *testing.T) {
	root := testutil.ShortTempDir(t, "eb-")
	real := filepath.Join(root, "real")
	if err := os.Mkdir(real, 0o750); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		setup func(dir string) error
		want  string
	}{
		{"symlink", func(dir string) error { return os.Symlink(real, dir) }, "is a symbolic link"},
		{"world-writable", func(dir string) error { return mkdirMode(dir, 0o777) }, "writable by its group or by others (mode 0777)"},
		{"sticky world-writable", func(dir string) error { return mkdirMode(dir, 0o777|os.ModeSticky) }, "writable by its group or by others"},
		{"group-writable", func(dir string) error { return mkdirMode(dir, 0o770) }, "writable by its group or by others (mode 0770)"},
		{"another user's", func(dir string) error {
			if err := mkdirMode(dir, 0o750); err != nil {
				return err
			}
			return os.Chown(dir, nobody, nobody)
		}, "owned by uid 65534"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(root, strings.ReplaceAll(tc.name, " ", "-"))
			if err := tc.setup(dir); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "cri.sock")
			l, err := Listen(context.Background(), "unix://"+path)
			if err == nil {
				_ = l.Close()
				t.Fatal("Listen succeeded")
			}
			if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to name %s and say %q", err, dir, tc.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("left in %s: %v", dir, entries)
			}
		})
	}
}

// mkdirMode makes dir with exactly mode (the umask aside).
func mkdirMode(dir string, mode os.FileMode) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, mode)
}

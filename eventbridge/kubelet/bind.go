package kubelet

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
)

// A socket's file must have its final mode (SocketPerm) from the moment it exists: bind creates it
// with the process's umask applied, and a chmod after it leaves a moment in which others may connect.
// The umask cannot be changed for one call of a multi-threaded process (every thread shares it), but
// one thread can be given a umask of its own: it stops sharing its file system attributes with the
// others (unshare CLONE_FS) and is never used again (its goroutine ends locked to it). Where unshare is
// not allowed (a seccomp filter), the socket is bound in a private directory beside its path, given
// its mode there, and linked into place.

// bindFinalMode binds and listens on a unix socket at path whose file has the mode SocketPerm from the
// moment it exists.
func bindFinalMode(path string) (*net.UnixListener, error) {
	if len(path) >= maxUnixPath {
		return nil, fmt.Errorf("failed to listen on %s: the path is longer than a unix socket's %d bytes", path, maxUnixPath-1)
	}
	l, err := bindWithUmask(path)
	var unshareErr unshareError
	if errors.As(err, &unshareErr) {
		return bindViaPrivateDir(path)
	}
	return l, err
}

// maxUnixPath is the size of sun_path: a socket's path must be shorter.
const maxUnixPath = len(syscall.RawSockaddrUnix{}.Path)

// unshareError is the failure of unshare(CLONE_FS).
type unshareError struct{ error }

// bindWithUmask binds on a thread of its own whose umask leaves exactly SocketPerm. The listener is
// named by path, as any other (ss, /proc/net/unix show it).
func bindWithUmask(path string) (*net.UnixListener, error) {
	type result struct {
		l   *net.UnixListener
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Never unlocked: the thread, with its own umask, ends with this goroutine.
		runtime.LockOSThread()
		if err := syscall.Unshare(syscall.CLONE_FS); err != nil {
			done <- result{err: unshareError{err}}
			return
		}
		syscall.Umask(0o777 &^ int(SocketPerm))
		l, err := bindListen(path)
		done <- result{l, err}
	}()
	r := <-done
	return r.l, r.err
}

// bindListen makes a listening unix socket at path (with the calling thread's umask).
func bindListen(path string) (_ *net.UnixListener, err error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("failed to listen on %s: %w", path, os.NewSyscallError("socket", err))
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close() // net.FileListener works on a duplicate
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		return nil, fmt.Errorf("failed to listen on %s: %w", path, os.NewSyscallError("bind", err))
	}
	defer func() {
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	// The kernel bounds the backlog by net.core.somaxconn, as Go's own listeners are.
	if err := syscall.Listen(fd, 1<<16-1); err != nil {
		return nil, fmt.Errorf("failed to listen on %s: %w", path, os.NewSyscallError("listen", err))
	}
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("failed to listen on %s: %w", path, err)
	}
	return l.(*net.UnixListener), nil
}

// bindViaPrivateDir binds the socket in a private (0700) directory beside path, gives it its mode
// there, then links it to path (a link, not a rename: it fails if a file appeared at path meanwhile,
// as bind would). The kernel then names the listener by its temporary path (ss, /proc/net/unix).
func bindViaPrivateDir(path string) (_ *net.UnixListener, err error) {
	tmpDir, err := makePrivateDir(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("failed to listen on %s: cannot make a private directory beside it: %w", path, err)
	}
	defer os.Remove(tmpDir) // empty once the socket is linked to path and its temporary name removed
	tmp := filepath.Join(tmpDir, "s")
	if len(tmp) >= maxUnixPath {
		return nil, fmt.Errorf("failed to listen on %s: the path is too long for a unix socket (it is bound as %s first)", path, tmp)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("failed to listen on %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = l.Close() // removes tmp
		}
	}()
	if err := os.Chmod(tmp, SocketPerm); err != nil {
		return nil, fmt.Errorf("failed to set permissions of socket %s: %w", path, err)
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("refusing to listen on %s: another file appeared there meanwhile", path)
		}
		return nil, fmt.Errorf("failed to listen on %s: %w", path, err)
	}
	if err := os.Remove(tmp); err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("failed to listen on %s: %w", path, err)
	}
	return l, nil
}

// makePrivateDir makes a new 0700 directory in dir, with a short name (".s" and 4 hex digits): the
// temporary socket in it has a path no longer than one named 7 characters or more in dir.
func makePrivateDir(dir string) (string, error) {
	for try := 0; ; try++ {
		name := filepath.Join(dir, fmt.Sprintf(".s%04x", rand.IntN(1<<16)))
		err := os.Mkdir(name, 0o700)
		if err == nil || !errors.Is(err, fs.ErrExist) || try == 100 {
			return name, err
		}
	}
}

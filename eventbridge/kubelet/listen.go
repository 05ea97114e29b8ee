package kubelet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/log"

	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/trusteddir"
)

// Permissions of the CRI endpoint's socket and of the directory created for it.
const (
	SocketPerm    fs.FileMode = 0o660
	SocketDirPerm fs.FileMode = 0o750
)

// liveProbeTimeout bounds the dial that tells a live socket from a stale one.
const liveProbeTimeout = time.Second

// ListenConfig is how Listen listens.
type ListenConfig struct {
	// AllowTCP lets a tcp:// address be listened on (the allow-tcp-listen key). Without it a TCP address
	// is refused: whoever reaches it has containerd's whole API, unauthenticated.
	AllowTCP bool
}

// Listen is ListenConfig{}.Listen: a TCP address is refused.
func Listen(ctx context.Context, listen string) (net.Listener, error) {
	return ListenConfig{}.Listen(ctx, listen)
}

// Listen opens the listener of the CRI endpoint (or of another of pleg-nri's sockets). For a unix
// socket it creates the socket's directory (0750) if it is missing but its parent exists, refuses an
// existing one that others could change (trusteddir.Check), replaces a stale socket left by a previous
// run, refuses a path that is not a socket or on which another server answers, and makes the socket
// 0660 (it never exists with another mode, see bindFinalMode). The listener accepts only root's and
// this process's user's connections (see unixListener.AcceptUnix); closing it removes the socket file,
// unless something else has replaced it meanwhile. A TCP address is refused unless lc.AllowTCP: it gets
// no authentication at all.
func (lc ListenConfig) Listen(ctx context.Context, listen string) (net.Listener, error) {
	network, address, err := dial.ParseEndpoint(listen)
	if err != nil {
		return nil, err
	}
	if network == "tcp" {
		if !lc.AllowTCP {
			return nil, fmt.Errorf("refusing to listen on %s: a TCP endpoint has no authentication and serves containerd's whole API "+
				"(anyone who connects is root on the node); set allow-tcp-listen to true to allow it anyway", listen)
		}
		l, err := net.Listen("tcp", address)
		if err != nil {
			return nil, fmt.Errorf("failed to listen on %s: %w", listen, err)
		}
		// Loopback too: every local user, and every container in the host's network namespace, reaches it.
		log.G(ctx).WithField("address", l.Addr().String()).WithField("loopback", isLoopbackHost(address)).
			Warn("INSECURE: the CRI endpoint listens on TCP without authentication: whoever can connect to it has containerd's whole API, which is root on the node (allow-tcp-listen)")
		return l, nil
	}
	return listenUnix(ctx, address)
}

// isLoopbackHost says whether a host:port names a loopback address.
func isLoopbackHost(address string) bool {
	host, _, _ := net.SplitHostPort(address)
	return isLoopback(host)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func listenUnix(ctx context.Context, path string) (_ net.Listener, err error) {
	dir := filepath.Dir(path)
	_, err = os.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// Only the socket's own directory is created: a missing parent is rather a wrong path, which
		// must not leave a trail of directories behind.
		if err := os.Mkdir(dir, SocketDirPerm); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("cannot create socket directory %s: its parent %s does not exist", dir, filepath.Dir(dir))
			}
			return nil, fmt.Errorf("failed to create socket directory %s: %w", dir, err)
		}
		// A directory made here and left empty by a failure below is removed again.
		defer func() {
			if err != nil {
				_ = os.Remove(dir)
			}
		}()
		// Mkdir applies the umask: make the directory exactly 0750.
		if err := os.Chmod(dir, SocketDirPerm); err != nil {
			return nil, fmt.Errorf("failed to set permissions of socket directory %s: %w", dir, err)
		}
		log.G(ctx).WithField("dir", dir).Debug("created socket directory")
	case err != nil:
		return nil, fmt.Errorf("failed to stat socket directory %s: %w", dir, err)
	default:
		// A directory found is used only if nobody but root and this user can change what is in it.
		if err := trusteddir.Check(dir); err != nil {
			return nil, fmt.Errorf("socket directory: %w", err)
		}
	}

	if err := removeStaleSocket(ctx, path); err != nil {
		return nil, err
	}
	l, err := bindFinalMode(path)
	if err != nil {
		return nil, err
	}
	// Closing removes the socket file only if it is still this one (see unixListener.Close).
	l.SetUnlinkOnClose(false)
	ul := newUnixListener(ctx, l, path)
	if ul.file, err = os.Lstat(path); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("failed to stat socket %s: %w", path, err)
	}
	return ul, nil
}

// unixListener removes its socket file when it is closed, but only if the path still names the socket
// it created: a file put in its place meanwhile (another server's socket, anything) is left alone. It
// accepts connections of root and of its owner only (see AcceptUnix).
type unixListener struct {
	*net.UnixListener
	path string
	// file is the socket file as created.
	file fs.FileInfo
	// handedOver is set when the socket was handed to another process (see KeepSocketFile): Close then
	// leaves the file, which the other process serves.
	handedOver atomic.Bool
	// peers checks and counts the connecting peers.
	peers *peerCheck
}

func newUnixListener(ctx context.Context, l *net.UnixListener, path string) *unixListener {
	return &unixListener{UnixListener: l, path: path, peers: newPeerCheck(ctx, path)}
}

// Addr is the socket's path (a socket bound under a temporary name, see bindViaPrivateDir, is named by
// that one in the kernel).
func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

// Close closes the listener and removes its socket file if it is still there.
func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	if l.handedOver.Load() {
		return err
	}
	if fi, serr := os.Lstat(l.path); serr == nil && os.SameFile(fi, l.file) {
		_ = os.Remove(l.path)
	}
	return err
}

// removeStaleSocket removes a socket file at path that no server answers on. It refuses anything that
// is not a socket and a socket with a live server.
func removeStaleSocket(ctx context.Context, path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("failed to stat %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("refusing to listen on %s: it exists and is not a socket but %s", path, fileKind(fi.Mode()))
	}
	conn, err := net.DialTimeout("unix", path, liveProbeTimeout)
	if err == nil {
		_ = conn.Close()
		return fmt.Errorf("refusing to listen on %s: another server is listening on it", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("refusing to listen on %s: cannot tell whether a server is listening on it: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("failed to remove stale socket %s: %w", path, err)
	}
	log.G(ctx).WithField("socket", path).Info("removed stale socket")
	return nil
}

// fileKind names the type of a file for an error message.
func fileKind(m fs.FileMode) string {
	switch t := m.Type(); {
	case t == 0:
		return "a regular file"
	case t&fs.ModeDir != 0:
		return "a directory"
	case t&fs.ModeSymlink != 0:
		return "a symbolic link"
	case t&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case t&fs.ModeDevice != 0:
		return "a device"
	default:
		return "a file of type " + t.String()
	}
}

package kubelet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"syscall"
)

// A listening socket is handed from one process to its successor over a unix connection, as an
// SCM_RIGHTS message: both processes then hold the same socket, so that connections keep being
// accepted while one stops and the other starts, and the socket file never disappears.

// ListenerFile returns a duplicate of the listener's socket, to hand to another process.
func ListenerFile(l net.Listener) (*os.File, error) {
	switch l := l.(type) {
	case *unixListener:
		return l.File()
	case *net.UnixListener:
		return l.File()
	case *net.TCPListener:
		return l.File()
	}
	return nil, fmt.Errorf("cannot hand over a listener of type %T", l)
}

// KeepSocketFile makes closing a listener opened by Listen leave its socket file in place: call it once
// the socket was handed over (the successor serves the same file).
func KeepSocketFile(l net.Listener) {
	if ul, ok := l.(*unixListener); ok {
		ul.handedOver.Store(true)
	}
}

// FileListener makes a listener of a socket handed over by ListenerFile, whose file is at path for a
// unix socket (the kernel names the socket by the path it was bound at, which may be a temporary one,
// see bindFinalMode). A unix socket's listener then behaves as one from Listen: it accepts only root
// and this process's user, and closing it removes the socket file if the path still names that socket.
func FileListener(ctx context.Context, f *os.File, path string) (net.Listener, error) {
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("failed to use the handed-over socket: %w", err)
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		return l, nil
	}
	ul.SetUnlinkOnClose(false)
	fi, err := os.Lstat(path)
	if err != nil {
		_ = ul.Close()
		return nil, fmt.Errorf("failed to stat the handed-over socket %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		_ = ul.Close()
		return nil, fmt.Errorf("the handed-over socket's path %s is not a socket but %s", path, fileKind(fi.Mode()))
	}
	l2 := newUnixListener(ctx, ul, path)
	l2.file = fi
	return l2, nil
}

// SendFiles sends msg and the files' descriptors over conn, in one message. The descriptors are read
// without os.File.Fd, which would put each socket, shared with the listener it duplicates, in blocking
// mode: a listener whose handoff then fails serves on, and an Accept in blocking mode could not be
// interrupted by its Close (a front that never stops).
func SendFiles(conn *net.UnixConn, msg []byte, files ...*os.File) error {
	fds := make([]int, len(files))
	for i, f := range files {
		rc, err := f.SyscallConn()
		if err != nil {
			return fmt.Errorf("failed to send descriptors: %w", err)
		}
		if err := rc.Control(func(fd uintptr) { fds[i] = int(fd) }); err != nil {
			return fmt.Errorf("failed to send descriptors: %w", err)
		}
	}
	if len(msg) == 0 {
		msg = []byte{0}
	}
	n, oobn, err := conn.WriteMsgUnix(msg, syscall.UnixRights(fds...), nil)
	if err != nil {
		return fmt.Errorf("failed to send descriptors: %w", err)
	}
	if n != len(msg) || oobn == 0 && len(fds) > 0 {
		return errors.New("failed to send descriptors: short write")
	}
	return nil
}

// ReceiveFiles receives one message of at most maxMsg bytes and the descriptors sent with it (at most
// maxFiles) from conn.
func ReceiveFiles(conn *net.UnixConn, maxMsg, maxFiles int) ([]byte, []*os.File, error) {
	buf := make([]byte, maxMsg)
	oob := make([]byte, syscall.CmsgSpace(maxFiles*4))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to receive descriptors: %w", err)
	}
	var files []*os.File
	if oobn > 0 {
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, nil, fmt.Errorf("failed to parse the control message: %w", err)
		}
		for _, m := range msgs {
			fds, err := syscall.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				syscall.CloseOnExec(fd)
				files = append(files, os.NewFile(uintptr(fd), "handed-over"))
			}
		}
	}
	if flags&syscall.MSG_CTRUNC != 0 {
		for _, f := range files {
			_ = f.Close()
		}
		return nil, nil, errors.New("failed to receive descriptors: too many sent")
	}
	return buf[:n], files, nil
}

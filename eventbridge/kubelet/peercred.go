package kubelet

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/log"
)

// Every unix socket of pleg-nri (the kubelet's endpoint, the core's event socket, the front's control
// socket) is as powerful as containerd's: a call on it is a call to containerd, or stops the front.
// The file's mode keeps others out, but a mode can be loosened by hand or by a mistake, so the
// listener also checks each peer's credentials (SO_PEERCRED) as it accepts: root and this process's
// user are let in, anyone else is disconnected at once.

// refusedLogEvery bounds the warnings about refused peers: the first one, then at most one a minute
// (the others are logged at debug level).
const refusedLogEvery = time.Minute

// peerCheck decides which peers a listener accepts, and logs and counts the others.
type peerCheck struct {
	ctx context.Context
	// path is the socket's, for the log.
	path string
	// euid is this process's user, the socket's owner: it and root are accepted.
	euid int
	// refused is called for each connection refused, when set (see OnRefusedPeer).
	refused atomic.Pointer[func()]
	// mu guards lastWarn and since.
	mu       sync.Mutex
	lastWarn time.Time
	// since counts the connections refused since the last warning.
	since int
}

func newPeerCheck(ctx context.Context, path string) *peerCheck {
	return &peerCheck{ctx: context.WithoutCancel(ctx), path: path, euid: os.Geteuid()}
}

// allowed says whether c's peer may use the socket; when not, it logs and counts the refusal.
func (p *peerCheck) allowed(c *net.UnixConn) bool {
	cred, err := peerCred(c)
	if err == nil && (cred.Uid == 0 || int(cred.Uid) == p.euid) {
		return true
	}
	if f := p.refused.Load(); f != nil {
		(*f)()
	}
	entry := log.G(p.ctx).WithField("socket", p.path)
	if err != nil {
		entry = entry.WithError(err)
	} else {
		entry = entry.WithField("uid", cred.Uid).WithField("pid", cred.Pid)
	}
	p.mu.Lock()
	now := time.Now()
	warn := p.lastWarn.IsZero() || now.Sub(p.lastWarn) >= refusedLogEvery
	p.since++
	since := p.since
	if warn {
		p.lastWarn, p.since = now, 0
	}
	p.mu.Unlock()
	if warn {
		entry.WithField("refused-since-last-warning", since).
			Warn("refused a connection from a process that is neither root nor pleg-nri's user (further ones within a minute are logged at debug level)")
	} else {
		entry.Debug("refused a connection from a process that is neither root nor pleg-nri's user")
	}
	return false
}

// peerCred returns the credentials the peer of c connected with.
func peerCred(c *net.UnixConn) (*syscall.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *syscall.Ucred
	var credErr error
	if err := rc.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if credErr != nil {
		return nil, credErr
	}
	if cred == nil {
		return nil, errors.New("no peer credentials")
	}
	return cred, nil
}

// AcceptUnix accepts the next connection of root or of the socket's owner; others are closed.
func (l *unixListener) AcceptUnix() (*net.UnixConn, error) {
	for {
		c, err := l.UnixListener.AcceptUnix()
		if err != nil {
			return nil, err
		}
		if l.peers.allowed(c) {
			return c, nil
		}
		_ = c.Close()
	}
}

// Accept is AcceptUnix: it returns a *net.UnixConn.
func (l *unixListener) Accept() (net.Conn, error) {
	c, err := l.AcceptUnix()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// OnRefusedPeer makes a listener from Listen or FileListener call refused for every connection it
// refuses (a metric); other listeners are left alone.
func OnRefusedPeer(l net.Listener, refused func()) {
	if ul, ok := l.(*unixListener); ok {
		ul.peers.refused.Store(&refused)
	}
}

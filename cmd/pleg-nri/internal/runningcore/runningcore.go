// Package runningcore is the core that serves a run directory, as a new instance finds it: what it says
// of itself (core.json: WriteInfo, ReadInfo), which process it is (PeerPID), its and its front's
// versions (WriteVersions, RegisterBuildInfo), a second core's refusal to start beside it
// (RefuseSecond), and a new pre-registered instance's takeover from it (TakeOver).
//
// A pre-registered core that outlived containerd (containerd 2.4 does not stop its pre-registered
// plugins) reconnects through the NRI socket and goes on serving the run directory. The instance the
// next containerd launches decides here whether to leave it the work (it is the same binary with the
// same configuration) or to take over from it (an upgrade, or a changed configuration: else neither
// would ever take effect).
//
// Which process serves is read from the kernel, not from a file: the peer of a connection to the core's
// socket (SO_PEERCRED). That process is taken over only if it runs this install's executable (the path
// of this process's binary, a replaced binary showing as "PATH (deleted)"); a core of another install
// (the host service's /usr/local/bin/pleg-nri, say) is left alone and this process stops with an
// error. What the serving core runs with is in core.json of the run directory, which every core writes
// once it serves and which counts only when it names that pid. A pid file alone would not do: one left
// by a SIGKILLed core may name a pid the kernel has given to another process since. The old core is
// signalled through a pidfd opened before it is inspected, so the signal reaches the process inspected
// even if the pid were reused in between.
package runningcore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/eventbridge/front"
)

// InfoName is the file of the run directory where a serving core says what it is.
const InfoName = "core.json"

// Bounds of a takeover. containerd waits for the new plugin's Synchronize, which waits for its core, 2
// s after its Configure was answered, itself at most 2 s after it was sent (NRI's request timeout), and
// stops a plugin that does not answer in time: the old core must be gone well before. A core stops
// within milliseconds of a SIGTERM (its event streams end at once, its last checkpoint is one write),
// unless calls through its socket are still running (up to coreStopTimeout); after takeoverTermWait it
// is killed, which costs at most checkpoint-interval of events sent again (at-least-once).
const (
	takeoverTermWait = 1500 * time.Millisecond
	takeoverKillWait = time.Second
)

// Info is what a serving core says about itself in core.json.
type Info struct {
	PID     int    `json:"pid"`
	Version string `json:"version"`
	// Executable is the core's binary.
	Executable string `json:"executable"`
	// Config is the core's effective configuration.
	Config config.Config `json:"config"`
}

// WriteInfo writes info as runDir's core.json (atomically); remove removes it if it still names
// info.PID.
func WriteInfo(runDir string, info Info) (remove func(), err error) {
	data, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(runDir, InfoName)
	tmp := path + ".new"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return nil, err
	}
	return func() {
		if cur, err := ReadInfo(runDir); err == nil && cur.PID == info.PID {
			_ = os.Remove(path)
		}
	}, nil
}

// ReadInfo reads runDir's core.json.
func ReadInfo(runDir string) (Info, error) {
	var info Info
	data, err := os.ReadFile(filepath.Join(runDir, InfoName))
	if err != nil {
		return info, err
	}
	if err := json.Unmarshal(data, &info); err != nil {
		return info, fmt.Errorf("%s: %w", InfoName, err)
	}
	return info, nil
}

// peerCore is the process that serves the core's socket, as /proc and core.json show it.
type peerCore struct {
	PID int
	// Executable is its binary's path (without the " (deleted)" of a replaced one).
	Executable string
	// SameBinary says its binary is the very file this process runs.
	SameBinary bool
	// Info is core.json, when it names PID.
	Info *Info
}

// takeoverAction is what a new pre-registered instance does about the core that serves its run
// directory.
type takeoverAction int

const (
	leaveIt  takeoverAction = iota // the same core: it goes on, this process exits
	takeOver                       // it stops, this process serves
	refuse                         // not this install's core: this process exits with an error
)

// decideTakeover says what self (this process, as it would write core.json) does about peer, and why.
func decideTakeover(self Info, peer peerCore) (takeoverAction, string) {
	switch {
	case peer.Executable != self.Executable:
		return refuse, fmt.Sprintf("the run directory's core (pid %d) runs %q, not this install's %q: stop it first (another install of pleg-nri, or not pleg-nri)",
			peer.PID, peer.Executable, self.Executable)
	case !peer.SameBinary:
		return takeOver, "its binary was replaced (an upgrade)"
	case peer.Info == nil:
		return takeOver, "it does not say its configuration (no " + InfoName + " naming it)"
	case peer.Info.Version != self.Version:
		return takeOver, fmt.Sprintf("it runs version %s, this is %s", peer.Info.Version, self.Version)
	}
	if changed := config.ChangedKeys(peer.Info.Config, self.Config); len(changed) > 0 {
		slices.Sort(changed)
		return takeOver, fmt.Sprintf("its configuration differs in %s", strings.Join(changed, ", "))
	}
	return leaveIt, "the same binary and configuration"
}

// coreProcess is a process that can be signalled and waited for.
type coreProcess interface {
	Signal(syscall.Signal) error
	// Wait waits up to timeout (or ctx) for the process to exit and says whether it did.
	Wait(ctx context.Context, timeout time.Duration) bool
	Close()
}

// takeover finds the core that serves a run directory and decides what a new pre-registered instance
// does about it; what it reads the system with is injected (the tests' fakes).
type takeover struct {
	runDir string
	self   Info
	// peerPID is the pid of the process that serves the socket at path; an error wrapping
	// fs.ErrNotExist or ECONNREFUSED says none does.
	peerPID func(path string) (int, error)
	// open opens the process pid, before it is inspected.
	open    func(pid int) (coreProcess, error)
	inspect func(pid int) (peerCore, error)
	// termWait and killWait bound the waits for the old core after its SIGTERM and after its SIGKILL.
	termWait, killWait time.Duration
}

// run decides and, when it must, stops the old core: serve says this process is to serve the run
// directory (nobody served it, or the old core is gone). serve false with no error: leave the work to
// the old core, or ctx ended.
func (t takeover) run(ctx context.Context) (serve bool, err error) {
	sock := filepath.Join(t.runDir, front.CoreSocketName)
	pid, err := t.peerPID(sock)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("cannot tell which process serves %s: %w", sock, err)
	}
	if pid <= 0 || pid == t.self.PID {
		return false, fmt.Errorf("cannot tell which process serves %s (peer pid %d)", sock, pid)
	}
	proc, err := t.open(pid)
	if errors.Is(err, syscall.ESRCH) {
		return true, nil // it just exited
	}
	if err != nil {
		return false, fmt.Errorf("the core serving %s (pid %d): %w", sock, pid, err)
	}
	defer proc.Close()
	peer, err := t.inspect(pid)
	if err != nil {
		return false, fmt.Errorf("the core serving %s (pid %d): %w", sock, pid, err)
	}
	action, why := decideTakeover(t.self, peer)
	entry := log.G(ctx).WithField("run-dir", t.runDir).WithField("pid", pid).WithField("reason", why)
	if peer.Info != nil {
		entry = entry.WithField("core-version", peer.Info.Version)
	}
	switch action {
	case leaveIt:
		entry.Info("a pleg-nri core already serves this run directory: leaving it the work and exiting")
		return false, nil
	case refuse:
		return false, errors.New(why)
	}
	entry.Warn("a pleg-nri core launched before serves this run directory: taking over from it")
	if err := proc.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return false, fmt.Errorf("failed to stop the old core (pid %d): %w", pid, err)
	}
	if proc.Wait(ctx, t.termWait) {
		return ctx.Err() == nil, nil
	}
	if ctx.Err() != nil {
		return false, nil
	}
	entry.WithField("waited", t.termWait).Warn("the old core did not stop after SIGTERM: killing it (its last events may be sent again)")
	if err := proc.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return false, fmt.Errorf("failed to kill the old core (pid %d): %w", pid, err)
	}
	if !proc.Wait(ctx, t.killWait) {
		return false, fmt.Errorf("the old core (pid %d) did not exit after SIGKILL", pid)
	}
	return ctx.Err() == nil, nil
}

// newTakeover is the takeover of this process, which would serve runDir with cfg, on the real system.
func newTakeover(cfg config.Config, version string) (takeover, error) {
	exe, err := os.Executable()
	if err != nil {
		return takeover{}, fmt.Errorf("cannot find this process's binary: %w", err)
	}
	runDir := cfg.RunDirectory()
	return takeover{runDir: runDir, self: Info{PID: os.Getpid(), Version: version, Executable: exe, Config: cfg},
		peerPID: PeerPID, open: openProcess,
		inspect:  func(pid int) (peerCore, error) { return inspectPeer("/proc", runDir, pid) },
		termWait: takeoverTermWait, killWait: takeoverKillWait}, nil
}

// RefuseSecond returns an error, naming the running core when its core.json says which it is, when a
// core already serves runDir's event socket. A second core started by hand beside a running one must
// not touch the running one's front: it would replace it (ending the kubelet's stream) before finding
// the core's socket taken.
func RefuseSecond(runDir string) error {
	c, err := net.DialTimeout("unix", filepath.Join(runDir, front.CoreSocketName), time.Second)
	if err != nil {
		return nil // none (or a stale socket, which the core's listen replaces)
	}
	_ = c.Close()
	who := ""
	if info, err := ReadInfo(runDir); err == nil && info.PID > 0 {
		who = fmt.Sprintf(" (pid %d, version %s)", info.PID, info.Version)
	}
	return fmt.Errorf("config key \"run-dir\": a pleg-nri core already serves %s%s: stop it first, or give this one another run-dir and listen", runDir, who)
}

// PeerPID connects to the unix socket at path and returns the pid of the process that serves
// it, as the kernel records it (SO_PEERCRED).
func PeerPID(path string) (int, error) {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	return int(cred.Pid), nil
}

// inspectPeer reads what procRoot (/proc) and runDir's core.json say of the process pid.
func inspectPeer(procRoot, runDir string, pid int) (peerCore, error) {
	exeLink := filepath.Join(procRoot, fmt.Sprint(pid), "exe")
	exe, err := os.Readlink(exeLink)
	if err != nil {
		return peerCore{}, fmt.Errorf("cannot read its executable: %w", err)
	}
	peer := peerCore{PID: pid, Executable: strings.TrimSuffix(exe, " (deleted)")}
	// The links lead to the files the processes run, a deleted one included.
	theirs, err1 := os.Stat(exeLink)
	ours, err2 := os.Stat(filepath.Join(procRoot, "self", "exe"))
	peer.SameBinary = err1 == nil && err2 == nil && os.SameFile(theirs, ours)
	if info, err := ReadInfo(runDir); err == nil && info.PID == pid {
		peer.Info = &info
	}
	return peer, nil
}

// pidfdProcess is a process opened as a pidfd: signals and waits reach the process opened, whatever
// happens to its pid.
type pidfdProcess struct{ fd int }

// openProcess opens the process pid.
func openProcess(pid int) (coreProcess, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open: %w", err)
	}
	return pidfdProcess{fd}, nil
}

func (p pidfdProcess) Signal(sig syscall.Signal) error {
	return unix.PidfdSendSignal(p.fd, sig, nil, 0)
}

// Wait polls the pidfd, which becomes readable when the process exits.
func (p pidfdProcess) Wait(ctx context.Context, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 50)
		if err == nil && n > 0 {
			return true
		}
		if err != nil && !errors.Is(err, syscall.EINTR) {
			return false
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return false
		}
	}
}

func (p pidfdProcess) Close() { _ = unix.Close(p.fd) }

// TakeOver is a new pre-registered instance's takeover of the core that serves cfg's run directory: this
// process, of version, would serve it with cfg. serve says it is to serve (nobody served it, or the old
// core is gone); serve false with no error: leave the work to the old core (the same binary, version and
// configuration), or ctx ended. A core of another executable is never touched: an error.
func TakeOver(ctx context.Context, cfg config.Config, version string) (serve bool, err error) {
	t, err := newTakeover(cfg, version)
	if err != nil {
		return false, err
	}
	return t.run(ctx)
}

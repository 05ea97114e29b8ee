package front

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/log"
)

// Ensure makes sure a front compatible with fc serves fc.Listen: it leaves a compatible one alone,
// replaces an incompatible one (taking its socket over when it serves the same address), and spawns one
// when none runs. preRegistered says the caller is a plugin containerd started (see spawn).
func Ensure(ctx context.Context, fc Config, preRegistered bool) error {
	runDir := fc.RunDir
	info, err := Query(runDir, "info")
	if err == nil {
		switch {
		case info.compatible(fc):
			log.G(ctx).WithField("pid", info.PID).WithField("front-version", info.Version).Info("a compatible front serves the CRI endpoint: keeping it")
			return nil
		case info.Listen == fc.Listen:
			log.G(ctx).WithField("pid", info.PID).WithField("front-version", info.Version).WithField("front-protocol", info.Protocol).
				WithField("front-revision", info.Revision).WithField("revision", Revision).
				Warn("the running front is not compatible (another front code, protocol or setting): replacing it (its open event streams end once)")
			fc.Takeover = true
		default:
			log.G(ctx).WithField("pid", info.PID).WithField("front-listen", info.Listen).
				Warn("the running front serves another address: stopping it")
			if err := Stop(runDir); err != nil {
				return err
			}
		}
	}
	return spawn(ctx, fc, preRegistered, nil)
}

// spawn starts a front with this binary, detached: in its own session, so that neither a signal to
// the daemon's process group nor the end of the process that launched the daemon (a service manager's
// restart, containerd stopping its pre-registered plugins) reaches it. It waits until the front answers.
// A listener, when not nil, is the kubelet's listening socket the new front serves (as its descriptor
// 3, --listen-fd), instead of opening the socket itself.
func spawn(ctx context.Context, fc Config, preRegistered bool, listener *os.File) error {
	var startOut *tailWriter
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("cannot find the pleg-nri binary to start the front: %w", err)
	}
	if listener != nil {
		fc.ListenFD = 3 // the first of ExtraFiles
	}
	cmd := exec.Command(exe, fc.Args()...)
	cmd.Dir = "/"
	if listener != nil {
		cmd.ExtraFiles = []*os.File{listener}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	for _, kv := range os.Environ() {
		// Not the NRI plugin's variables: the front is no plugin; nor systemd's notify socket: the unit's
		// state is the daemon's to tell.
		if !strings.HasPrefix(kv, "NRI_") && !strings.HasPrefix(kv, "NOTIFY_SOCKET=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	// Its output: until it serves, a pipe read here, so that its startup errors are the daemon's; then
	// the journal when the daemon runs under systemd, else a file of the run directory (the daemon's
	// stderr may be a pipe that ends with it, or nothing, as for a pre-registered plugin).
	if os.Getenv("JOURNAL_STREAM") != "" && !preRegistered {
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	} else {
		fc.LogFile = filepath.Join(fc.RunDir, logName)
		cmd.Args = append(cmd.Args, "--log-file", fc.LogFile)
		out := &tailWriter{}
		cmd.Stdout, cmd.Stderr = out, out
		startOut = out
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("failed to start the front: %w", err)
	}
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	// Reap it if it exits while the daemon runs; after the daemon exits, init does.
	go func() { exited <- cmd.Wait() }()
	startErr := func(err error) error {
		if startOut != nil {
			if last := startOut.lastLine(); last != "" {
				return fmt.Errorf("%s (the front: %v)", last, err)
			}
		}
		return err
	}
	deadline := time.Now().Add(startTimeout)
	for {
		info, err := Query(fc.RunDir, "info")
		if err == nil && info.PID == pid {
			log.G(ctx).WithField("pid", pid).WithField("takeover", fc.Takeover).Info("started the front")
			return nil
		}
		select {
		case err := <-exited:
			return startErr(err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(spawnPoll):
		}
		if time.Now().After(deadline) {
			return startErr(fmt.Errorf("the front (pid %d) did not answer within %s", pid, startTimeout))
		}
	}
}

// spawnPoll is how often spawn asks a new front whether it serves yet: a front serves a few ms after
// its start, and the kubelet's calls wait for it while a dead one is replaced.
const spawnPoll = 5 * time.Millisecond

// Stop asks the front in runDir to stop and waits until its control socket is gone.
func Stop(runDir string) error {
	info, err := Query(runDir, "stop")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
		return fmt.Errorf("failed to stop the front: %w", err)
	}
	deadline := time.Now().Add(2 * StopTimeout)
	for time.Now().Before(deadline) {
		if syscall.Kill(info.PID, 0) != nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("the front (pid %d) did not stop", info.PID)
}

// tailWriter keeps the last line written to it.
type tailWriter struct {
	// mu guards buf.
	mu  sync.Mutex
	buf []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if len(w.buf) > 64<<10 {
		w.buf = w.buf[len(w.buf)-32<<10:]
	}
	return len(p), nil
}

// lastLine returns the last non-empty line written, without the program's name prefix.
func (w *tailWriter) lastLine() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(w.buf)), "\n")
	last := lines[len(lines)-1]
	if i := strings.Index(last, ": "); i > 0 && !strings.Contains(last[:i], " ") {
		last = last[i+2:]
	}
	return last
}

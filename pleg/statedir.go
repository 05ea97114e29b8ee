package pleg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/log"

	"github.com/pleg-nri/pleg-nri/internal/trusteddir"
)

// StateLockName is the lock file of the state directory.
const StateLockName = "lock"

// DefaultStateLockWait bounds how long a core waits for the state directory's lock: longer than a core takes to
// stop (its event socket's coreStopTimeout, then its last checkpoint), so that a core started while the
// previous one still stops (a service manager's restart, containerd launching a pre-registered plugin
// again) goes on after it, and short enough that a second core beside a running one says so soon.
const DefaultStateLockWait = 10 * time.Second

// stateLockPoll is how often the lock is tried while another core holds it.
const stateLockPoll = 50 * time.Millisecond

// LockStateDir makes the state directory (0700) if needed, checks that it is a writable directory that
// only root or this user can change (trusteddir.Check), and takes its lock (an exclusive flock on
// <dir>/lock, never through a symbolic link, which holds the owner's pid), waiting up to wait while
// another process holds it. Two cores on one state directory would read and write one checkpoint,
// each over the other's: the second gets an error naming the first. unlock releases the lock; the
// kernel releases it too when the process ends, however it ends.
func LockStateDir(ctx context.Context, dir string, wait time.Duration) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cannot create %s: %w", dir, err)
	}
	// Another user who could change what is in it could make pleg-nri write (as root) where they like.
	if err := trusteddir.Check(dir); err != nil {
		return nil, err
	}
	if err := syscall.Access(dir, 2 /* W_OK */); err != nil {
		return nil, fmt.Errorf("%s is not writable: %w", dir, err)
	}
	path := filepath.Join(dir, StateLockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cannot open the state directory's lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	for logged := false; ; {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("cannot lock %s: %w", path, err)
		}
		holder := lockHolder(path)
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("%s is in use by another pleg-nri core (%s) after waiting %s: two cores cannot share one checkpoint (give each its own state-dir)", dir, holder, wait)
		}
		if !logged {
			log.G(ctx).WithField("state-dir", dir).WithField("holder", holder).
				Warn("the state directory is locked by another pleg-nri core: waiting for it to stop")
			logged = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(stateLockPoll):
		}
	}
	// The pid is for people and error messages only: the flock is the lock.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { _ = f.Close() }, nil
}

// lockHolder names the process that holds the lock at path, as its file says.
func lockHolder(path string) string {
	b, err := os.ReadFile(path)
	if pid := strings.TrimSpace(string(b)); err == nil && pid != "" {
		return "pid " + pid
	}
	return "pid unknown"
}

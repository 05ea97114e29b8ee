package testutil

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// processPoll is how often WaitGone looks at the process.
const processPoll = 20 * time.Millisecond

// Alive says whether pid is a live process: it is in /proc and it is not a zombie (or dead).
func Alive(pid int) bool {
	state, ok := procState("/proc/" + strconv.Itoa(pid) + "/stat")
	return ok && state != 'Z' && state != 'X'
}

// Stopped says whether every thread of pid is stopped by a signal (SIGSTOP): a process signalled
// goes on running in its other threads for a moment.
func Stopped(pid int) bool {
	stats, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/stat")
	if err != nil || len(stats) == 0 {
		return false
	}
	for _, f := range stats {
		if state, ok := procState(f); !ok || state != 'T' {
			return false
		}
	}
	return true
}

// procState is the state letter in a /proc stat file; ok is false if the file cannot be read.
func procState(stat string) (state byte, ok bool) {
	data, err := os.ReadFile(stat)
	if err != nil {
		return 0, false
	}
	// The state follows the command name in parentheses, which may itself hold parentheses.
	if i := bytes.LastIndexByte(data, ')'); i > 0 && i+2 < len(data) {
		return data[i+2], true
	}
	return 0, true
}

// WaitGone waits until pid is no longer Alive, for at most timeout or until ctx ends.
func WaitGone(ctx context.Context, pid int, timeout time.Duration) error {
	return PollEvery(ctx, timeout, processPoll, fmt.Sprintf("process %d to end", pid), func() (bool, error) {
		return !Alive(pid), nil
	})
}

// WatchPresent checks every millisecond, until the returned function is called, that every path
// exists (a socket file that must never go away, say); that function returns the first miss.
func WatchPresent(paths ...string) (stop func() error) {
	done, missing := make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			for _, p := range paths {
				if _, err := os.Lstat(p); err != nil {
					missing <- err
					return
				}
			}
			select {
			case <-done:
				missing <- nil
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return func() error {
		close(done)
		return <-missing
	}
}

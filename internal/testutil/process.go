package testutil

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// processPoll is how often WaitGone looks at the process.
const processPoll = 20 * time.Millisecond

// Alive says whether pid is a live process: it is in /proc and it is not a zombie (or dead).
func Alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses, which may itself hold parentheses.
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i > 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
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

package front

import (
	"fmt"
	"os"
	"sync"
	"syscall"
)

// maxLogSize bounds the front's log file: a write that would take it past this renames it to
// <file>.1 (replacing the previous one) and starts a new one, so that the two hold at most twice this
// (the run directory is usually a tmpfs: memory).
const maxLogSize = 10 << 20

// logFile is the front's log file, when it has no journal: the process's stdout and stderr are the
// file (so that what the Go runtime writes on a crash lands in it too) and the front's logger writes
// through Write, which rotates the file once it is full.
//
// NOTE: a pipe read by a goroutine would count every byte, but the trace of a crash would die in the
// pipe with the goroutine, and a slow reader would block every log call. Here the logger's writes are
// counted and rotate the file, and stdout and stderr follow it (dup3); what else writes to them (a
// crash, which ends the process) is not counted and makes the file larger by that much.
type logFile struct {
	path string
	// max is the size the file is rotated at.
	max int64
	// fds are the descriptors made the file at each (re)open: stdout and stderr.
	fds []int

	// mu guards f and size, and orders the writes and the rotation.
	mu sync.Mutex
	f  *os.File
	// size is the file's size, as counted since it was opened.
	size int64
}

// openLogFile opens path (appended to, 0600) and makes fds the file.
func openLogFile(path string, max int64, fds ...int) (*logFile, error) {
	l := &logFile{path: path, max: max, fds: fds}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *logFile) open() error {
	f, err := openLog(l.path)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	for _, fd := range l.fds {
		if err := syscall.Dup3(int(f.Fd()), fd, 0); err != nil {
			f.Close()
			return fmt.Errorf("failed to redirect fd %d to %s: %w", fd, l.path, err)
		}
	}
	if l.f != nil {
		_ = l.f.Close()
	}
	l.f, l.size = f, fi.Size()
	return nil
}

// Write appends p to the file, rotating it first if p would take it past max (a file opened larger
// is rotated at the first write).
func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size > 0 && l.size+int64(len(p)) > l.max {
		l.rotate()
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, err
}

// rotate renames the file to path.1 and opens a new one; if it cannot, it truncates the file, which
// stays bounded. It writes what failed into the file itself: it runs inside the logger.
func (l *logFile) rotate() {
	err := os.Rename(l.path, l.path+".1")
	if err == nil {
		if err = l.open(); err == nil {
			return
		}
	}
	terr := l.f.Truncate(0)
	l.size = 0
	n, _ := fmt.Fprintf(l.f, "pleg-nri front: cannot rotate %s (%v): truncated it (%v)\n", l.path, err, terr)
	l.size += int64(n)
}

// openLog opens the log file at path to append to it, creating it 0600; a symbolic link there is
// refused, not followed (the output would go to the file it names).
func openLog(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
}

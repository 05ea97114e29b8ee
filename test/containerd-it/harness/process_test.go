package harness

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestProcess: a Process runs in a session of its own, Stop ends it with the signal, or with SIGKILL
// after the grace when it ignores the signal, and a nil Process does not run.
func TestProcess(t *testing.T) {
	var none *Process
	if none.Running() || none.Exited() != nil {
		t.Fatal("a nil Process runs")
	}
	p, err := StartProcess(exec.Command("sleep", "60"))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Running() {
		t.Fatal("not running after StartProcess")
	}
	if sid := sessionOf(t, p.PID()); sid != p.PID() {
		t.Errorf("session %d, want its own (%d)", sid, p.PID())
	}
	start := time.Now()
	p.Stop(syscall.SIGTERM, 10*time.Second)
	if p.Running() || time.Since(start) > 5*time.Second {
		t.Fatalf("SIGTERM: running %v after %s", p.Running(), time.Since(start))
	}

	deaf, err := StartProcess(exec.Command("sh", "-c", `trap "" TERM; while :; do sleep 0.1; done`))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the trap is set
	start = time.Now()
	deaf.Stop(syscall.SIGTERM, 300*time.Millisecond)
	if d := time.Since(start); deaf.Running() || d < 300*time.Millisecond {
		t.Fatalf("a process ignoring SIGTERM: running %v after %s, want killed after the grace", deaf.Running(), d)
	}
	select {
	case <-deaf.Exited():
	default:
		t.Fatal("Exited is open after Stop")
	}
	time.Sleep(200 * time.Millisecond) // its last sleep 0.1 ends
}

// sessionOf reads a process's session id from /proc/PID/stat.
func sessionOf(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// After "(comm)": state, ppid, pgrp, session.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	var sid int
	if _, err := fmt.Sscan(f[3], &sid); err != nil {
		t.Fatal(err)
	}
	return sid
}

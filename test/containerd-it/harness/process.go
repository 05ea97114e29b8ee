package harness

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// ProcessesWhere lists the live processes, other than this one, that match accepts.
func ProcessesWhere(match func(pid int) bool) []int {
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == self || !testutil.Alive(pid) {
			continue
		}
		if match(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// CommandLineHas says whether pid's command line contains s (a directory the process was given, say).
func CommandLineHas(pid int, s string) bool {
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.Contains(string(cmdline), s)
}

// InCgroup says whether pid is in the cgroup parent, or below it, in a hierarchy.
func InCgroup(pid int, parent string) bool {
	cgroups, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return CgroupUnder(string(cgroups), parent)
}

// CgroupUnder says whether a /proc/PID/cgroup text places the process under parent (never under the
// root).
func CgroupUnder(procCgroup, parent string) bool {
	if strings.Trim(parent, "/") == "" {
		return false
	}
	for _, l := range strings.Split(procCgroup, "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) == 3 && (parts[2] == parent || strings.HasPrefix(parts[2], parent+"/")) {
			return true
		}
	}
	return false
}

// KillAll sends SIGKILL to the processes list returns until it returns none (for 5 s at the most).
func KillAll(list func() []int) {
	for attempt := 0; attempt < 50; attempt++ {
		pids := list()
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// DescribeProcesses names each process, "process PID: its command line", for a list of leftovers.
func DescribeProcesses(pids []int) []string {
	var out []string
	for _, pid := range pids {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, fmt.Sprintf("process %d: %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	return out
}

// Process is a daemon a test runs (containerd, pleg-nri, a kubelet): started in a session of its own,
// as a service manager starts a daemon (systemd calls setsid for every service), so that a Ctrl-C at
// the terminal does not end it before the teardown does and the scheduler places it as on a node; and
// waited for in the background. A nil *Process is one that does not run.
type Process struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartProcess starts cmd in a session of its own.
func StartProcess(cmd *exec.Cmd) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// PID is the process's pid.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited and been waited for (never, for a nil Process).
func (p *Process) Exited() <-chan struct{} {
	if p == nil {
		return nil
	}
	return p.exited
}

// Running says whether the process has not exited yet.
func (p *Process) Running() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends sig to the process and waits for it to exit; after grace, it kills it (SIGKILL) and waits.
func (p *Process) Stop(sig syscall.Signal, grace time.Duration) {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

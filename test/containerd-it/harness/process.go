package harness

import (
	"fmt"
	"os"
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

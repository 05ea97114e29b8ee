package nodebench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Limits are the host limits a dense node can run into, as they stood while a benchmark's pods ran:
// each count beside the limit it counts against. The kubelet's own maxPods is set by the benchmark;
// these are the ones below it.
type Limits struct {
	// ContainerdFDs and KubeletFDs are the open files of containerd and the kubelet; the limits are
	// their soft RLIMIT_NOFILE ("Max open files" in /proc/<pid>/limits).
	ContainerdFDs     int `json:"containerd_fds"`
	ContainerdFDLimit int `json:"containerd_fd_limit"`
	KubeletFDs        int `json:"kubelet_fds"`
	KubeletFDLimit    int `json:"kubelet_fd_limit"`
	// Tasks are the machine's threads (every process's, the shims' included), against kernel.pid_max.
	Tasks  int `json:"tasks"`
	PIDMax int `json:"pid_max"`
	// InotifyInstances and InotifyWatches are the inotify instances and watches of every process on the
	// machine (an upper bound of root's, which fs.inotify.max_user_instances and max_user_watches limit).
	InotifyInstances     int `json:"inotify_instances"`
	InotifyInstanceLimit int `json:"inotify_instance_limit"`
	InotifyWatches       int `json:"inotify_watches"`
	InotifyWatchLimit    int `json:"inotify_watch_limit"`
}

// ReadLimits reads the limits from /proc (it needs root to see every process's files).
func ReadLimits(containerdPID, kubeletPID int) Limits {
	l := Limits{PIDMax: readInt("/proc/sys/kernel/pid_max"),
		InotifyInstanceLimit: readInt("/proc/sys/fs/inotify/max_user_instances"),
		InotifyWatchLimit:    readInt("/proc/sys/fs/inotify/max_user_watches")}
	l.ContainerdFDs, l.ContainerdFDLimit = processFDs(containerdPID)
	l.KubeletFDs, l.KubeletFDLimit = processFDs(kubeletPID)
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		tasks, _ := os.ReadDir(p + "/task")
		l.Tasks += len(tasks)
		fds, _ := os.ReadDir(p + "/fd")
		for _, fd := range fds {
			if target, err := os.Readlink(p + "/fd/" + fd.Name()); err == nil && target == "anon_inode:inotify" {
				l.InotifyInstances++
				info, _ := os.ReadFile(p + "/fdinfo/" + fd.Name())
				l.InotifyWatches += InotifyWatches(string(info))
			}
		}
	}
	return l
}

// Tight lists the counts above half their limit ("containerd's open files 800 of 1024").
func (l Limits) Tight() []string {
	var out []string
	for _, c := range []struct {
		what       string
		n, ofLimit int
	}{
		{"containerd's open files", l.ContainerdFDs, l.ContainerdFDLimit},
		{"the kubelet's open files", l.KubeletFDs, l.KubeletFDLimit},
		{"threads (kernel.pid_max)", l.Tasks, l.PIDMax},
		{"inotify instances (fs.inotify.max_user_instances)", l.InotifyInstances, l.InotifyInstanceLimit},
		{"inotify watches (fs.inotify.max_user_watches)", l.InotifyWatches, l.InotifyWatchLimit},
	} {
		if c.ofLimit > 0 && 2*c.n > c.ofLimit {
			out = append(out, fmt.Sprintf("%s %d of %d", c.what, c.n, c.ofLimit))
		}
	}
	return out
}

// String renders every count against its limit.
func (l Limits) String() string {
	return fmt.Sprintf("open files: containerd %d of %d, kubelet %d of %d; threads %d of pid_max %d; inotify instances %d of %d, watches %d of %d",
		l.ContainerdFDs, l.ContainerdFDLimit, l.KubeletFDs, l.KubeletFDLimit, l.Tasks, l.PIDMax,
		l.InotifyInstances, l.InotifyInstanceLimit, l.InotifyWatches, l.InotifyWatchLimit)
}

// processFDs returns a process's open files and its soft limit of them (0, 0 when it is gone).
func processFDs(pid int) (open, limit int) {
	if pid <= 0 {
		return 0, 0
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, 0
	}
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	limit, _ = OpenFilesLimit(string(data))
	return len(fds), limit
}

// OpenFilesLimit reads the soft limit of open files from the text of /proc/<pid>/limits (-1: unlimited).
func OpenFilesLimit(limits string) (int, error) {
	sc := bufio.NewScanner(strings.NewReader(limits))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "Max open files")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 2 {
			break
		}
		if f[0] == "unlimited" {
			return -1, nil
		}
		n, err := strconv.Atoi(f[0])
		if err != nil {
			return 0, fmt.Errorf("bad open files limit %q: %w", sc.Text(), err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("no \"Max open files\" line in %q", limits)
}

// InotifyWatches counts the watches in an inotify descriptor's /proc/<pid>/fdinfo text (one "inotify wd:"
// line each).
func InotifyWatches(fdinfo string) int {
	n := 0
	for _, l := range strings.Split(fdinfo, "\n") {
		if strings.HasPrefix(l, "inotify wd:") {
			n++
		}
	}
	return n
}

func readInt(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return n
}

// Package cadvisorlag reads a kubelet's log (klog at -v=3 or more, as make e2e-node writes it) for how
// far the kubelet's cAdvisor lagged behind the pods and containers the kubelet created and stopped.
//
// The kubelet reads a pod's usage from its cAdvisor, for instance in the memory check of an in-place
// resize (validateMemoryResizeAction, pkg/kubelet/kuberuntime/kuberuntime_manager.go), which gives up
// on any error of that read, a partial one included, with "unable to read memory usage for pod".
// cAdvisor learns of cgroups on its own (inotify, one goroutine adding and destroying its entries, each
// asking containerd about the container) and logs each step at -v=3 ("Added container", "Destroyed
// container", manager.go). Until it has caught up, it does not know a new pod's or container's cgroup,
// or still lists a removed one. No event source is on that path: the kubelet's creates and stops,
// containerd's handling of them and cAdvisor's inotify are the same whatever the PLEG.
package cadvisorlag

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
)

// Lags is what one kubelet log (or several, added) says.
type Lags struct {
	// PodsMs holds, per pod the kubelet synced for the first time ("Pod is being synced for the first
	// time", pod_workers.go) whose cgroup cAdvisor added later in the log, the milliseconds between the
	// two, sorted: until cAdvisor adds it, a read of the pod's usage fails outright.
	PodsMs []int64 `json:"pods_ms,omitempty"`
	// CreatedMs holds, per container the kubelet created ("Added Container", its CPU manager, logged
	// when the container is created) and cAdvisor added later in the log, the milliseconds between
	// the two, sorted.
	CreatedMs []int64 `json:"created_ms"`
	// StoppedMs holds, per container the kubelet stopped itself ("Container exited normally", once
	// its StopContainer returned, by when runc had removed the cgroup) and cAdvisor destroyed later in
	// the log, the milliseconds between the two (negative: destroyed before the stop returned), sorted.
	StoppedMs []int64 `json:"stopped_ms"`
	// UnableToRead counts the resize checks the kubelet logged as not feasible because it was "unable
	// to read memory usage" of the pod from cAdvisor (its one error line per check, not the event,
	// the sync error and the status that repeat it).
	UnableToRead int `json:"unable_to_read_memory_usage"`
}

// Add adds o's lags and counts to l's.
func (l *Lags) Add(o Lags) {
	l.PodsMs = append(l.PodsMs, o.PodsMs...)
	slices.Sort(l.PodsMs)
	l.CreatedMs = append(l.CreatedMs, o.CreatedMs...)
	slices.Sort(l.CreatedMs)
	l.StoppedMs = append(l.StoppedMs, o.StoppedMs...)
	slices.Sort(l.StoppedMs)
	l.UnableToRead += o.UnableToRead
}

// Late is how many containers cAdvisor destroyed only after the kubelet's stop of them returned.
func (l Lags) Late() int {
	n := 0
	for _, ms := range l.StoppedMs {
		if ms > 0 {
			n++
		}
	}
	return n
}

// stats returns n, p50, p90 and the largest of sorted ms, the quantiles by benchreport's rule
// (nearest rank, as every report of this project has them).
func stats(ms []int64) (n int, p50, p90, largest int64) {
	v := make([]float64, len(ms))
	for i, m := range ms {
		v[i] = float64(m)
	}
	return len(ms), int64(benchreport.Quantile(v, 0.5)), int64(benchreport.Quantile(v, 0.9)), ms[len(ms)-1]
}

// Summary says n, p50, p90 and the largest of sorted ms, in milliseconds; "none" when empty.
func Summary(ms []int64) string {
	if len(ms) == 0 {
		return "none"
	}
	n, p50, p90, largest := stats(ms)
	return fmt.Sprintf("%d, p50 %d ms, p90 %d ms, max %d ms", n, p50, p90, largest)
}

// SummarySeconds says the same as Summary in seconds, as a report's cell: "n, p50 / p90 / max s".
func SummarySeconds(ms []int64) string {
	if len(ms) == 0 {
		return "none"
	}
	n, p50, p90, largest := stats(ms)
	s := func(v int64) string { return strconv.FormatFloat(float64(v)/1000, 'f', 2, 64) }
	return fmt.Sprintf("%d, %s / %s / %s s", n, s(p50), s(p90), s(largest))
}

func (l Lags) String() string {
	return fmt.Sprintf("pods %s; created %s; stopped %s (destroyed after the stop returned: %d); unable to read memory usage %d",
		Summary(l.PodsMs), Summary(l.CreatedMs), Summary(l.StoppedMs), l.Late(), l.UnableToRead)
}

var (
	// klogTime is a klog header's time of day: "I1128 19:00:35.873261".
	klogTime = regexp.MustCompile(`^[IWEF]\d{4} (\d\d):(\d\d):(\d\d)\.(\d{6})`)
	// kubeletPod is the pod worker's line when the kubelet syncs a new pod (before it creates its cgroup).
	kubeletPod = regexp.MustCompile(`"Pod is being synced for the first time".*podUID="([0-9a-f-]{36})"`)
	// kubeletCreated is the CPU manager's line when the kubelet created a container (cpu_manager.go).
	kubeletCreated = regexp.MustCompile(`"Added Container".*containerID="([0-9a-f]{64})"`)
	// kubeletStopped is kuberuntime_container.go's line once a StopContainer the kubelet made returned.
	kubeletStopped = regexp.MustCompile(`"Container exited normally".*containerID="[a-z]+://([0-9a-f]{64})"`)
	// cadvisorPod is cAdvisor's line when it added a pod's cgroup (cgroupfs: .../pod<uid>; systemd:
	// ...-pod<uid with _>.slice, not read here).
	cadvisorPod = regexp.MustCompile(`Added container: "[^"]*/pod([0-9a-f-]{36})"`)
	// cadvisorAdded and cadvisorDestroyed are cAdvisor's lines: the name ends in the container's id.
	cadvisorAdded     = regexp.MustCompile(`Added container: "[^"]*/([0-9a-f]{64})"`)
	cadvisorDestroyed = regexp.MustCompile(`Destroyed container: "[^"]*/([0-9a-f]{64})"`)
)

// ReadFile reads the kubelet log at path.
func ReadFile(path string) (Lags, error) {
	f, err := os.Open(path)
	if err != nil {
		return Lags{}, err
	}
	defer f.Close()
	l, err := Read(f)
	if err != nil {
		return l, fmt.Errorf("failed to read %s: %w", path, err)
	}
	return l, nil
}

// Read reads one kubelet log. A log spanning midnight is read as one day: its lags across midnight
// come out wrong by a day, which shows.
func Read(r io.Reader) (Lags, error) {
	var l Lags
	// the first time of day of each step, per container id
	steps := map[*regexp.Regexp]map[string]time.Duration{
		kubeletPod: {}, cadvisorPod: {}, kubeletCreated: {}, kubeletStopped: {}, cadvisorAdded: {}, cadvisorDestroyed: {},
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		m := klogTime.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if strings.Contains(line, "not currently feasible") && strings.Contains(line, "unable to read memory usage") {
			l.UnableToRead++
			continue
		}
		h, _ := strconv.Atoi(m[1])
		mi, _ := strconv.Atoi(m[2])
		se, _ := strconv.Atoi(m[3])
		us, _ := strconv.Atoi(m[4])
		at := time.Duration(h)*time.Hour + time.Duration(mi)*time.Minute + time.Duration(se)*time.Second + time.Duration(us)*time.Microsecond
		for re, seen := range steps {
			if c := re.FindStringSubmatch(line); c != nil {
				if _, ok := seen[c[1]]; !ok {
					seen[c[1]] = at
				}
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return l, err
	}
	pair := func(kubelet, cadvisor map[string]time.Duration) []int64 {
		var ms []int64
		for id, at := range kubelet {
			if d, ok := cadvisor[id]; ok {
				ms = append(ms, (d - at).Milliseconds())
			}
		}
		slices.Sort(ms)
		return ms
	}
	l.PodsMs = pair(steps[kubeletPod], steps[cadvisorPod])
	l.CreatedMs = pair(steps[kubeletCreated], steps[cadvisorAdded])
	l.StoppedMs = pair(steps[kubeletStopped], steps[cadvisorDestroyed])
	return l, nil
}

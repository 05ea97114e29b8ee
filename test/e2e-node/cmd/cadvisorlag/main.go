// Command cadvisorlag reads kubelet logs (klog at -v=3 or more, as make e2e-node writes them) and says,
// for each, how far the kubelet's cAdvisor lagged behind the containers the kubelet created and stopped.
//
// The kubelet reads a pod's usage from its cAdvisor, for instance in the memory check of an in-place
// resize (validateMemoryResizeAction, pkg/kubelet/kuberuntime/kuberuntime_manager.go), which gives up
// on any error of that read, a partial one included, with "unable to read memory usage for pod".
// cAdvisor learns of cgroups on its own (inotify, one goroutine adding and destroying its entries, each
// asking containerd about the container), and logs each step at -v=3 ("Added container", "Destroyed
// container", manager.go). Until it has caught up, it does not know a new pod's or container's cgroup,
// or still lists a removed one. No event source is on that path: the kubelet's creates and stops,
// containerd's handling of them and cAdvisor's inotify are the same whatever the PLEG.
//
// Usage: cadvisorlag kubelet.log...
//
// For each log:
//   - created: containers the kubelet created ("Added Container", its CPU manager, logged when the
//     container is created) that cAdvisor added later in the log, and the p50, p90 and largest time
//     between the two;
//   - stopped: containers the kubelet stopped itself ("Container exited normally", once its
//     StopContainer returned, by when runc had removed the cgroup) that cAdvisor destroyed later in
//     the log, how many of those it destroyed only after the stop returned, and the p50, p90 and
//     largest time between the two (negative: destroyed before the stop returned);
//   - how many times the kubelet logged "unable to read memory usage".
package main

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
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cadvisorlag kubelet.log...")
		os.Exit(2)
	}
	for _, path := range os.Args[1:] {
		if err := report(os.Stdout, path); err != nil {
			fmt.Fprintf(os.Stderr, "cadvisorlag: %v\n", err)
			os.Exit(1)
		}
	}
}

func report(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	s, err := analyze(f)
	if err != nil {
		return fmt.Errorf("failed to read %s: %w", path, err)
	}
	fmt.Fprintf(w, "%s: %s\n", path, s)
	return nil
}

// lags are times from a kubelet's step to cAdvisor's, one per container, sorted.
type lags []time.Duration

// quantile returns the q-quantile (nearest rank); 0 without lags.
func (l lags) quantile(q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	return l[min(int(q*float64(len(l))), len(l)-1)]
}

// late is how many lags are positive: cAdvisor's step came after the kubelet's.
func (l lags) late() int {
	n := 0
	for _, d := range l {
		if d > 0 {
			n++
		}
	}
	return n
}

func (l lags) String() string {
	if len(l) == 0 {
		return "none"
	}
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + " ms" }
	return fmt.Sprintf("%d, lag p50 %s, p90 %s, max %s", len(l), ms(l.quantile(0.5)), ms(l.quantile(0.9)), ms(l[len(l)-1]))
}

// stats is what one kubelet log says.
type stats struct {
	// created: from the kubelet's creation of a container to cAdvisor adding it.
	created lags
	// stopped: from the kubelet's stop of a container returning to cAdvisor destroying it.
	stopped lags
	// unableToRead counts the kubelet's "unable to read memory usage" (a resize's memory check that
	// could not read the pod's usage from cAdvisor).
	unableToRead int
}

func (s stats) String() string {
	return fmt.Sprintf("created %s; stopped %s (destroyed after the stop returned: %d); unable to read memory usage %d",
		s.created, s.stopped, s.stopped.late(), s.unableToRead)
}

var (
	// klogTime is a klog header's time of day: "I1128 19:00:35.873261".
	klogTime = regexp.MustCompile(`^[IWEF]\d{4} (\d\d):(\d\d):(\d\d)\.(\d{6})`)
	// kubeletCreated is the CPU manager's line when the kubelet created a container (cpu_manager.go).
	kubeletCreated = regexp.MustCompile(`"Added Container".*containerID="([0-9a-f]{64})"`)
	// kubeletStopped is kuberuntime_container.go's line once a StopContainer the kubelet made returned.
	kubeletStopped = regexp.MustCompile(`"Container exited normally".*containerID="[a-z]+://([0-9a-f]{64})"`)
	// cadvisorAdded and cadvisorDestroyed are cAdvisor's lines: the name ends in the container's id.
	cadvisorAdded     = regexp.MustCompile(`Added container: "[^"]*/([0-9a-f]{64})"`)
	cadvisorDestroyed = regexp.MustCompile(`Destroyed container: "[^"]*/([0-9a-f]{64})"`)
)

// analyze reads one kubelet log. A log spanning midnight is read as one day: its lags across midnight
// come out wrong by a day, which shows.
func analyze(r io.Reader) (stats, error) {
	var s stats
	// first time of day of each step, per container id
	steps := map[*regexp.Regexp]map[string]time.Duration{
		kubeletCreated: {}, kubeletStopped: {}, cadvisorAdded: {}, cadvisorDestroyed: {},
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		m := klogTime.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if strings.Contains(line, "unable to read memory usage") {
			s.unableToRead++
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
		return s, err
	}
	pair := func(kubelet, cadvisor map[string]time.Duration) lags {
		var l lags
		for id, at := range kubelet {
			if d, ok := cadvisor[id]; ok {
				l = append(l, d-at)
			}
		}
		slices.Sort(l)
		return l
	}
	s.created = pair(steps[kubeletCreated], steps[cadvisorAdded])
	s.stopped = pair(steps[kubeletStopped], steps[cadvisorDestroyed])
	return s, nil
}

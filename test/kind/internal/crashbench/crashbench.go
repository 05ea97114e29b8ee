// Package crashbench measures, in a kind cluster, what a user sees of a crash: the time from a
// container's exit to the creation and the start of the container the kubelet replaces it with, read
// from each node's containerd (crictl on containerd's own socket, never through pleg-nri), as make
// bench-kubelet measures it on a standalone kubelet.
//
// Each sample is its own pod, pinned to a node, whose only container crashes exactly once: only a
// container's first restart comes without the kubelet's crash-loop back-off, so the samples are many
// containers, not many crashes of one. The exits are spaced by a spacing that does not divide the
// GenericPLEG relist period (1 s), so they fall at every phase of it. They are timed from the moment
// the batch is released, once every pod of it runs, never from each pod's own start: a starved node
// starts a large batch over minutes, and exits timed from each start would fall while the rest of the
// batch is still being started, and before whatever the batch is meant to measure.
package crashbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
	"github.com/pleg-nri/pleg-nri/test/internal/kindrun"
)

// Plan is one batch of crashing pods.
type Plan struct {
	// Namespace holds the batch's pods (made, then deleted by Run).
	Namespace string
	// Nodes are the nodes to run PerNode pods on each.
	Nodes   []string
	PerNode int
	// FirstExit is how long after the batch's release (every pod runs) the first container of a node
	// exits; Spacing separates two exits on a node.
	FirstExit, Spacing time.Duration
	// Image is a busybox image present on every node.
	Image string
	// StartTimeout bounds the wait for every pod to run (zero: DefaultStartTimeout). A node starved of
	// CPU starts a large batch slowly (108 pods over three kind nodes on two cores took more than 3
	// minutes on one machine here); the exits are timed from the release, so a slow start delays
	// the samples, it does not change them.
	StartTimeout time.Duration
}

// DefaultStartTimeout is Plan.StartTimeout's default.
const DefaultStartTimeout = 3 * time.Minute

// Spacing is the default spacing of exits: not a divisor of the 1 s relist period.
const Spacing = 530 * time.Millisecond

// Sample is one crash and its replacement.
type Sample struct {
	Node, Pod                string
	Exited, Created, Started time.Time
}

// CreatedMs and StartedMs are the exit to the replacement's creation and start, in milliseconds.
func (s Sample) CreatedMs() float64 { return float64(s.Created.Sub(s.Exited)) / 1e6 }
func (s Sample) StartedMs() float64 { return float64(s.Started.Sub(s.Exited)) / 1e6 }

// Kubectl runs kubectl against the cluster.
type Kubectl func(ctx context.Context, args ...string) (string, error)

var podsTemplate = template.Must(template.New("crashbench").Parse(`
{{- range .Pods }}
---
apiVersion: v1
kind: Pod
metadata:
  name: {{ .Name }}
  namespace: {{ $.Namespace }}
  labels:
    app: crashbench
spec:
  nodeName: {{ .Node }}
  terminationGracePeriodSeconds: 1
  tolerations:
  - operator: Exists
  containers:
  - name: c
    image: {{ $.Image }}
    imagePullPolicy: Never
    command: [sh, -c, '[ -e /state/crashed ] && exec sleep 3600; touch /state/crashed; until [ -e /release/go ]; do sleep 1; done; sleep {{ .Delay }}; exit 1']
    volumeMounts:
    - name: state
      mountPath: /state
    - name: release
      mountPath: /release
      readOnly: true
  volumes:
  - name: state
    emptyDir: {}
  - name: release
    hostPath:
      path: {{ $.ReleaseDir }}
      type: DirectoryOrCreate
{{- end }}
`))

// Manifest is the plan's pods (Run makes their namespace first): pod k on node n is named
// crash-<node index>-<k>.
func (p Plan) Manifest() (string, error) {
	type pod struct {
		Name, Node, Delay string
	}
	var pods []pod
	for i, n := range p.Nodes {
		for k := 0; k < p.PerNode; k++ {
			d := p.FirstExit + time.Duration(k)*p.Spacing
			pods = append(pods, pod{Name: fmt.Sprintf("crash-%d-%02d", i, k), Node: n, Delay: fmt.Sprintf("%.3f", d.Seconds())})
		}
	}
	var b bytes.Buffer
	err := podsTemplate.Execute(&b, map[string]any{"Namespace": p.Namespace, "Image": p.Image, "Pods": pods, "ReleaseDir": p.releaseDir()})
	return b.String(), err
}

// releaseDir is the directory on every node whose file "go" releases the batch: each pod mounts it and
// polls for the file every second before it starts counting down to its exit.
func (p Plan) releaseDir() string { return "/run/crashbench/" + p.Namespace }

// release lets the batch's containers count down to their exits, on every node.
func (p Plan) release(ctx context.Context) error {
	for _, n := range p.Nodes {
		if _, err := kindrun.Cmd(ctx, "docker", "exec", n, "sh", "-c", `mkdir -p "$1" && touch "$1/go"`, "-", p.releaseDir()); err != nil {
			return fmt.Errorf("releasing the crash batch %s on %s: %w", p.Namespace, n, err)
		}
	}
	return nil
}

// Run makes the plan's pods, releases them once they all run, runs during (if not nil), waits until
// every container was replaced once, reads the samples and deletes the pods.
func (p Plan) Run(ctx context.Context, k Kubectl, during func() error) ([]Sample, error) {
	m, err := p.Manifest()
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp("", "crashbench-*.yaml")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(m); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	if err := CreateNamespace(ctx, k, p.Namespace); err != nil {
		return nil, err
	}
	if _, err := k(ctx, "apply", "-f", f.Name()); err != nil {
		return nil, fmt.Errorf("the crash batch %s: %w", p.Namespace, err)
	}
	timeout := p.StartTimeout
	if timeout == 0 {
		timeout = DefaultStartTimeout
	}
	start := time.Now()
	if err := p.WaitRunning(ctx, k, timeout); err != nil {
		return nil, err
	}
	fmt.Printf("crashbench: the %d pods of %s ran %s after their creation\n", p.PerNode*len(p.Nodes), p.Namespace, time.Since(start).Round(time.Second))
	if err := p.release(ctx); err != nil {
		return nil, err
	}
	if during != nil {
		if err := during(); err != nil {
			return nil, err
		}
	}
	samples, err := p.Wait(ctx, k, 5*time.Minute)
	if err != nil {
		return nil, err
	}
	if err := p.Delete(ctx, k); err != nil {
		return nil, fmt.Errorf("deleting the crash batch %s: %w", p.Namespace, err)
	}
	return samples, nil
}

// CreateNamespace makes namespace ns and waits for its default service account: pods are refused
// until the controller manager made it.
func CreateNamespace(ctx context.Context, k Kubectl, ns string) error {
	if _, err := k(ctx, "create", "namespace", ns); err != nil {
		return err
	}
	_, err := k(ctx, "-n", ns, "wait", "--for=create", "serviceaccount/default", "--timeout=120s")
	return err
}

// WaitRunning waits until every pod of the plan runs its first container (before any has crashed,
// when FirstExit leaves the time).
func (p Plan) WaitRunning(ctx context.Context, k Kubectl, timeout time.Duration) error {
	return testutil.PollEvery(ctx, timeout, time.Second, fmt.Sprintf("the %d pods of %s to run", p.PerNode*len(p.Nodes), p.Namespace), func() (bool, error) {
		out, err := k(ctx, "-n", p.Namespace, "get", "pods", "-o", `jsonpath={range .items[*]}{.status.phase}{"\n"}{end}`)
		if err != nil {
			return false, nil
		}
		n := 0
		for _, l := range strings.Fields(out) {
			if l == "Running" {
				n++
			}
		}
		return n == p.PerNode*len(p.Nodes), nil
	})
}

// Wait waits until every container of the plan crashed (exit code 1) and its replacement runs, then
// reads the samples from each node's containerd. A pod whose replacement runc failed to start (seen
// under load on cgroup v1: "unable to freeze") gives no sample: its restart waited for the kubelet's
// back-off, not for an event; nor does one whose crashed attempt the kubelet's container GC removed
// (its exit time is gone with it). Such pods are printed and left out.
func (p Plan) Wait(ctx context.Context, k Kubectl, timeout time.Duration) ([]Sample, error) {
	var last string
	err := testutil.PollEvery(ctx, timeout, time.Second, "every container of "+p.Namespace+" to be replaced once", func() (bool, error) {
		out, err := k(ctx, "-n", p.Namespace, "get", "pods", "-o",
			`jsonpath={range .items[*]}{.metadata.name}={.status.containerStatuses[0].lastState.terminated.exitCode}=`+
				`{.status.containerStatuses[0].lastState.terminated.reason}={.status.containerStatuses[0].restartCount}=`+
				`{.status.containerStatuses[0].state.running.startedAt}{"\n"}{end}`)
		if err != nil {
			return false, nil
		}
		last = out
		done := 0
		for _, l := range strings.Fields(out) {
			if f := strings.Split(l, "="); len(f) == 5 && replaced(f[1], f[2], f[3], f[4]) {
				done++
			}
		}
		return done == p.PerNode*len(p.Nodes), nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, last)
	}
	var samples []Sample
	for _, n := range p.Nodes {
		s, lost, err := Collect(ctx, n, p.Namespace)
		if err != nil {
			return nil, err
		}
		for _, l := range lost {
			fmt.Printf("crashbench: %s: left out: %s\n", n, l)
		}
		if len(s)+len(lost) != p.PerNode {
			return nil, fmt.Errorf("%s: %d samples and %d left out in containerd, want %d", n, len(s), len(lost), p.PerNode)
		}
		samples = append(samples, s...)
	}
	return samples, nil
}

// replaced says, from a pod's status in the API, whether its container crashed and a replacement
// runs: the last termination is the planned crash, or a start that runc failed after it (at least two
// restarts: the crash and the failed start), or there is no last termination after a restart: the
// kubelet's container GC removed the crashed attempt (seen under load with every setup, GenericPLEG
// included), and Wait leaves the pod out.
func replaced(exitCode, reason, restarts, runningSince string) bool {
	if runningSince == "" {
		return false
	}
	if exitCode == crashExitCode {
		return true
	}
	n, err := strconv.Atoi(restarts)
	if err != nil {
		return false
	}
	return (reason == "StartError" && n >= 2) || (exitCode == "" && reason == "" && n >= 1)
}

// Delete deletes the plan's namespace, waits until it is gone, and removes its release directory
// from every node.
func (p Plan) Delete(ctx context.Context, k Kubectl) error {
	if _, err := k(ctx, "delete", "namespace", p.Namespace, "--wait=true", "--timeout=5m"); err != nil {
		return err
	}
	for _, n := range p.Nodes {
		if _, err := kindrun.Cmd(ctx, "docker", "exec", n, "rm", "-rf", p.releaseDir()); err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
	}
	return nil
}

// Container is one container of a node's containerd, as crictl ps -o json shows it.
type Container struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	Metadata struct {
		Name    string `json:"name"`
		Attempt int    `json:"attempt"`
	} `json:"metadata"`
	Labels map[string]string `json:"labels"`
}

// Pod and PodUID are the container's pod, from the kubelet's labels.
func (c Container) Pod() string    { return c.Labels["io.kubernetes.pod.name"] }
func (c Container) PodUID() string { return c.Labels["io.kubernetes.pod.uid"] }

// crictl runs crictl on node against containerd's own socket.
func crictl(ctx context.Context, node string, args ...string) (string, error) {
	return kindrun.Cmd(ctx, "docker", append([]string{"exec", node, "crictl", "-r", "unix:///run/containerd/containerd.sock"}, args...)...)
}

// Containers lists node's containers in containerd (every state), of namespace ns ("" for all).
func Containers(ctx context.Context, node, ns string) ([]Container, error) {
	args := []string{"ps", "-a", "-o", "json"}
	if ns != "" {
		args = append(args, "--label", "io.kubernetes.pod.namespace="+ns)
	}
	out, err := crictl(ctx, node, args...)
	if err != nil {
		return nil, err
	}
	var list struct {
		Containers []Container `json:"containers"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("%s: crictl ps: %w", node, err)
	}
	return list.Containers, nil
}

// Duplicates names what the kubelet must never make: two containers of one pod with the same name
// and attempt, or two of them running at once.
func Duplicates(cs []Container) []string {
	type key struct{ uid, name string }
	attempts := map[key]map[int]int{}
	running := map[key]int{}
	pods := map[key]string{}
	for _, c := range cs {
		k := key{c.PodUID(), c.Metadata.Name}
		pods[k] = c.Labels["io.kubernetes.pod.namespace"] + "/" + c.Pod()
		if attempts[k] == nil {
			attempts[k] = map[int]int{}
		}
		attempts[k][c.Metadata.Attempt]++
		if c.State == "CONTAINER_RUNNING" {
			running[k]++
		}
	}
	var out []string
	for k, as := range attempts {
		for a, n := range as {
			if n > 1 {
				out = append(out, fmt.Sprintf("%s container %s: %d containers of attempt %d", pods[k], k.name, n, a))
			}
		}
		if running[k] > 1 {
			out = append(out, fmt.Sprintf("%s container %s: %d running at once", pods[k], k.name, running[k]))
		}
	}
	sort.Strings(out)
	return out
}

// crashExitCode is the exit code of the planned crash.
const crashExitCode = "1"

type times struct {
	Status struct {
		ID         string    `json:"id"`
		CreatedAt  time.Time `json:"createdAt"`
		StartedAt  time.Time `json:"startedAt"`
		FinishedAt time.Time `json:"finishedAt"`
		ExitCode   int       `json:"exitCode"`
		Reason     string    `json:"reason"`
	} `json:"status"`
}

// ran says whether the attempt's process ran: runc failed to start one that did not (crictl shows its
// start as the zero time or the epoch).
func (t times) ran() bool { return t.Status.StartedAt.Unix() > 0 }

// Collect reads node's samples of namespace ns: in each pod, the attempt that crashed as planned (it
// ran and exited with code 1) and the next attempt, its replacement. An attempt before the crash that
// never ran (runc failed to start it: seen under load as "unable to freeze") is passed over. A pod
// whose replacement runc failed to start gives no sample (its restart waited for the kubelet's
// back-off): it is described in lost instead (the kubelet may have removed its crashed attempt by then,
// keeping one dead container).
func Collect(ctx context.Context, node, ns string) (samples []Sample, lost []string, err error) {
	cs, err := Containers(ctx, node, ns)
	if err != nil {
		return nil, nil, err
	}
	if d := Duplicates(cs); len(d) > 0 {
		return nil, nil, fmt.Errorf("%s: duplicated containers: %s", node, strings.Join(d, "; "))
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	if len(ids) == 0 {
		return nil, nil, nil
	}
	// One docker exec for every container's status.
	out, err := kindrun.Cmd(ctx, "docker", append([]string{"exec", node, "sh", "-c",
		`for id; do crictl -r unix:///run/containerd/containerd.sock inspect -o json "$id" || exit 1; done`, "sh"}, ids...)...)
	if err != nil {
		return nil, nil, err
	}
	byID := map[string]times{}
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var t times
		if err := dec.Decode(&t); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, nil, fmt.Errorf("%s: crictl inspect: %w", node, err)
		}
		byID[t.Status.ID] = t
	}
	attempts := map[string]map[int]times{}
	for _, c := range cs {
		t, ok := byID[c.ID]
		if !ok {
			return nil, nil, fmt.Errorf("%s: crictl inspect gave no status of %s", node, c.ID)
		}
		if attempts[c.Pod()] == nil {
			attempts[c.Pod()] = map[int]times{}
		}
		attempts[c.Pod()][c.Metadata.Attempt] = t
	}
	var missing []string
	for name, as := range attempts {
		crash, next, found := crashAndReplacement(as)
		switch found {
		case replacementStarted:
		case startFailed:
			lost = append(lost, fmt.Sprintf("pod %s: a start failed in runc after the crash: %s", name, describeAttempts(as)))
			continue
		case crashRemoved:
			lost = append(lost, fmt.Sprintf("pod %s: the kubelet's container GC removed the crashed attempt while its replacement was being started: %s",
				name, describeAttempts(as)))
			continue
		default:
			missing = append(missing, fmt.Sprintf("pod %s has no crashed attempt followed by its replacement in containerd: %s", name, describeAttempts(as)))
			continue
		}
		s := Sample{Node: node, Pod: name, Exited: crash.Status.FinishedAt, Created: next.Status.CreatedAt, Started: next.Status.StartedAt}
		if s.Exited.IsZero() || s.Created.Before(s.Exited) || s.Started.Before(s.Created) {
			return nil, nil, fmt.Errorf("%s: pod %s: exit %s, replacement created %s, started %s: not in order", node, name, s.Exited, s.Created, s.Started)
		}
		samples = append(samples, s)
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, nil, fmt.Errorf("%s: %s", node, strings.Join(missing, "\n"))
	}
	sort.Strings(lost)
	sort.Slice(samples, func(i, j int) bool { return samples[i].Exited.Before(samples[j].Exited) })
	return samples, lost, nil
}

// Stats are a set of samples' quantiles, in milliseconds.
type Stats struct {
	N                                              int
	CreatedP50, CreatedP90, StartedP50, StartedP90 float64
}

// Latencies are the samples' exit to creation and exit to start, in ms, in their order.
func Latencies(samples []Sample) (created, started []float64) {
	for _, x := range samples {
		created, started = append(created, x.CreatedMs()), append(started, x.StartedMs())
	}
	return created, started
}

// Of summarizes samples.
func Of(samples []Sample) Stats {
	c, s := Latencies(samples)
	if len(samples) == 0 {
		return Stats{}
	}
	return Stats{N: len(samples), CreatedP50: benchreport.Median(c), CreatedP90: benchreport.Quantile(c, 0.9),
		StartedP50: benchreport.Median(s), StartedP90: benchreport.Quantile(s, 0.9)}
}

func (s Stats) String() string {
	if s.N == 0 {
		return "no samples"
	}
	return fmt.Sprintf("n=%d created p50 %.0f ms p90 %.0f ms, started p50 %.0f ms p90 %.0f ms",
		s.N, s.CreatedP50, s.CreatedP90, s.StartedP50, s.StartedP90)
}

// ByNode splits samples by node.
func ByNode(samples []Sample) map[string][]Sample {
	out := map[string][]Sample{}
	for _, s := range samples {
		out[s.Node] = append(out[s.Node], s)
	}
	return out
}

// Between keeps the samples whose exit fell in [from, to].
func Between(samples []Sample, from, to time.Time) []Sample {
	var out []Sample
	for _, s := range samples {
		if !s.Exited.Before(from) && !s.Exited.After(to) {
			out = append(out, s)
		}
	}
	return out
}

// describeAttempts lists a pod's attempts in containerd with their times and exit codes.
func describeAttempts(as map[int]times) string {
	keys := make([]int, 0, len(as))
	for a := range as {
		keys = append(keys, a)
	}
	sort.Ints(keys)
	var parts []string
	for _, a := range keys {
		t := as[a].Status
		parts = append(parts, fmt.Sprintf("attempt %d (%.12s): created %s, started %s, finished %s, exit code %d", a, t.ID,
			t.CreatedAt.Format(time.StampMilli), t.StartedAt.Format(time.StampMilli), t.FinishedAt.Format(time.StampMilli), t.ExitCode))
	}
	return fmt.Sprintf("%d attempts: %s", len(as), strings.Join(parts, "; "))
}

// What crashAndReplacement found of a pod's crash.
const (
	// noCrash: no attempt that ran and exited with the planned code, or none after it yet.
	noCrash = iota
	// replacementStarted: the crash, and the next attempt, which ran.
	replacementStarted
	// startFailed: runc failed to start the attempt after the crash, or the crash is gone (the
	// kubelet keeps one dead container) and an attempt that never ran is there.
	startFailed
	// crashRemoved: the crashed attempt is gone and a later one ran: the kubelet's container GC
	// counts a container not yet started as dead (kuberuntime_gc.go evictableContainers prunes only
	// running ones) and keeps one dead container per name, so it removes the crashed attempt when it
	// runs while a slow replacement is still being started.
	crashRemoved
)

// crashAndReplacement finds, among a pod's attempts, the last one that ran and exited with the planned
// code, and the attempt after it.
func crashAndReplacement(as map[int]times) (crash, next times, found int) {
	last := -1
	neverRan := false
	for a, t := range as {
		if !t.ran() {
			neverRan = true
		}
		if fmt.Sprint(t.Status.ExitCode) == crashExitCode && t.ran() && a > last {
			last = a
		}
	}
	if last < 0 {
		if neverRan {
			return crash, next, startFailed
		}
		for a, t := range as {
			if _, before := as[a-1]; a > 0 && t.ran() && !before {
				return crash, next, crashRemoved
			}
		}
		return crash, next, noCrash
	}
	next, ok := as[last+1]
	switch {
	case !ok:
		return as[last], next, noCrash
	case !next.ran():
		return as[last], next, startFailed
	}
	return as[last], next, replacementStarted
}

package kubelete2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/plegnri"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
)

// setup is one way of running the kubelet.
type setup struct {
	// Name says what the kubelet runs with.
	Name string
	// Evented turns the EventedPLEG gate on; PlegNRI points the kubelet at pleg-nri instead of
	// containerd.
	Evented, PlegNRI bool
	// Freshness is pleg-nri's read-freshness (empty: its default).
	Freshness string
	// RefreshAfterStop and CacheTick set pleg-nri's keys of the same names (off: its defaults).
	RefreshAfterStop bool
	CacheTick        time.Duration
	// Attached runs pleg-nri beside containerd (its NRI plugin registered, containerd's task events
	// subscribed, its checkpoint written) while the kubelet keeps containerd's endpoint: a control
	// for what pleg-nri's own work costs containerd, apart from what its events give the kubelet.
	Attached bool
	// NoStateDir runs pleg-nri with no state-dir (no checkpoint).
	NoStateDir bool
	// Binary is the pleg-nri binary the setup runs; empty: the one TestMain built from this tree.
	Binary string
}

// runsPlegNRI says whether pleg-nri runs in the setup: the kubelet's endpoint, or attached only.
func (s setup) runsPlegNRI() bool { return s.PlegNRI || s.Attached }

var (
	setupGeneric         = setup{Name: "GenericPLEG on containerd"}
	setupEventedDirect   = setup{Name: "EventedPLEG on containerd", Evented: true}
	setupEventedPlegNRI  = setup{Name: "EventedPLEG on pleg-nri", Evented: true, PlegNRI: true}
	allSetups            = []setup{setupGeneric, setupEventedDirect, setupEventedPlegNRI}
	kubeletMetricPrefix  = "kubelet_"
	metricConnSuccess    = kubeletMetricPrefix + "evented_pleg_connection_success_count"
	metricConnError      = kubeletMetricPrefix + "evented_pleg_connection_error_count"
	metricRelistCount    = kubeletMetricPrefix + "pleg_relist_duration_seconds_count"
	metricEventsReceived = kubeletMetricPrefix + "evented_pleg_connection_latency_seconds_count"
	metricEventLatency   = kubeletMetricPrefix + "evented_pleg_connection_latency_seconds_sum"
	// metricPodRelists counts the targeted relists of one pod (PLEGOnDemandRelist, 1.36 and later):
	// on 1.37 each STOPPED event makes one.
	metricPodRelists     = kubeletMetricPrefix + "pleg_pod_relist_duration_seconds_count"
	eventedRelistPeriod  = 300 * time.Second // the generic relist period while EventedPLEG is on, before 1.37
	podWaitTimeout       = 90 * time.Second
	containerdWaitPeriod = 50 * time.Millisecond
)

// node is a kubelet (and pleg-nri, in setup 3) running against the package's containerd.
type node struct {
	t     testing.TB
	setup setup
	k     *kubelet.Kubelet
	// p is pleg-nri (nil unless setup.runsPlegNRI()).
	p *plegnri.Daemon
	// cri is containerd's own CRI, to check what the kubelet did.
	cri runtimeapi.RuntimeServiceClient
	// started is when the kubelet became ready.
	started time.Time
	dups    *dupWatcher
}

// nodeOptions change how startNode runs the kubelet and pleg-nri.
type nodeOptions struct {
	// quiet runs the kubelet with --v=2 and pleg-nri at log level info, as in production, instead of
	// the tests' detailed logs (which cost the evented setups more CPU: the kubelet formats every event
	// it gets at --v=4). The kubelet then does not log the events it receives.
	quiet bool
	// plegNRIFlags are more flags for pleg-nri.
	plegNRIFlags []string
	// noDupWatch leaves out the watcher of duplicate containers (it lists containerd's containers 20
	// times a second: a load of the test's own that a cost benchmark must not measure); the lifetimes
	// of the containers are still checked at the end.
	noDupWatch bool
	// maxPods raises the kubelet's maxPods (0: its default, 110) for a benchmark of more pods.
	maxPods int
	// verbosity is the kubelet's --v when not 0 (whether quiet or not).
	verbosity int
	// kubeletDuplicates is for a test that counts the duplicate containers a kubelet makes by itself
	// (its own races on 1.35/1.36 with containerd's stream): no duplicate check fails the test.
	kubeletDuplicates bool
}

// startNode starts pleg-nri (setup 3, and the setups it is attached in) and a kubelet, and arranges for
// both to be stopped, the kubelet torn down (failing the test when it leaves something behind), and
// their logs printed when the test fails. It also watches containerd for two running containers of the same name in a pod for as long as
// the node runs.
func startNode(t testing.TB, s setup, opts ...nodeOptions) *node {
	t.Helper()
	var o nodeOptions
	for _, opt := range opts {
		o = opt
	}
	verbosity, plegNRIFlags := 4, []string(nil)
	if o.quiet {
		verbosity, plegNRIFlags = 2, []string{"--log-level", "info"}
	}
	if o.verbosity != 0 {
		verbosity = o.verbosity
	}
	plegNRIFlags = append(plegNRIFlags, o.plegNRIFlags...)
	if s.RefreshAfterStop {
		plegNRIFlags = append(plegNRIFlags, "--refresh-after-stop")
	}
	if s.CacheTick > 0 {
		plegNRIFlags = append(plegNRIFlags, "--cache-tick", s.CacheTick.String())
	}
	ctx := context.Background()
	n := &node{t: t, setup: s}
	// Calls wait for containerd while it restarts, up to their own deadlines.
	conn, err := grpc.NewClient("unix://"+env.Address, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	n.cri = runtimeapi.NewRuntimeServiceClient(conn)

	// imageEndpoint is the kubelet's imageServiceEndpoint: containerd's socket where the runtime endpoint
	// is pleg-nri's, as pleg-nri's kubelet switch sets it (issue 58: image calls do not cross the front).
	endpoint, imageEndpoint := "unix://"+env.Address, ""
	if s.runsPlegNRI() {
		dir := testutil.ShortTempDir(t, "plegnri-")
		if s.Freshness == "" {
			s.Freshness = os.Getenv(freshnessEnv)
		}
		if s.Freshness != "" {
			plegNRIFlags = append(plegNRIFlags, "--read-freshness", s.Freshness)
		}
		if os.Getenv(refreshAfterStopEnv) == "1" {
			plegNRIFlags = append(plegNRIFlags, "--refresh-after-stop")
		}
		if s.NoStateDir {
			plegNRIFlags = append(plegNRIFlags, "--state-dir=")
		}
		binary := plegNRIBinary
		if s.Binary != "" {
			binary = s.Binary
		}
		n.p, err = plegnri.Start(ctx, plegnri.Options{Binary: binary, Env: env, Dir: dir, Extra: plegNRIFlags})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// The front too: a test that leaves a process of pleg-nri behind fails.
			if err := n.p.Close(); err != nil {
				t.Error(err)
			}
			if t.Failed() {
				t.Logf("pleg-nri log (last lines):\n%s", lastLines(n.p.Log(), 200))
				t.Logf("pleg-nri front log (last lines):\n%s", lastLines(n.p.FrontLog(), 50))
			}
		})
		if s.PlegNRI {
			endpoint, imageEndpoint = "unix://"+n.p.Socket, endpoint
		}
		if s.Freshness != "" {
			t.Logf("pleg-nri with read-freshness %s", s.Freshness)
		}
	}
	n.k, err = kubelet.New(kubelet.Options{
		Binary:               kubeletBinary,
		RuntimeEndpoint:      endpoint,
		ImageServiceEndpoint: imageEndpoint,
		ContainerdAddress:    env.Address,
		EventedPLEG:          s.Evented,
		FeatureGates:         featureGatesFromEnv(t),
		CgroupParent:         env.CgroupParent,
		MaxPods:              o.maxPods,
		Verbosity:            verbosity,
		Log:                  testWriter{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	containerdLog := env.LogSize()
	// Registered before the kubelet starts and so run after pleg-nri's cleanup (cleanups run last in,
	// first out): the kubelet stops first, then pleg-nri.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s", n.k.LogTail(150))
			t.Logf("containerd log during the test:\n%s", lastLines(env.LogSince(containerdLog), 100))
		}
		n.keepLogs(containerdLog)
		if err := n.k.Teardown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if err := n.k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The kubelet answers before its PLEG runs: wait for the generic PLEG's first relist (at its start)
	// and, with EventedPLEG, for the stream.
	err = harness.WaitFor(ctx, 60*time.Second, "the kubelet's PLEG to start", func() (bool, error) {
		m := n.plegMetrics()
		return m.Relists >= 1 && (!s.Evented || m.ConnSuccess >= 1), nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, n.k.LogTail(60))
	}
	n.started = time.Now()
	if o.kubeletDuplicates {
		return n
	}
	if o.noDupWatch {
		t.Cleanup(func() { checkLifetimes(t, n.cri) })
	} else {
		n.dups = watchDuplicates(t, n.cri)
	}
	return n
}

// freshnessEnv sets pleg-nri's read-freshness in the setups that do not choose one, for experiments
// (e.g. to see TestOverlaidExit fail with "off" on kubelet 1.37).
const freshnessEnv = "PLEG_NRI_KUBELET_FRESHNESS"

// refreshAfterStopEnv=1 runs pleg-nri with refresh-after-stop in every setup, to check that the suite
// stays green with it before it becomes a default.
const refreshAfterStopEnv = "PLEG_NRI_KUBELET_REFRESH_AFTER_STOP"

// featureGatesEnv names more kubelet feature gates for experiments: "Name=true,Other=false".
const featureGatesEnv = "PLEG_NRI_KUBELET_FEATURE_GATES"

func featureGatesFromEnv(t testing.TB) map[string]bool {
	v := os.Getenv(featureGatesEnv)
	if v == "" {
		return nil
	}
	gates := map[string]bool{}
	for _, kv := range strings.Split(v, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		on, err := strconv.ParseBool(val)
		if !ok || err != nil {
			t.Fatalf("%s: want Name=true|false, got %q", featureGatesEnv, kv)
		}
		gates[name] = on
	}
	t.Logf("extra kubelet feature gates: %v", gates)
	return gates
}

// keepLogsEnv names a directory where each node leaves its kubelet's, pleg-nri's and containerd's logs,
// to look at after the run.
const keepLogsEnv = "PLEG_NRI_KUBELET_KEEP_LOGS"

func (n *node) keepLogs(containerdLog int64) {
	dir := os.Getenv(keepLogsEnv)
	if dir == "" {
		return
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(n.t.Name())
	files := map[string]string{"containerd": env.LogSince(containerdLog)}
	if data, err := os.ReadFile(n.k.LogPath); err == nil {
		files["kubelet"] = string(data)
	}
	if n.p != nil {
		files["pleg-nri"] = n.p.Log()
	}
	for what, text := range files {
		if err := os.MkdirAll(dir, 0o755); err == nil {
			_ = os.WriteFile(filepath.Join(dir, name+"."+what+".log"), []byte(text), 0o644)
		}
	}
}

// testWriter sends the kubelet package's progress lines to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// metric reads one of the kubelet's metrics: the sum of its samples whose line has every filter.
func (n *node) metric(name string, filters ...string) float64 {
	n.t.Helper()
	v, err := n.k.Metric(name, filters...)
	if err != nil {
		n.t.Fatalf("kubelet metric %s: %v", name, err)
	}
	return v
}

// plegMetrics is what the kubelet's metrics say about its PLEG at one moment.
type plegMetrics struct {
	At                     time.Time
	ConnSuccess, ConnError float64
	Relists                float64
	// EventsReceived counts the events the kubelet took from its stream (the observations of
	// evented_pleg_connection_latency_seconds).
	EventsReceived float64
	// EventLatency is the sum of the kubelet's event latencies (created_at to the kubelet handling it),
	// in seconds.
	EventLatency float64
	// PodRelists counts the kubelet's targeted relists of one pod (0 before 1.36).
	PodRelists float64
	// StoppedEvents counts the kubelet's log lines for a STOPPED event (stoppedEventLog: before 1.37,
	// one that changed its cache; on 1.37, a relist it requested); 0 below --v=4.
	StoppedEvents int
}

// stoppedEventLog is the line the kubelet under test logs (at --v=4) for a STOPPED event it acted on.
func stoppedEventLog() string {
	if eventsTriggerRelist() {
		return "Evented PLEG: requested pod relist after container termination"
	}
	return "Received Container Stopped Event"
}

func (m plegMetrics) String() string {
	return fmt.Sprintf("evented_pleg_connection_success_count=%g evented_pleg_connection_error_count=%g "+
		"pleg_relist_duration_seconds_count=%g pleg_pod_relist_duration_seconds_count=%g, %g events received, %d %q log lines",
		m.ConnSuccess, m.ConnError, m.Relists, m.PodRelists, m.EventsReceived, m.StoppedEvents, stoppedEventLog())
}

func (n *node) plegMetrics() plegMetrics {
	n.t.Helper()
	return plegMetrics{
		At:             time.Now(),
		ConnSuccess:    n.metric(metricConnSuccess),
		ConnError:      n.metric(metricConnError),
		Relists:        n.metric(metricRelistCount),
		EventsReceived: n.metric(metricEventsReceived),
		EventLatency:   n.metric(metricEventLatency),
		PodRelists:     n.metric(metricPodRelists),
		StoppedEvents:  n.k.CountLog(stoppedEventLog()),
	}
}

// periodicRelists is how many of the generic PLEG's periodic relists (while EventedPLEG is on: the
// first at its start, before n.started, then every 300 s) can fall between two metric readings: the
// relists that are not a fallback. It allows a few seconds of slack on each side.
func (n *node) periodicRelists(from, to time.Time) float64 {
	const slack = 10 * time.Second
	count := 0
	for at := n.started.Add(eventedRelistPeriod - slack); !at.After(to.Add(slack)); at = at.Add(eventedRelistPeriod) {
		if !at.Before(from.Add(-2 * slack)) {
			count++
		}
	}
	return float64(count)
}

// checkConsumingStream fails unless the kubelet consumes the event stream without ever having fallen
// back to relisting since before: a connection made, no connection error, and, before 1.37, no relist
// beyond the periodic ones (on 1.37 the generic PLEG relists every second whatever the stream does: a
// stream error, counted, is what ends its fast path).
func (n *node) checkConsumingStream(before, now plegMetrics) {
	n.t.Helper()
	if now.ConnSuccess < 1 {
		n.t.Errorf("the kubelet never connected to the event stream: %s", now)
	}
	if now.ConnError != 0 {
		n.t.Errorf("the kubelet's event stream failed: %s", now)
	}
	if eventsTriggerRelist() {
		n.t.Logf("kubelet %s: the relist count is not checked (the generic PLEG relists every second by design); %g targeted pod relists since before",
			kubeletVersion, now.PodRelists-before.PodRelists)
		return
	}
	if d, allowed := now.Relists-before.Relists, n.periodicRelists(before.At, now.At); d > allowed {
		n.t.Errorf("the kubelet relisted %g times in %s (at most %g periodic relists expected): it fell back to relisting; before: %s; now: %s",
			d, now.At.Sub(before.At).Round(time.Millisecond), allowed, before, now)
	}
}

// waitPod waits until the kubelet reports the pod made from manifest name and cond accepts it.
func (n *node) waitPod(name, what string, cond func(p *kubelet.PodStatus) (bool, error)) *kubelet.PodStatus {
	n.t.Helper()
	var last *kubelet.PodStatus
	err := harness.WaitFor(context.Background(), podWaitTimeout, fmt.Sprintf("pod %s: %s", name, what), func() (bool, error) {
		p, err := n.k.Pod(name)
		if err != nil || p == nil {
			return false, err
		}
		last = p
		return cond(p)
	})
	if err != nil {
		n.t.Fatalf("%v\nlast status: %s", err, describePod(last))
	}
	return last
}

// waitPodStopped waits until the kubelet no longer reports the pod made from manifest name (uid) and
// containerd shows its sandboxes not ready and its containers exited: the kubelet stopped it.
func (n *node) waitPodStopped(name, uid string) {
	n.t.Helper()
	n.waitPodStoppedWithin(name, uid, podWaitTimeout)
}

// waitPodStoppedWithin is waitPodStopped with its own bound; a timeout names what was still not
// stopped. containerd is asked only once the kubelet dropped the pod (the wait polls every
// harness.WaitInterval, and the containers of a pod being stopped are what containerd is busy with).
func (n *node) waitPodStoppedWithin(name, uid string, timeout time.Duration) {
	n.t.Helper()
	stillRunning := func() []string {
		var out []string
		for _, sb := range n.sandboxes(uid) {
			if sb.GetState() != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
				out = append(out, "sandbox "+sb.GetId()+" "+sb.GetState().String())
			}
		}
		for _, c := range n.containers(uid) {
			if c.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
				out = append(out, "container "+c.GetMetadata().GetName()+" "+c.GetState().String())
			}
		}
		return out
	}
	err := harness.WaitFor(context.Background(), timeout, "pod "+name+" gone from the kubelet and stopped in containerd", func() (bool, error) {
		still, err := n.k.Pod(name)
		if err != nil || still != nil {
			return false, err
		}
		return len(stillRunning()) == 0, nil
	})
	if err != nil {
		pending := stillRunning()
		if still, _ := n.k.Pod(name); still != nil {
			pending = append([]string{"the kubelet still reports the pod"}, pending...)
		}
		n.t.Fatalf("%v; still not stopped: %s", err, strings.Join(pending, ", "))
	}
}

// running accepts a pod in phase Running whose every container runs and is ready.
func running(p *kubelet.PodStatus) (bool, error) {
	if p.Status.Phase != "Running" || len(p.Status.ContainerStatuses) == 0 {
		return false, nil
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running == nil || !c.Ready {
			return false, nil
		}
	}
	return true, nil
}

// restartedTo accepts a pod whose container name runs again after exactly restarts restarts.
func restartedTo(name string, restarts int32) func(p *kubelet.PodStatus) (bool, error) {
	return func(p *kubelet.PodStatus) (bool, error) {
		c := p.Container(name)
		if c == nil {
			return false, nil
		}
		if c.RestartCount > restarts {
			return false, fmt.Errorf("container %s restarted %d times, more than %d", name, c.RestartCount, restarts)
		}
		return c.RestartCount == restarts && c.State.Running != nil && c.LastState.Terminated != nil, nil
	}
}

func describePod(p *kubelet.PodStatus) string {
	if p == nil {
		return "(none)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s phase=%s ip=%s", p.Metadata.Name, p.Status.Phase, p.Status.PodIP)
	for _, c := range p.Status.ContainerStatuses {
		fmt.Fprintf(&b, "; %s ready=%t restarts=%d state=%s last=%s", c.Name, c.Ready, c.RestartCount,
			describeState(c.State), describeState(c.LastState))
	}
	return b.String()
}

func describeState(s kubelet.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running"
	case s.Waiting != nil:
		return "waiting(" + s.Waiting.Reason + ")"
	case s.Terminated != nil:
		return fmt.Sprintf("terminated(%d %s)", s.Terminated.ExitCode, s.Terminated.Reason)
	}
	return "none"
}

// podUIDLabel and containerNameLabel are the labels the kubelet puts on every container it creates.
const (
	podUIDLabel        = "io.kubernetes.pod.uid"
	containerNameLabel = "io.kubernetes.container.name"
)

// containers lists containerd's containers of the pod with that uid, with their statuses, oldest
// attempt first.
func (n *node) containers(uid string) []*runtimeapi.ContainerStatus {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	list, err := n.cri.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{podUIDLabel: uid}}})
	if err != nil {
		n.t.Fatalf("containerd ListContainers: %v", err)
	}
	var out []*runtimeapi.ContainerStatus
	for _, c := range list.GetContainers() {
		st, err := n.cri.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.Id})
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, st.GetStatus())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetMetadata().GetAttempt() < out[j].GetMetadata().GetAttempt() })
	return out
}

// emptyDir returns the host path of a pod's "state" emptyDir volume, where a test drops files its
// containers wait for.
func (n *node) emptyDir(uid string) string {
	return filepath.Join(n.k.RootDir, "pods", uid, "volumes", "kubernetes.io~empty-dir", "state")
}

// dupWatcher polls containerd for two running containers of the same name in one pod, whose processes
// are both alive: the kubelet bug that got EventedPLEG reverted upstream (k/k #121003, #123087) showed
// as exactly that.
type dupWatcher struct {
	mu sync.Mutex
	// seen records each duplicate once: "pod uid/container name: ids".
	seen map[string]bool
	// polls counts the polls that got an answer.
	polls int
}

func watchDuplicates(t testing.TB, cri runtimeapi.RuntimeServiceClient) *dupWatcher {
	w := &dupWatcher{seen: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			w.poll(ctx, cri)
			select {
			case <-ctx.Done():
			case <-time.After(containerdWaitPeriod):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		w.check(t)
		checkLifetimes(t, cri)
	})
	return w
}

// checkLifetimes fails when the lifetimes (started_at to finished_at, or now) of two containers of the
// same name in one pod overlap, among the containers containerd still has: it catches an overlap
// shorter than the watcher's polling period.
func checkLifetimes(t testing.TB, cri runtimeapi.RuntimeServiceClient) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := cri.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Errorf("containerd ListContainers: %v", err)
		return
	}
	type life struct {
		id         string
		start, end int64
	}
	byName := map[string][]life{}
	for _, c := range list.GetContainers() {
		st, err := cri.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.Id})
		if err != nil || st.GetStatus().GetStartedAt() == 0 {
			continue
		}
		end := st.GetStatus().GetFinishedAt()
		if end == 0 {
			if pid := containerdPID(ctx, cri, c.Id); pid == 0 || !testutil.Alive(pid) {
				// Exited, but containerd has not recorded it yet (it does once the task is deleted): its
				// end is unknown; the watcher covered its lifetime.
				continue
			}
			end = time.Now().UnixNano()
		}
		key := c.Labels[podUIDLabel] + "/" + c.Labels[containerNameLabel]
		byName[key] = append(byName[key], life{c.Id, st.GetStatus().GetStartedAt(), end})
	}
	for key, lives := range byName {
		sort.Slice(lives, func(i, j int) bool { return lives[i].start < lives[j].start })
		for i := 1; i < len(lives); i++ {
			if lives[i].start < lives[i-1].end {
				t.Errorf("containers %s and %s of %s ran at the same time (%s of overlap)", lives[i-1].id, lives[i].id, key,
					time.Duration(lives[i-1].end-lives[i].start))
			}
		}
	}
}

func (w *dupWatcher) poll(ctx context.Context, cri runtimeapi.RuntimeServiceClient) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	list, err := cri.ListContainers(cctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
	if err != nil {
		return // containerd restarting
	}
	byName := map[string][]string{}
	for _, c := range list.GetContainers() {
		key := c.Labels[podUIDLabel] + "/" + c.Labels[containerNameLabel]
		byName[key] = append(byName[key], c.Id)
	}
	var dups []string
	for key, ids := range byName {
		if len(ids) < 2 {
			continue
		}
		// containerd says RUNNING until it has deleted an exited container's task: only processes that
		// are alive count.
		var alive []string
		for _, id := range ids {
			if pid := containerdPID(cctx, cri, id); pid != 0 && testutil.Alive(pid) {
				alive = append(alive, fmt.Sprintf("%s (pid %d)", id, pid))
			}
		}
		if len(alive) > 1 {
			sort.Strings(alive)
			dups = append(dups, key+": "+strings.Join(alive, ", "))
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.polls++
	for _, d := range dups {
		w.seen[d] = true
	}
}

// containerdPID returns a container's pid from containerd's verbose status (0 when unknown).
func containerdPID(ctx context.Context, cri runtimeapi.RuntimeServiceClient, id string) int {
	resp, err := cri.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return 0
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if json.Unmarshal([]byte(resp.GetInfo()["info"]), &info) != nil {
		return 0
	}
	return info.Pid
}

func (w *dupWatcher) check(t testing.TB) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.polls == 0 {
		t.Errorf("the duplicate-container watcher never got an answer from containerd")
	}
	for d := range w.seen {
		t.Errorf("two running containers of the same name in one pod: %s", d)
	}
}

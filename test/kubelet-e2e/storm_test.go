package kubelete2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/plegnri"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/nodebench"
)

// The storm benchmark (make bench-storm), per setup: nodePodCount idle pods running (as in
// BenchmarkNodeCost), then
//   - delete: stormPods of them deleted at once (their manifests removed together), until the kubelet's
//     /pods has none of them and containerd shows every sandbox of them not ready;
//   - create: stormPods new pods created at once, until the kubelet reports every one Running;
//   - crash loop: stormCrashers more pods whose container crash-loops, for stormCrash once each has
//     restarted.
//
// Each phase records what it cost the node (measure), the events per second sent to the kubelet, and
// the latency of a probe calling containerd's own socket every stormProbeEvery. The counts and durations
// can be changed for a quicker look: PLEG_NRI_NODE_BENCH_PODS, PLEG_NRI_STORM_PODS,
// PLEG_NRI_STORM_CRASHERS, PLEG_NRI_STORM_WINDOW, PLEG_NRI_STORM_CRASH.
const (
	stormDefaultPods     = 100
	stormDefaultCrashers = 50
	// stormCrashScript is the crash-looping container: it runs a little, then fails.
	stormCrashScript = "sleep 2; exit 1"
	// stormPoll is the period of the test's reads of the kubelet's /pods and of containerd's sandboxes
	// during the delete and create phases: each read lists every pod, a load of the test's own that
	// a shorter period would make larger.
	stormPoll = 100 * time.Millisecond
	// stormProbeEvery is the period of the probe's calls to containerd.
	stormProbeEvery = 100 * time.Millisecond
	// stormTimeout bounds the wait for a phase's pods (a storm on a small machine takes minutes).
	stormTimeout = 5 * time.Minute
	// stormReportEnv names the markdown file BenchmarkNodeStorm writes (with the pod count in its name
	// when it is not nodeDefaultPods); the JSON goes beside it.
	stormReportEnv = "PLEG_NRI_STORM_MD"
)

// stormEnv are the environment variables that change the storm, for the command its report gives.
var stormEnv = []string{"PLEG_NRI_STORM_PODS", "PLEG_NRI_STORM_CRASHERS", "PLEG_NRI_STORM_WINDOW", "PLEG_NRI_STORM_CRASH"}

// BenchmarkNodeStorm measures, for each setup, how the kubelet, containerd and pleg-nri take many pods
// deleted at once, many created at once, and many containers crash-looping.
func BenchmarkNodeStorm(b *testing.B) {
	r := nodebench.StormReport{
		Kubelet:     kubeletVersion,
		CPUs:        runtime.NumCPU(),
		IdlePods:    nodePodCount(b),
		StormPods:   nodeCount(b, "PLEG_NRI_STORM_PODS", stormDefaultPods),
		Crashers:    nodeCount(b, "PLEG_NRI_STORM_CRASHERS", stormDefaultCrashers),
		CrashScript: stormCrashScript,
		Window:      nodeDuration(b, "PLEG_NRI_STORM_WINDOW", time.Minute),
		Crash:       nodeDuration(b, "PLEG_NRI_STORM_CRASH", 2*time.Minute),
		Poll:        stormPoll,
		Probe:       stormProbeEvery,
	}
	// At most the idle pods and the new ones at once (the deleted ones leave the kubelet's count as it
	// sees their manifests go, but may still be stopping), then the crashers.
	r.MaxPods = maxPodsFor(r.IdlePods + r.StormPods + r.Crashers)
	r.Command = nodebench.MakeCommand("bench-storm", kubeletVersion, r.IdlePods, nodeDefaultPods, envOverrides(stormEnv...))
	for _, s := range allSetups {
		b.Run(strings.ReplaceAll(s.Name, " ", "_"), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				r.Runs = append(r.Runs, runStorm(b, s, r))
			}
		})
	}
	path := os.Getenv(stormReportEnv)
	if path == "" || len(r.Runs) != len(allSetups) {
		return
	}
	r.Date = time.Now().UTC().Format("2006-01-02 15:04 MST")
	path = nodebench.ReportPath(path, r.IdlePods, nodeDefaultPods)
	if err := os.WriteFile(path, []byte(nodebench.StormMarkdown(r)), 0o644); err != nil {
		b.Fatal(err)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(strings.TrimSuffix(path, ".md")+".json", js, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Logf("wrote %s", path)
}

func runStorm(b *testing.B, s setup, r nodebench.StormReport) nodebench.StormRun {
	b.StopTimer()
	n := startNode(b, s, nodeOptions{quiet: true, noDupWatch: true, maxPods: r.MaxPods})
	n.startIdlePods(r.IdlePods)
	limits := n.limits()
	run := nodebench.StormRun{Setup: s.Name, Evented: s.Evented, PlegNRI: s.PlegNRI, Limits: &limits}
	b.StartTimer()

	// delete: the first pods, their manifests removed together.
	var names []string
	for i := range min(r.StormPods, r.IdlePods) {
		names = append(names, idlePod(i).Name)
	}
	uids := n.podUIDs(names)
	run.Phases = append(run.Phases, n.stormPhase(s, nodebench.PhaseDelete, len(names), r.Window, func(ph *nodebench.StormPhase) {
		var list []string
		for _, name := range names {
			list = append(list, uids[name])
		}
		w := watchSandboxes(b, n, list, stormPoll)
		removed := map[string]int64{}
		for _, name := range names {
			removed[name] = time.Now().UnixNano()
			if err := n.k.RemovePod(name); err != nil {
				b.Fatalf("removing pod %s: %v", name, err)
			}
		}
		gone := n.kubeletTimes(names, func(p *kubelet.PodStatus) bool { return p == nil })
		deadline := time.Now().Add(stormTimeout)
		for !w.allStopped() && time.Now().Before(deadline) {
			time.Sleep(stormPoll)
		}
		w.stop()
		stopped := map[string]int64{}
		for _, name := range names {
			stopped[name] = w.stoppedAt(uids[name])
		}
		ms, last, missing := nodebench.Latencies(names, removed, gone)
		ph.Kubelet, ph.KubeletLastMs, ph.KubeletMissing = nodebench.QuantilesOf(ms), last, missing
		ms, last, missing = nodebench.Latencies(names, removed, stopped)
		q := nodebench.QuantilesOf(ms)
		ph.Containerd, ph.ContainerdLastMs, ph.ContainerdMissing = &q, last, missing
	}))

	// create: new pods, their manifests written together.
	names = nil
	for i := range r.StormPods {
		names = append(names, fmt.Sprintf("burst%03d", i))
	}
	run.Phases = append(run.Phases, n.stormPhase(s, nodebench.PhaseCreate, len(names), r.Window, func(ph *nodebench.StormPhase) {
		written := map[string]int64{}
		for _, name := range names {
			p := idlePod(0)
			p.Name = name
			written[name] = time.Now().UnixNano()
			if err := n.k.WritePod(p); err != nil {
				b.Fatalf("writing pod %s: %v", name, err)
			}
		}
		up := n.kubeletTimes(names, func(p *kubelet.PodStatus) bool {
			if p == nil {
				return false
			}
			ok, _ := running(p)
			return ok
		})
		ms, last, missing := nodebench.Latencies(names, written, up)
		ph.Kubelet, ph.KubeletLastMs, ph.KubeletMissing = nodebench.QuantilesOf(ms), last, missing
	}))

	// crash loop: measured once every crasher has restarted.
	names = nil
	for i := range r.Crashers {
		p := kubelet.Pod{Name: fmt.Sprintf("crash%03d", i), HostNetwork: true,
			Containers: []kubelet.Container{{Name: "crash", Script: stormCrashScript}}}
		names = append(names, p.Name)
		if err := n.k.WritePod(p); err != nil {
			b.Fatalf("writing pod %s: %v", p.Name, err)
		}
	}
	restarted := n.kubeletTimes(names, func(p *kubelet.PodStatus) bool {
		c := p.Container("crash")
		return c != nil && c.RestartCount >= 1
	})
	if len(restarted) != len(names) {
		b.Errorf("%s: %d of %d crash-looping pods restarted within %s", s.Name, len(restarted), len(names), stormTimeout)
	}
	restarts0 := n.restarts(names)
	run.Phases = append(run.Phases, n.stormPhase(s, nodebench.PhaseCrash, len(names), r.Crash, func(ph *nodebench.StormPhase) {}))
	restarts := n.restarts(names) - restarts0
	run.Phases[len(run.Phases)-1].Restarts = &restarts
	b.StopTimer()

	for _, ph := range run.Phases {
		b.Logf("%s %s: kubelet p50 %s last %s (%d missing); node %.2f CPU s/min; probe Version p99 %s, ListPodSandbox p99 %s",
			s.Name, ph.Phase, nodebench.Seconds(ph.Kubelet.P50), nodebench.Seconds(ph.KubeletLastMs), ph.KubeletMissing, ph.Cost.Node(),
			nodebench.Cell(ph.Probe["Version"].P99), nodebench.Cell(ph.Probe["ListPodSandbox"].P99))
	}
	return run
}

// stormPhase measures one phase: work (which fills in the phase's own figures), and at least window
// from its start. It records what the node spent (measure), the events sent to the kubelet, and the
// probe's latencies.
func (n *node) stormPhase(s setup, name string, pods int, window time.Duration, work func(ph *nodebench.StormPhase)) nodebench.StormPhase {
	n.t.Helper()
	ph := nodebench.StormPhase{Phase: name, Pods: pods}
	e0 := n.eventCounts()
	probe := probeContainerd(n.t, stormProbeEvery)
	ph.Cost = n.measure(s, name, 0, func() {
		start := time.Now()
		work(&ph)
		time.Sleep(time.Until(start.Add(window)))
	})
	ph.Probe, ph.ProbeErrors = probe.stop()
	e1 := n.eventCounts()
	perSec := func(a, b *float64) *float64 {
		if a == nil || b == nil {
			return nil
		}
		v := (*b - *a) / ph.Cost.Seconds
		return &v
	}
	ph.KubeletEvents = perSec(e0.kubelet, e1.kubelet)
	ph.PlegNRIEvents = perSec(e0.plegNRI, e1.plegNRI)
	ph.ContainerdStreamMessages = perSec(e0.containerdStream, e1.containerdStream)
	return ph
}

// eventCounts are the counters of events sent to the kubelet at one moment (nil: not counted in the
// setup).
type eventCounts struct {
	// kubelet are the events the kubelet took from its stream (EventedPLEG), plegNRI those pleg-nri
	// emitted, containerdStream the messages containerd sent on its GetContainerEvents streams.
	kubelet, plegNRI, containerdStream *float64
}

func (n *node) eventCounts() eventCounts {
	n.t.Helper()
	var c eventCounts
	if n.setup.Evented {
		v := n.metric(metricEventsReceived)
		c.kubelet = &v
	}
	if n.p != nil {
		v, err := n.p.Metric("pleg_nri_events_emitted_total")
		if err != nil {
			n.t.Fatalf("pleg-nri's metrics: %v", err)
		}
		c.plegNRI = &v
	}
	if n.setup.Evented && n.p == nil {
		c.containerdStream = containerdStreamMessages(n.t)
	}
	return c
}

// containerdStreamMessages returns the messages containerd sent on its CRI event streams
// (grpc_server_msg_sent_total of GetContainerEvents), nil when its metrics are off or do not count them.
func containerdStreamMessages(t testing.TB) *float64 {
	if env.MetricsAddress == "" {
		return nil
	}
	resp, err := http.Get("http://" + env.MetricsAddress + "/v1/metrics")
	if err != nil {
		t.Fatalf("containerd's metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("containerd's metrics: %v", err)
	}
	const name, method = "grpc_server_msg_sent_total", `grpc_method="GetContainerEvents"`
	if !bytes.Contains(body, []byte(name)) || !bytes.Contains(body, []byte(method)) {
		return nil
	}
	v, err := plegnri.SumMetric(bytes.NewReader(body), name, method)
	if err != nil {
		t.Fatalf("containerd's metrics: %v", err)
	}
	return &v
}

// podUIDs returns the uids of the kubelet's pods made from the manifests names.
func (n *node) podUIDs(names []string) map[string]string {
	n.t.Helper()
	out := map[string]string{}
	for _, name := range names {
		p, err := n.k.Pod(name)
		if err != nil || p == nil {
			n.t.Fatalf("pod %s: %v (the kubelet has it: %t)", name, err, p != nil)
		}
		out[name] = p.Metadata.UID
	}
	return out
}

// kubeletTimes reads the kubelet's /pods every stormPoll until done accepts every pod of names (its
// status; nil when the kubelet does not have it), or for stormTimeout, and returns when each was first
// accepted (nanoseconds since the epoch; absent: never).
func (n *node) kubeletTimes(names []string, done func(p *kubelet.PodStatus) bool) map[string]int64 {
	n.t.Helper()
	at := map[string]int64{}
	deadline := time.Now().Add(stormTimeout)
	for len(at) < len(names) && time.Now().Before(deadline) {
		pods, err := n.k.Pods()
		now := time.Now().UnixNano()
		if err != nil {
			n.t.Logf("the kubelet's /pods: %v", err)
		} else {
			byName := map[string]*kubelet.PodStatus{}
			for i := range pods {
				byName[pods[i].Metadata.Name] = &pods[i]
			}
			for _, name := range names {
				if at[name] == 0 && done(byName[name+"-"+kubelet.NodeName]) {
					at[name] = now
				}
			}
		}
		time.Sleep(stormPoll)
	}
	if len(at) < len(names) {
		n.t.Logf("%s: %d of %d pods not there within %s", n.setup.Name, len(names)-len(at), len(names), stormTimeout)
	}
	return at
}

// restarts sums the restart counts the kubelet reports for the pods made from the manifests names.
func (n *node) restarts(names []string) float64 {
	n.t.Helper()
	pods, err := n.k.Pods()
	if err != nil {
		n.t.Fatalf("the kubelet's /pods: %v", err)
	}
	want := map[string]bool{}
	for _, name := range names {
		want[name+"-"+kubelet.NodeName] = true
	}
	var sum float64
	for _, p := range pods {
		if want[p.Metadata.Name] {
			for _, c := range p.Status.ContainerStatuses {
				sum += float64(c.RestartCount)
			}
		}
	}
	return sum
}

// containerdProbe calls containerd's own socket every period, on a connection of its own, and keeps
// each call's latency by method.
type containerdProbe struct {
	cancel context.CancelFunc
	done   chan struct{}
	// mu guards ms and errors.
	mu     sync.Mutex
	ms     map[string][]float64
	errors int
}

// probeContainerd starts a probe; stop ends it and returns what it saw.
func probeContainerd(t testing.TB, period time.Duration) *containerdProbe {
	conn, err := grpc.NewClient("unix://"+env.Address, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		t.Fatalf("probe's connection to containerd: %v", err)
	}
	cri := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	p := &containerdProbe{cancel: cancel, done: make(chan struct{}), ms: map[string][]float64{}}
	calls := map[string]func(context.Context) error{
		"Version": func(ctx context.Context) error {
			_, err := cri.Version(ctx, &runtimeapi.VersionRequest{})
			return err
		},
		"ListPodSandbox": func(ctx context.Context) error {
			_, err := cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
			return err
		},
	}
	go func() {
		defer close(p.done)
		defer conn.Close()
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			for _, m := range nodebench.ProbeMethods {
				cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
				start := time.Now()
				err := calls[m](cctx)
				ms := float64(time.Since(start)) / 1e6
				ccancel()
				if ctx.Err() != nil {
					return
				}
				p.mu.Lock()
				if err != nil {
					p.errors++
				} else {
					p.ms[m] = append(p.ms[m], ms)
				}
				p.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

func (p *containerdProbe) stop() (map[string]nodebench.Quantiles, int) {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]nodebench.Quantiles{}
	for m, ms := range p.ms {
		out[m] = nodebench.QuantilesOf(ms)
	}
	return out, p.errors
}

package containerdit

// The side-by-side benchmarks of docs/design.md section 7, against the harness's real containerd: task
// exit -> subscriber latency on containerd's stream and on pleg-nri's, the plugin's NRI callback time,
// forwarded unary calls direct vs proxied, and pod start with and without pleg-nri. `make bench` runs
// them once each:
//
//	PLEG_NRI_BENCH_RESULTS=/tmp/r.json go test -run '^$' -bench . -benchtime=1x ./test/containerd-it/
//
// Each benchmark runs one fixed workload whatever b.N is, reports its key figures with b.ReportMetric,
// and merges its raw samples into the JSON results file (PLEG_NRI_BENCH_RESULTS, default
// $TMPDIR/pleg-nri-bench.json) that cmd/bench-report turns into docs/benchmarks.md. They assert no
// timing: the machine is shared and noisy; the report compares medians and ratios.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/containerd"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/pleg"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

const (
	// Exit latency workload: exitPods pods, each running exitPerPod short-lived containers per batch.
	exitPods, exitPerPod, exitBatches = 6, 4, 10
	// exitSpacing is the mean time between two exits of a batch.
	exitSpacing = 60 * time.Millisecond
	// Forwarded unary calls per method and side, after proxyWarmup of each.
	proxyCalls, proxyWarmup = 2000, 200
	// Pod start: podRounds rounds of two phases (ABBA order) of podsPerPhase timed pods each.
	podRounds, podsPerPhase = 10, 6
)

// benchExitCodes are the exit statuses of the exit latency workload, in turn.
var benchExitCodes = []int{0, 1, 137}

// BenchmarkExitLatency measures task exit -> STOPPED event received on containerd's own stream and on
// pleg-nri's, both subscribed during the same workload, then reads the plugin's NRI callback time
// histogram that the same workload filled.
func BenchmarkExitLatency(b *testing.B) {
	p := startPlegNRI(b, benchPlegFlags...)
	cd := subscribeStamped(b, env.Address)
	pn := subscribeStamped(b, p.Socket)
	te := watchTaskExits(b, env.Address)
	waits := newTaskWaits(b, env.Address)
	rt := benchRuntime(b, env.Address)

	type pod struct {
		id  string
		cfg *runtimeapi.PodSandboxConfig
	}
	var pods []pod
	for i := range exitPods {
		id, cfg := benchRunPod(b, rt, fmt.Sprintf("bench-exit-%d", i))
		pods = append(pods, pod{id, cfg})
	}
	// Each container blocks reading its own FIFO in a host directory mounted at /trigger, and exits when
	// the benchmark writes to it: the exits are paced (exitSpacing apart, jittered) and happen after the
	// batch's creates and starts, so what is measured is the exit's path to the subscribers, not a queue
	// behind this benchmark's own container starts.
	trigger, err := os.MkdirTemp("", "plegnri-bench-exit-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(trigger) })
	if err := os.Chmod(trigger, 0o755); err != nil {
		b.Fatal(err)
	}
	res := &benchreport.ExitLatency{Pods: exitPods, Batches: exitBatches, SpacingMs: float64(exitSpacing.Milliseconds())}
	for batch := range exitBatches {
		type job struct {
			pod  pod
			name string
			fifo string
		}
		var jobs []job
		for _, pd := range pods {
			for j := range exitPerPod {
				name := fmt.Sprintf("exit-%d-%d", batch, j)
				fifo := fmt.Sprintf("%s-%d", name, len(jobs))
				if err := syscall.Mkfifo(filepath.Join(trigger, fifo), 0o666); err != nil {
					b.Fatal(err)
				}
				jobs = append(jobs, job{pd, name, fifo})
			}
		}
		ids := make([]string, len(jobs))
		parallel(b, len(jobs), 4, func(i int) error {
			jb := jobs[i]
			// A third of the exits have status 137, which pleg-nri checks for an OOM kill before its
			// STOPPED, as containerd does (issue 11): their latency is reported apart too.
			c := harness.ContainerConfig(jb.name, fmt.Sprintf("read x < /trigger/%s; exit %d", jb.fifo, benchExitCodes[(batch+i)%len(benchExitCodes)]))
			c.Mounts = append(c.Mounts, &runtimeapi.Mount{ContainerPath: "/trigger", HostPath: trigger})
			resp, err := rt.CreateContainer(b.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: jb.pod.id, Config: c, SandboxConfig: jb.pod.cfg})
			if err != nil {
				return fmt.Errorf("CreateContainer %s: %w", jb.name, err)
			}
			ids[i] = resp.ContainerId
			if _, err := rt.StartContainer(b.Context(), &runtimeapi.StartContainerRequest{ContainerId: ids[i]}); err != nil {
				return fmt.Errorf("StartContainer %s: %w", jb.name, err)
			}
			return waits.wait(ids[i])
		})
		for _, i := range rand.Perm(len(jobs)) {
			releaseFIFO(b, filepath.Join(trigger, jobs[i].fifo))
			time.Sleep(exitSpacing/2 + rand.N(exitSpacing))
		}
		// Wait until both streams delivered every STOPPED event (or give up on a stream after 20 s: what
		// is missing is counted below).
		_ = testutil.Poll(b.Context(), 20*time.Second, "every STOPPED on both streams", func() (bool, error) {
			for _, id := range ids {
				_, ok1 := cd.at(id, evStopped)
				_, ok2 := pn.at(id, evStopped)
				if !ok1 || !ok2 {
					return false, nil
				}
			}
			return true, nil
		})
		missed := 0
		for _, id := range ids {
			st, err := rt.ContainerStatus(b.Context(), &runtimeapi.ContainerStatusRequest{ContainerId: id})
			if err != nil {
				b.Fatalf("ContainerStatus %s: %v", short(id), err)
			}
			if st.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.Status.FinishedAt == 0 {
				b.Fatalf("container %s is %s (finished_at %d) after its STOPPED wait", short(id), st.Status.State, st.Status.FinishedAt)
			}
			fin := st.Status.FinishedAt
			x := benchreport.Exit{ID: id, ExitCode: st.Status.ExitCode, FinishedAt: fin, ContainerdMs: -1, PlegNRIMs: -1,
				PublishedMs: -1, TaskEventMs: -1, WaitMs: -1, EmittedMs: -1}
			if pub, got, ok := te.at(id); ok {
				x.PublishedMs = float64(pub.UnixNano()-fin) / 1e6
				x.TaskEventMs = float64(got.UnixNano()-fin) / 1e6
			}
			if got, ok := waits.at(id); ok {
				x.WaitMs = float64(got.UnixNano()-fin) / 1e6
			}
			if c := pn.createdAt(id, evStopped); c != 0 {
				x.EmittedMs = float64(c-fin) / 1e6
			}
			if at, ok := cd.at(id, evStopped); ok {
				x.ContainerdMs = float64(at.UnixNano()-fin) / 1e6
			}
			if at, ok := pn.at(id, evStopped); ok {
				x.PlegNRIMs = float64(at.UnixNano()-fin) / 1e6
			} else {
				missed++
			}
			res.Exits = append(res.Exits, x)
		}
		if missed > 0 {
			b.Logf("batch %d: pleg-nri's stream missed %d STOPPED events", batch, missed)
		}
		parallel(b, len(ids), 4, func(i int) error {
			if _, err := rt.RemoveContainer(b.Context(), &runtimeapi.RemoveContainerRequest{ContainerId: ids[i]}); err != nil {
				return fmt.Errorf("RemoveContainer %s: %w", short(ids[i]), err)
			}
			return nil
		})
	}
	if err := cd.Err(); err != nil {
		b.Errorf("containerd's stream ended: %v", err)
	}
	if err := pn.Err(); err != nil {
		b.Errorf("pleg-nri's stream ended: %v", err)
	}

	// The NRI callback time histogram, filled by this workload, and where pleg-nri's latency goes.
	resp, err := http.Get("http://" + p.MetricsAddr + "/metrics")
	if err != nil {
		b.Fatalf("metrics: %v", err)
	}
	text, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		b.Fatalf("metrics: %v", err)
	}
	hook, err := benchreport.ParseHistogram(bytes.NewReader(text), "pleg_nri_hook_duration_seconds", "callback",
		func(labels string) bool { return strings.Contains(labels, `callback="Synchronize"`) })
	if err != nil {
		b.Fatal(err)
	}
	internals := map[string]*benchreport.Hook{}
	if h, err := benchreport.ParseHistogram(bytes.NewReader(text), "pleg_nri_event_emit_latency_seconds", "source",
		func(labels string) bool { return !strings.Contains(labels, `type="stopped"`) }); err == nil {
		internals[`pleg_nri_event_emit_latency_seconds{type="stopped"}`] = h
	} else {
		b.Logf("pleg-nri's metrics: %v", err)
	}
	for name, by := range map[string]string{
		"pleg_nri_event_emit_latency_seconds":   "source",
		"pleg_nri_event_send_latency_seconds":   "",
		"pleg_nri_status_call_duration_seconds": "kind",
		"pleg_nri_oom_check_duration_seconds":   "result",
	} {
		if h, err := benchreport.ParseHistogram(bytes.NewReader(text), name, by, nil); err == nil {
			internals[name] = h
		} else {
			b.Logf("pleg-nri's metrics: %v", err)
		}
	}

	cdMs, cdMiss := res.Latencies(false)
	pnMs, pnMiss := res.Latencies(true)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(len(res.Exits)), "exits")
	b.ReportMetric(benchreport.Median(cdMs), "containerd-p50-ms")
	b.ReportMetric(benchreport.Quantile(cdMs, .99), "containerd-p99-ms")
	b.ReportMetric(benchreport.Median(pnMs), "plegnri-p50-ms")
	b.ReportMetric(benchreport.Quantile(pnMs, .99), "plegnri-p99-ms")
	b.ReportMetric(float64(pnMiss), "plegnri-missed")
	b.ReportMetric(benchreport.HistogramQuantile(hook.Buckets, .99)*1e6, "hook-p99-us")
	b.Logf("%d exits: containerd p50 %.2f ms p99 %.2f ms (missed %d); pleg-nri p50 %.2f ms p99 %.2f ms (missed %d); hook p50 %.1f µs p99 %.1f µs over %.0f callbacks",
		len(res.Exits), benchreport.Median(cdMs), benchreport.Quantile(cdMs, .99), cdMiss,
		benchreport.Median(pnMs), benchreport.Quantile(pnMs, .99), pnMiss,
		benchreport.HistogramQuantile(hook.Buckets, .5)*1e6, benchreport.HistogramQuantile(hook.Buckets, .99)*1e6, hook.Count)
	for _, code := range benchExitCodes {
		var cd, pn []float64
		for _, x := range res.Exits {
			if x.ExitCode != int32(code) {
				continue
			}
			if x.ContainerdMs >= 0 {
				cd = append(cd, x.ContainerdMs)
			}
			if x.PlegNRIMs >= 0 {
				pn = append(pn, x.PlegNRIMs)
			}
		}
		b.Logf("exit status %d: n %d: containerd p50 %.2f ms p99 %.2f ms; pleg-nri p50 %.2f ms p99 %.2f ms", code, len(pn),
			benchreport.Median(cd), benchreport.Quantile(cd, .99), benchreport.Median(pn), benchreport.Quantile(pn, .99))
		if code == 137 {
			b.ReportMetric(benchreport.Median(cd), "containerd-137-p50-ms")
			b.ReportMetric(benchreport.Median(pn), "plegnri-137-p50-ms")
		}
	}
	for _, st := range []struct {
		name string
		f    func(benchreport.Exit) float64
	}{
		{"published", func(x benchreport.Exit) float64 { return x.PublishedMs }},
		{"task event received", func(x benchreport.Exit) float64 { return x.TaskEventMs }},
		{"task.Wait answered", func(x benchreport.Exit) float64 { return x.WaitMs }},
		{"pleg-nri emitted", func(x benchreport.Exit) float64 { return x.EmittedMs }},
		{"pleg-nri received", func(x benchreport.Exit) float64 { return x.PlegNRIMs }},
	} {
		v := res.Stage(st.f)
		b.Logf("exit -> %s: n %d p50 %.2f ms p90 %.2f ms p99 %.2f ms", st.name, len(v),
			benchreport.Median(v), benchreport.Quantile(v, .9), benchreport.Quantile(v, .99))
	}
	for name, h := range internals {
		b.Logf("%s: count %.0f p50 %.2f ms p99 %.2f ms %v", name, h.Count, benchreport.HistogramQuantile(h.Buckets, .5)*1e3,
			benchreport.HistogramQuantile(h.Buckets, .99)*1e3, h.ByCallback)
	}
	saveBench(b, func(r *benchreport.Results) { r.ExitLatency, r.Hook, r.Internals = res, hook, internals })
}

// BenchmarkProxyUnary measures forwarded unary calls (Version, ListContainers) direct to containerd and
// through pleg-nri, alternating A/B per iteration.
func BenchmarkProxyUnary(b *testing.B) {
	p := startPlegNRI(b, benchPlegFlags...)
	direct := benchRuntime(b, env.Address)
	proxied := benchRuntime(b, p.Socket)
	benchSleepers(b, direct, "bench-proxy", 4, 3)
	time.Sleep(500 * time.Millisecond) // let the events of the setup settle
	res := &benchreport.Proxy{Methods: []benchreport.ProxyMethod{
		benchInterleaved(b, "Version", direct, proxied, func(rt runtimeapi.RuntimeServiceClient) (int, error) {
			_, err := rt.Version(b.Context(), &runtimeapi.VersionRequest{})
			return 0, err
		}),
		benchInterleaved(b, "ListContainers", direct, proxied, benchListContainers(b)),
	}}
	b.ReportMetric(0, "ns/op")
	saveBench(b, func(r *benchreport.Results) { r.Proxy = res })
}

// benchSleepers runs pods pods with perPod sleeping containers each on rt (something to list), and
// returns the containers' ids.
func benchSleepers(b *testing.B, rt runtimeapi.RuntimeServiceClient, prefix string, pods, perPod int) []string {
	var ids []string
	for i := range pods {
		id, cfg := benchRunPod(b, rt, fmt.Sprintf("%s-%d", prefix, i))
		for j := range perPod {
			c := harness.ContainerConfig(fmt.Sprintf("sleeper-%d", j), "sleep 3600")
			resp, err := rt.CreateContainer(b.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: id, Config: c, SandboxConfig: cfg})
			if err != nil {
				b.Fatalf("CreateContainer: %v", err)
			}
			if _, err := rt.StartContainer(b.Context(), &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
				b.Fatalf("StartContainer: %v", err)
			}
			ids = append(ids, resp.ContainerId)
		}
	}
	return ids
}

// benchListContainers lists every container, and says how many.
func benchListContainers(b *testing.B) func(rt runtimeapi.RuntimeServiceClient) (int, error) {
	return func(rt runtimeapi.RuntimeServiceClient) (int, error) {
		resp, err := rt.ListContainers(b.Context(), &runtimeapi.ListContainersRequest{})
		return len(resp.GetContainers()), err
	}
}

// benchInterleaved times proxyCalls calls of method on direct and on other, alternating which goes
// first, after proxyWarmup of each.
func benchInterleaved(b *testing.B, method string, direct, other runtimeapi.RuntimeServiceClient, call func(runtimeapi.RuntimeServiceClient) (int, error)) benchreport.ProxyMethod {
	pm := benchreport.ProxyMethod{Method: method}
	timed := func(rt runtimeapi.RuntimeServiceClient) float64 {
		start := time.Now()
		n, err := call(rt)
		d := time.Since(start)
		if err != nil {
			b.Fatalf("%s: %v", method, err)
		}
		pm.Items = n
		return float64(d.Nanoseconds()) / 1e3
	}
	for range proxyWarmup {
		timed(direct)
		timed(other)
	}
	for i := range proxyCalls {
		if i%2 == 0 {
			pm.DirectUs = append(pm.DirectUs, timed(direct))
			pm.ProxiedUs = append(pm.ProxiedUs, timed(other))
		} else {
			pm.ProxiedUs = append(pm.ProxiedUs, timed(other))
			pm.DirectUs = append(pm.DirectUs, timed(direct))
		}
	}
	d50, p50 := benchreport.Median(pm.DirectUs), benchreport.Median(pm.ProxiedUs)
	b.ReportMetric(d50, method+"-direct-p50-us")
	b.ReportMetric(p50, method+"-proxied-p50-us")
	b.ReportMetric(p50-d50, method+"-added-p50-us")
	b.Logf("%s (%d calls each): direct p50 %.0f µs p90 %.0f µs p99 %.0f µs, through pleg-nri p50 %.0f µs p90 %.0f µs p99 %.0f µs, difference p50 %+.0f µs",
		method, proxyCalls, d50, benchreport.Quantile(pm.DirectUs, .9), benchreport.Quantile(pm.DirectUs, .99),
		p50, benchreport.Quantile(pm.ProxiedUs, .9), benchreport.Quantile(pm.ProxiedUs, .99), p50-d50)
	return pm
}

// BenchmarkPodStart measures RunPodSandbox + CreateContainer + StartContainer with pleg-nri connected,
// with pleg-nri connected but no state-dir (a control: no checkpoint), and without pleg-nri, in phases
// whose order rotates from round to round, one pod at a time.
func BenchmarkPodStart(b *testing.B) {
	rt := benchRuntime(b, env.Address)
	// A kubelet's subscriber on containerd's own stream, in every phase.
	subscribeStamped(b, env.Address)
	res := &benchreport.PodStart{Rounds: podRounds}
	n := 0
	const (
		phaseWithout = iota
		phaseWith
		phaseNoStateDir
	)
	phase := func(kind int) {
		var p *plegNRI
		if kind != phaseWithout {
			flags := benchPlegFlags
			if kind == phaseNoStateDir {
				flags = append(slices.Clone(benchPlegFlags), "--state-dir=")
			}
			p = startPlegNRI(b, flags...)
			sub := subscribeStamped(b, p.Socket)
			defer sub.close()
			defer p.stop()
			time.Sleep(300 * time.Millisecond)
		}
		for i := -1; i < podsPerPhase; i++ { // pod -1 warms the phase up, untimed
			n++
			cfg := env.PodConfig(fmt.Sprintf("bench-start-%d", n))
			start := time.Now()
			run, err := rt.RunPodSandbox(b.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
			if err != nil {
				b.Fatalf("RunPodSandbox: %v", err)
			}
			c, err := rt.CreateContainer(b.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: run.PodSandboxId,
				Config: harness.ContainerConfig("sleeper", "sleep 3600"), SandboxConfig: cfg})
			if err != nil {
				b.Fatalf("CreateContainer: %v", err)
			}
			if _, err := rt.StartContainer(b.Context(), &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
				b.Fatalf("StartContainer: %v", err)
			}
			d := float64(time.Since(start).Microseconds()) / 1e3
			if _, err := rt.StopPodSandbox(b.Context(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: run.PodSandboxId}); err != nil {
				b.Fatalf("StopPodSandbox: %v", err)
			}
			if _, err := rt.RemovePodSandbox(b.Context(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: run.PodSandboxId}); err != nil {
				b.Fatalf("RemovePodSandbox: %v", err)
			}
			if i < 0 {
				continue
			}
			switch kind {
			case phaseWith:
				res.WithMs = append(res.WithMs, d)
			case phaseNoStateDir:
				res.WithNoStateDirMs = append(res.WithNoStateDirMs, d)
			default:
				res.WithoutMs = append(res.WithoutMs, d)
			}
		}
	}
	// Each round runs the three phases in an order of its own: every phase comes first, second and
	// third in turn, forwards and backwards.
	for r := range podRounds {
		order := []int{phaseWith, phaseWithout, phaseNoStateDir}
		k := r % len(order)
		order = append(order[k:], order[:k]...)
		if r/len(order)%2 == 1 {
			slices.Reverse(order)
		}
		for _, kind := range order {
			phase(kind)
		}
	}
	with, without := benchreport.Median(res.WithMs), benchreport.Median(res.WithoutMs)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(without, "without-p50-ms")
	b.ReportMetric(with, "with-p50-ms")
	b.ReportMetric((with-without)/without*100, "overhead-%")
	noState := benchreport.Median(res.WithNoStateDirMs)
	b.ReportMetric(noState, "with-no-state-dir-p50-ms")
	b.Logf("pod start, %d pods each: without pleg-nri p50 %.1f ms, with %.1f ms (%+.1f%%), with and no state-dir %.1f ms (%+.1f%%)",
		len(res.WithMs), without, with, (with-without)/without*100, noState, (noState-without)/without*100)
	saveBench(b, func(r *benchreport.Results) { r.PodStart = res })
}

// releaseFIFO writes a line to the FIFO a container is blocked reading, which lets it exit. The container
// may not have opened it yet: the open (non-blocking, so that it fails with ENXIO while there is no
// reader) is retried every 5 ms for 20 s.
func releaseFIFO(tb testing.TB, path string) {
	tb.Helper()
	var f *os.File
	err := testutil.PollEvery(context.Background(), 20*time.Second, 5*time.Millisecond, "a reader of "+path, func() (bool, error) {
		var err error
		f, err = os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil && !errors.Is(err, syscall.ENXIO) {
			return false, testutil.Stop(err)
		}
		return err == nil, err
	})
	if err != nil {
		tb.Fatalf("open %s: %v", path, err)
	}
	_, err = f.WriteString("go\n")
	f.Close()
	if err != nil {
		tb.Fatalf("write %s: %v", path, err)
	}
}

// saveBench merges a benchmark's results into the results file.
func saveBench(b *testing.B, fn func(*benchreport.Results)) {
	b.Helper()
	path := os.Getenv("PLEG_NRI_BENCH_RESULTS")
	if path == "" {
		path = filepath.Join(os.TempDir(), "pleg-nri-bench.json")
	}
	err := benchreport.Update(path, func(r *benchreport.Results) {
		if r.Date == "" {
			r.Date = time.Now().UTC().Format(time.RFC3339)
		}
		if r.Machine == "" {
			r.Machine = benchMachine()
		}
		if avg, err := os.ReadFile("/proc/loadavg"); err == nil {
			if r.Load == nil {
				r.Load = map[string]string{}
			}
			r.Load[strings.TrimSuffix(b.Name(), fmt.Sprintf("-%d", runtime.GOMAXPROCS(0)))] = strings.Join(strings.Fields(string(avg))[:3], " ")
		}
		fn(r)
	})
	if err != nil {
		b.Fatalf("results: %v", err)
	}
	b.Logf("results merged into %s", path)
}

// benchMachine describes the machine and the containerd the benchmarks ran on.
func benchMachine() string {
	parts := []string{fmt.Sprintf("%d CPUs", runtime.NumCPU())}
	if rel, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		parts = append(parts, "Linux "+strings.TrimSpace(string(rel)))
	}
	if conn, err := harness.DialUnix(env.Address); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if v, err := runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{}); err == nil {
			parts = append(parts, "containerd "+v.RuntimeVersion)
		}
		conn.Close()
	}
	parts = append(parts, runtime.Version())
	return strings.Join(parts, ", ")
}

// benchRuntime dials a CRI runtime client for the benchmark.
func benchRuntime(tb testing.TB, socket string) runtimeapi.RuntimeServiceClient {
	tb.Helper()
	conn, err := harness.DialUnix(socket)
	if err != nil {
		tb.Fatalf("dial %s: %v", socket, err)
	}
	tb.Cleanup(func() { conn.Close() })
	return runtimeapi.NewRuntimeServiceClient(conn)
}

// benchRunPod runs a pod that is stopped and removed when the benchmark ends.
func benchRunPod(tb testing.TB, rt runtimeapi.RuntimeServiceClient, name string) (string, *runtimeapi.PodSandboxConfig) {
	tb.Helper()
	cfg := env.PodConfig(name)
	resp, err := rt.RunPodSandbox(tb.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		tb.Fatalf("RunPodSandbox %s: %v", name, err)
	}
	id := resp.PodSandboxId
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
		_, _ = rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
	})
	return id, cfg
}

// parallel runs fn(0..n-1) on workers goroutines and fails the benchmark on the first error.
func parallel(tb testing.TB, n, workers int, fn func(i int) error) {
	tb.Helper()
	if errs := runParallel(n, workers, fn); len(errs) > 0 {
		tb.Fatal(errs[0])
	}
}

// runParallel runs fn(0..n-1) on workers goroutines and returns the errors, in the order they came.
func runParallel(n, workers int, fn func(i int) error) []error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return errs
}

// stampedStream records when each (container, event type) was first received on a CRI event stream.
type stampedStream struct {
	mu      sync.Mutex
	first   map[stampKey]time.Time
	created map[stampKey]int64 // the created_at of that first event
	err     error
	cancel  context.CancelFunc
	done    chan struct{}
}

type stampKey struct {
	id  string
	typ runtimeapi.ContainerEventType
}

// subscribeStamped subscribes to the event stream of the CRI endpoint at socket until the benchmark ends.
func subscribeStamped(tb testing.TB, socket string) *stampedStream {
	tb.Helper()
	conn, err := harness.DialUnix(socket)
	if err != nil {
		tb.Fatalf("dial %s: %v", socket, err)
	}
	stream, cancel := openEvents(tb, conn, socket, grpc.WaitForReady(true))
	s := &stampedStream{first: map[stampKey]time.Time{}, created: map[stampKey]int64{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer conn.Close()
		for {
			ev, err := stream.Recv()
			now := time.Now()
			if err != nil {
				if status.Code(err) != codes.Canceled {
					s.mu.Lock()
					s.err = err
					s.mu.Unlock()
				}
				return
			}
			k := stampKey{ev.ContainerId, ev.ContainerEventType}
			s.mu.Lock()
			if _, ok := s.first[k]; !ok {
				s.first[k] = now
				s.created[k] = ev.CreatedAt
			}
			s.mu.Unlock()
		}
	}()
	tb.Cleanup(s.close)
	return s
}

// at returns when the first event of type typ for id was received.
func (s *stampedStream) at(id string, typ runtimeapi.ContainerEventType) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.first[stampKey{id, typ}]
	return t, ok
}

// createdAt returns the created_at of the first event of type typ for id (0 when none).
func (s *stampedStream) createdAt(id string, typ runtimeapi.ContainerEventType) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.created[stampKey{id, typ}]
}

// Err returns the error that ended the stream, if it ended.
func (s *stampedStream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *stampedStream) close() {
	s.cancel()
	<-s.done
}

// taskExits records, per container, the timestamp of containerd's /tasks/exit envelope and when this
// process received it, through a subscription of its own (the same code as pleg-nri's).
type taskExits struct {
	mu   sync.Mutex
	seen map[string][2]time.Time
}

func watchTaskExits(tb testing.TB, address string) *taskExits {
	tb.Helper()
	t := &taskExits{seen: map[string][2]time.Time{}}
	sub, err := containerd.NewTaskEvents(containerd.TaskEventsConfig{Address: address, Observer: pleg.ObserverFunc(func(o pleg.Observation) {
		if o.Phase != pleg.PhaseExited {
			return
		}
		now := time.Now()
		t.mu.Lock()
		if _, ok := t.seen[o.ID]; !ok {
			t.seen[o.ID] = [2]time.Time{o.SourceTime, now}
		}
		t.mu.Unlock()
	})})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sub.Run(ctx)
	}()
	tb.Cleanup(func() {
		cancel()
		<-done
		sub.Close()
	})
	return t
}

// at returns the envelope's timestamp and the receipt time of id's /tasks/exit.
func (t *taskExits) at(id string) (published, received time.Time, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.seen[id]
	return v[0], v[1], ok
}

// taskWaits records when a containerd client's task.Wait of each container returns: the exit as the
// shim reports it to containerd's CRI plugin (which also waits on each task), before the CRI handles it.
type taskWaits struct {
	tb     testing.TB
	client *client.Client
	ctx    context.Context
	mu     sync.Mutex
	got    map[string]time.Time
	wg     sync.WaitGroup
}

func newTaskWaits(tb testing.TB, address string) *taskWaits {
	tb.Helper()
	c, err := client.New(address, client.WithDefaultNamespace("k8s.io"))
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(namespaces.WithNamespace(context.Background(), "k8s.io"))
	w := &taskWaits{tb: tb, client: c, ctx: ctx, got: map[string]time.Time{}}
	tb.Cleanup(func() {
		cancel()
		w.wg.Wait()
		c.Close()
	})
	return w
}

// wait starts waiting for the exit of the task of container id.
func (w *taskWaits) wait(id string) error {
	ctr, err := w.client.LoadContainer(w.ctx, id)
	if err != nil {
		return fmt.Errorf("load container %s: %w", short(id), err)
	}
	task, err := ctr.Task(w.ctx, nil)
	if err != nil {
		return fmt.Errorf("task of %s: %w", short(id), err)
	}
	ch, err := task.Wait(w.ctx)
	if err != nil {
		return fmt.Errorf("wait %s: %w", short(id), err)
	}
	w.wg.Go(func() {
		select {
		case <-ch:
			now := time.Now()
			w.mu.Lock()
			w.got[id] = now
			w.mu.Unlock()
		case <-w.ctx.Done():
		}
	})
	return nil
}

func (w *taskWaits) at(id string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.got[id]
	return t, ok
}

// benchPlegFlags run pleg-nri at info level for benchmarks: debug logging would bill it for log lines.
var benchPlegFlags = []string{"--plugin-name", "pleg-nri-bench", "--log-level", "info"}

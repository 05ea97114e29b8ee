package containerdit

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// The pod-start stall of a core restart (issue 58, item 4). While an NRI plugin connects and
// synchronizes, NRI (its pkg/adaptation) holds every CreateContainer and StartContainer of the node:
// containerd's CRI blocks the plugins' sync around each of them, and a plugin's sync waits for the
// calls in flight and makes every new one wait until it is done. A restart of pleg-nri's core is such
// a connection, so pod starts stall on the node for as long as its Synchronize takes (the whole state,
// every pod and container, crosses NRI's socket).
const (
	// stallPodsEnv and stallRestartsEnv set the node's pods (default 110, the kubelet's maxPods) and
	// the core restarts measured (default 20).
	stallPodsEnv     = "PLEG_NRI_BENCH_STALL_PODS"
	stallRestartsEnv = "PLEG_NRI_BENCH_STALL_RESTARTS"
	// stallMargin is how long the probes run before and after each window.
	stallMargin = 300 * time.Millisecond
	// stallLockEvery paces the lock probe: a StopContainer of an exited container, which containerd
	// answers at once but only once it holds NRI's sync lock (as a create or a start): its longest
	// call in a window is NRI's hold, to this resolution, whether or not a create happened to wait.
	stallLockEvery = 2 * time.Millisecond
)

// stallCall is one probe: a CreateContainer then a StartContainer in the probe pod.
type stallCall struct {
	at            time.Time
	create, start time.Duration
	id            string
}

func (c stallCall) end() time.Time { return c.at.Add(c.create + c.start) }

// stallWindow is a window of the probes: a core restart, or as long a time with nothing happening.
type stallWindow struct {
	restart  bool
	from, to time.Time
	// maxCreate and maxStart are the longest calls among those overlapping the window; calls counts
	// them.
	maxCreate, maxStart time.Duration
	calls               int
	// maxLock is the lock probe's longest call overlapping the window, lockCalls their number;
	// maxLockStop and maxLockStart split maxLock (restarts only) by when the call began: while the old
	// core stopped, or once the new one was starting.
	maxLock                   time.Duration
	lockCalls                 int
	maxLockStop, maxLockStart time.Duration
	// hold is NRI's sync as containerd logged it: from "Synchronizing NRI (plugin) with current
	// runtime state" (the sync lock taken) to "plugin ... connected and synchronized" (0: not found).
	hold time.Duration
	// sync is the new core's Synchronize as pleg-nri measured it (its handler, restarts only).
	sync time.Duration
}

// BenchmarkRestartStall measures what a restart of pleg-nri's core costs pod starts on a node of
// PLEG_NRI_BENCH_STALL_PODS pods (110) of one sleeping container: a probe creates and starts
// containers one after the other in a pod of its own while the core restarts (SIGTERM, start, ready:
// NRI registered and synchronized, task events subscribed, one relist), PLEG_NRI_BENCH_STALL_RESTARTS
// times (20), and for as long with nothing happening, in turn (ABBA). Per window: the longest
// CreateContainer and StartContainer among the probe's calls that overlap it, and the longest call of a
// second probe that only takes NRI's sync lock (a StopContainer of an exited container every 2 ms): a
// restart takes tens of ms and the sync a part of it, which a create or a start in flight may or may
// not meet; the lock probe always does. Reported, never asserted: the longest calls with and without a
// restart (p50, p99 over the windows), their paired difference, the calls of quiet windows, and
// pleg-nri's Synchronize time. A subscriber on pleg-nri's stream (through the front) stands in for the
// kubelet's.
func BenchmarkRestartStall(b *testing.B) {
	pods, restarts := stallShape(b)
	p := startPlegNRI(b, benchPlegFlags...)
	sub := subscribeStamped(b, p.Socket)
	rt := benchRuntime(b, env.Address)
	start := time.Now()
	stallNode(b, rt, pods)
	stallLogf("%d pods of one sleeping container running in %s", pods, time.Since(start).Round(time.Millisecond))
	probePod, probeCfg := benchRunPod(b, rt, "bench-stall-probe")
	exited := stallExited(b, rt, probePod, probeCfg)
	// pleg-nri takes the node's events in before the first window.
	time.Sleep(2 * time.Second)

	var windows []stallWindow
	var quietCalls []stallCall
	last := 2 * time.Second // a quiet window before the first restart lasts this long
	for i := range restarts {
		order := []bool{true, false}
		if i%2 == 1 {
			order = []bool{false, true}
		}
		for _, restart := range order {
			logFrom := env.LogSize()
			w, calls := stallProbe(b, rt, probePod, probeCfg, exited, func() (stopped time.Time) {
				if !restart {
					time.Sleep(last)
					return time.Time{}
				}
				p.Stop()
				stopped = time.Now()
				if err := p.Start(b.Context()); err != nil {
					b.Fatalf("restart %d: %v", i+1, err)
				}
				return stopped
			})
			w.restart = restart
			if restart {
				w.hold = nriSyncHold(env.LogSince(logFrom))
			}
			if restart {
				last = w.to.Sub(w.from)
				sum, err := p.Metric("pleg_nri_hook_duration_seconds_sum", `callback="Synchronize"`)
				if err != nil {
					b.Fatal(err)
				}
				w.sync = time.Duration(sum * float64(time.Second))
			} else {
				quietCalls = append(quietCalls, calls...)
			}
			stallLogf("window %d (restart %t): %s, %d probes overlapping, longest create %s, start %s; lock probe: %d calls, longest %s "+
				"(begun while the old core stopped %s, once the new one started %s); containerd's NRI sync %s; pleg-nri's Synchronize %s",
				len(windows)+1, restart, w.to.Sub(w.from).Round(time.Millisecond), w.calls, w.maxCreate.Round(100*time.Microsecond),
				w.maxStart.Round(100*time.Microsecond), w.lockCalls, w.maxLock.Round(100*time.Microsecond), w.maxLockStop.Round(100*time.Microsecond),
				w.maxLockStart.Round(100*time.Microsecond), w.hold.Round(100*time.Microsecond), w.sync.Round(10*time.Microsecond))
			windows = append(windows, w)
		}
	}
	if err := sub.Err(); err != nil {
		b.Errorf("the stream through the front ended across the restarts: %v", err)
	}
	stallReport(b, pods, windows, quietCalls)
}

// nriSyncRe finds a containerd log line's time.
var nriSyncRe = regexp.MustCompile(`time="([^"]+)"`)

// nriSyncHold returns how long containerd's NRI sync of a plugin took in log (its first sync), from
// its "Synchronizing NRI (plugin) with current runtime state" to its "connected and synchronized"
// (0 when either is missing).
func nriSyncHold(log string) time.Duration {
	var from time.Time
	for _, l := range strings.Split(log, "\n") {
		m := nriSyncRe.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		switch {
		case from.IsZero() && strings.Contains(l, "Synchronizing NRI (plugin) with current runtime state"):
			from = at
		case !from.IsZero() && strings.Contains(l, "connected and synchronized"):
			return at.Sub(from)
		}
	}
	return 0
}

// stallLogf prints a line of BenchmarkRestartStall's figures on stdout: the testing package keeps only
// the first 10 lines of a benchmark's log.
func stallLogf(format string, args ...any) {
	fmt.Printf("restart-stall: "+format+"\n", args...)
}

// stallShape returns the node's pods and the restarts of BenchmarkRestartStall.
func stallShape(b *testing.B) (pods, restarts int) {
	pods, restarts = 110, 20
	for _, v := range []struct {
		env string
		n   *int
	}{{stallPodsEnv, &pods}, {stallRestartsEnv, &restarts}} {
		if s := os.Getenv(v.env); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				b.Fatalf("%s=%q: want a positive number", v.env, s)
			}
			*v.n = n
		}
	}
	return pods, restarts
}

// stallNode runs pods pods of one sleeping container, four at a time, removed when the benchmark ends.
func stallNode(b *testing.B, rt runtimeapi.RuntimeServiceClient, pods int) {
	ids := make([]string, pods)
	b.Cleanup(func() {
		_ = runParallel(pods, 4, func(i int) error {
			if ids[i] == "" {
				return nil
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			_, _ = rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: ids[i]})
			_, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: ids[i]})
			return err
		})
	})
	parallel(b, pods, 4, func(i int) error {
		cfg := env.PodConfig(fmt.Sprintf("bench-stall-%d", i))
		run, err := rt.RunPodSandbox(b.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
		if err != nil {
			return fmt.Errorf("RunPodSandbox %d: %w", i, err)
		}
		ids[i] = run.PodSandboxId
		c, err := rt.CreateContainer(b.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: run.PodSandboxId,
			Config: harness.ContainerConfig("sleeper", "sleep 3600"), SandboxConfig: cfg})
		if err != nil {
			return fmt.Errorf("CreateContainer %d: %w", i, err)
		}
		if _, err := rt.StartContainer(b.Context(), &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
			return fmt.Errorf("StartContainer %d: %w", i, err)
		}
		return nil
	})
}

// stallExited runs a container that exits at once in the probe pod and returns its id: the lock
// probe's StopContainer target.
func stallExited(b *testing.B, rt runtimeapi.RuntimeServiceClient, pod string, cfg *runtimeapi.PodSandboxConfig) string {
	c, err := rt.CreateContainer(b.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod,
		Config: harness.ContainerConfig("exited", "true"), SandboxConfig: cfg})
	if err != nil {
		b.Fatalf("CreateContainer: %v", err)
	}
	if _, err := rt.StartContainer(b.Context(), &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		b.Fatalf("StartContainer: %v", err)
	}
	err = harness.WaitFor(b.Context(), 30*time.Second, "the lock probe's container to exit", func() (bool, error) {
		st, err := rt.ContainerStatus(b.Context(), &runtimeapi.ContainerStatusRequest{ContainerId: c.ContainerId})
		return err == nil && st.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_EXITED, err
	})
	if err != nil {
		b.Fatal(err)
	}
	return c.ContainerId
}

// stallProbe runs two probes from stallMargin before do to stallMargin after it: one creates and
// starts containers in the probe pod one after the other (what a pod start sees; they are removed
// afterwards, untimed), the other stops the exited container every stallLockEvery (NRI's hold). It
// returns the window do took and every create and start.
func stallProbe(b *testing.B, rt runtimeapi.RuntimeServiceClient, pod string, cfg *runtimeapi.PodSandboxConfig, exited string,
	do func() (split time.Time)) (stallWindow, []stallCall) {
	ctx, cancel := context.WithCancel(b.Context())
	var (
		mu        sync.Mutex
		calls     []stallCall
		lockCalls []stallCall // the lock probe's: create is its StopContainer
		err       error
		done      = make(chan struct{})
		lockDone  = make(chan struct{})
	)
	go func() {
		defer close(lockDone)
		for next := time.Now(); ctx.Err() == nil; next = next.Add(stallLockEvery) {
			time.Sleep(time.Until(next))
			c := stallCall{at: time.Now()}
			if _, serr := rt.StopContainer(b.Context(), &runtimeapi.StopContainerRequest{ContainerId: exited}); serr != nil {
				mu.Lock()
				err = fmt.Errorf("StopContainer of the exited container: %w", serr)
				mu.Unlock()
				return
			}
			c.create = time.Since(c.at)
			lockCalls = append(lockCalls, c)
			if now := time.Now(); now.After(next) {
				next = now // a late call delays the next, never bunches them
			}
		}
	}()
	go func() {
		defer close(done)
		for n := 0; ctx.Err() == nil; n++ {
			c := stallCall{at: time.Now()}
			resp, cerr := rt.CreateContainer(b.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod,
				Config: harness.ContainerConfig(fmt.Sprintf("probe-%d", n), "sleep 3600"), SandboxConfig: cfg})
			if cerr != nil {
				mu.Lock()
				err = fmt.Errorf("CreateContainer: %w", cerr)
				mu.Unlock()
				return
			}
			c.create, c.id = time.Since(c.at), resp.ContainerId
			if _, serr := rt.StartContainer(b.Context(), &runtimeapi.StartContainerRequest{ContainerId: c.id}); serr != nil {
				mu.Lock()
				err = fmt.Errorf("StartContainer: %w", serr)
				mu.Unlock()
				return
			}
			c.start = time.Since(c.at) - c.create
			mu.Lock()
			calls = append(calls, c)
			mu.Unlock()
		}
	}()
	time.Sleep(stallMargin)
	w := stallWindow{from: time.Now()}
	split := do()
	w.to = time.Now()
	time.Sleep(stallMargin)
	cancel()
	<-done
	<-lockDone
	if err != nil {
		b.Fatalf("probe: %v", err)
	}
	for _, c := range calls {
		if c.at.Before(w.to) && c.end().After(w.from) {
			w.calls++
			w.maxCreate, w.maxStart = max(w.maxCreate, c.create), max(w.maxStart, c.start)
		}
	}
	for _, c := range lockCalls {
		if c.at.Before(w.to) && c.end().After(w.from) {
			w.lockCalls++
			w.maxLock = max(w.maxLock, c.create)
			if !split.IsZero() && c.at.Before(split) {
				w.maxLockStop = max(w.maxLockStop, c.create)
			} else if !split.IsZero() {
				w.maxLockStart = max(w.maxLockStart, c.create)
			}
		}
	}
	parallel(b, len(calls), 4, func(i int) error {
		_, err := rt.RemoveContainer(b.Context(), &runtimeapi.RemoveContainerRequest{ContainerId: calls[i].id})
		return err
	})
	return w, calls
}

// stallReport logs the figures of BenchmarkRestartStall and reports its key ones.
func stallReport(b *testing.B, pods int, windows []stallWindow, quietCalls []stallCall) {
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	var rCreate, rStart, rLock, rLockStop, rLockStart, holds, qCreate, qStart, qLock, syncs, lengths []float64
	for _, w := range windows {
		if w.restart {
			rCreate, rStart, rLock = append(rCreate, ms(w.maxCreate)), append(rStart, ms(w.maxStart)), append(rLock, ms(w.maxLock))
			syncs, lengths = append(syncs, ms(w.sync)), append(lengths, ms(w.to.Sub(w.from)))
			rLockStop, rLockStart = append(rLockStop, ms(w.maxLockStop)), append(rLockStart, ms(w.maxLockStart))
			if w.hold > 0 {
				holds = append(holds, ms(w.hold))
			}
		} else {
			qCreate, qStart, qLock = append(qCreate, ms(w.maxCreate)), append(qStart, ms(w.maxStart)), append(qLock, ms(w.maxLock))
		}
	}
	var callCreate, callStart []float64
	for _, c := range quietCalls {
		callCreate, callStart = append(callCreate, ms(c.create)), append(callStart, ms(c.start))
	}
	q := func(v []float64) string {
		return fmt.Sprintf("p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms (n %d)", benchreport.Median(v), benchreport.Quantile(v, 0.9),
			benchreport.Quantile(v, 0.99), benchreport.Quantile(v, 1), len(v))
	}
	stallLogf("%d pods; %d core restarts (SIGTERM to ready): %s", pods, len(lengths), q(lengths))
	stallLogf("pleg-nri's Synchronize (its handler, pleg_nri_hook_duration_seconds): %s", q(syncs))
	stallLogf("longest CreateContainer of a window, restart: %s", q(rCreate))
	stallLogf("longest CreateContainer of a window, quiet:   %s", q(qCreate))
	stallLogf("longest StartContainer of a window, restart:  %s", q(rStart))
	stallLogf("longest StartContainer of a window, quiet:    %s", q(qStart))
	stallLogf("longest lock probe of a window, restart:      %s", q(rLock))
	stallLogf("longest lock probe of a window, quiet:        %s", q(qLock))
	stallLogf("  of a restart, begun while the old core stopped: %s", q(rLockStop))
	stallLogf("  of a restart, begun once the new one started:   %s", q(rLockStart))
	stallLogf("containerd's NRI sync of the new core (its log):  %s", q(holds))
	stallLogf("every CreateContainer of the quiet windows:   %s", q(callCreate))
	stallLogf("every StartContainer of the quiet windows:    %s", q(callStart))
	for _, d := range []struct {
		name string
		a, b []float64
	}{{"create", rCreate, qCreate}, {"start", rStart, qStart}, {"lock probe", rLock, qLock}} {
		// Windows in pairs (ABBA): restart i against the quiet window next to it.
		stallLogf("longest %s, restart minus quiet, paired: p50 %s; p99 %s", d.name, benchreport.PairedQuantileDiff(d.a, d.b, 0.5),
			benchreport.PairedQuantileDiff(d.a, d.b, 0.99))
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(benchreport.Median(syncs), "sync-p50-ms")
	b.ReportMetric(benchreport.Quantile(syncs, 0.99), "sync-p99-ms")
	b.ReportMetric(benchreport.Quantile(rCreate, 0.99)-benchreport.Median(callCreate), "create-stall-p99-ms")
	b.ReportMetric(benchreport.Quantile(rStart, 0.99)-benchreport.Median(callStart), "start-stall-p99-ms")
	b.ReportMetric(benchreport.Median(rLock), "lock-hold-p50-ms")
	b.ReportMetric(benchreport.Quantile(rLock, 0.99), "lock-hold-p99-ms")
	b.ReportMetric(benchreport.Quantile(qLock, 0.99), "lock-quiet-p99-ms")
	b.ReportMetric(benchreport.Median(lengths), "restart-p50-ms")
	b.ReportMetric(benchreport.Quantile(holds, 0.99), "nri-sync-p99-ms")
}

package containerdit

// Load against the real daemon and the real containerd: subscribers that never read, 100 subscribers at
// once, bursts of real pods. The short versions run in `make test`; the TestSoak* versions, selected
// with PLEG_NRI_SOAK=1, in `make soak`. They assert what must hold whatever the machine's load (who
// is evicted, what is received, exact counters, calls that complete or stall) and log the figures
// (latencies, RSS) without asserting on them.

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// soak skips a test unless PLEG_NRI_SOAK=1 (make soak).
func soak(t *testing.T) {
	t.Helper()
	if os.Getenv("PLEG_NRI_SOAK") != "1" {
		t.Skip("soak test: run with PLEG_NRI_SOAK=1 (make soak)")
	}
}

// soakInt reads a size of a soak test from the environment, with a default.
func soakInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// stuckSubscriber is a GetContainerEvents stream whose client never reads: its own connection with
// the smallest HTTP/2 windows (64 KiB, no window growth), so that what it can buffer is fixed.
type stuckSubscriber struct {
	conn   *grpc.ClientConn
	stream grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]
	cancel context.CancelFunc
}

func openStuckSubscriber(t *testing.T, socket string) *stuckSubscriber {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	stream, cancel := openEvents(t, conn, socket)
	s := &stuckSubscriber{conn: conn, stream: stream, cancel: cancel}
	t.Cleanup(s.close)
	return s
}

func (s *stuckSubscriber) close() {
	s.cancel()
	s.conn.Close()
}

// resume reads what the stream still delivers, until it ends or nothing comes for quiet; it returns
// the number of events read and the error that ended the stream (nil when it went quiet).
func (s *stuckSubscriber) resume(quiet time.Duration) (int, error) {
	type result struct {
		ev  *runtimeapi.ContainerEventResponse
		err error
	}
	n := 0
	c := make(chan result, 1)
	for {
		go func() {
			ev, err := s.stream.Recv()
			c <- result{ev, err}
		}()
		select {
		case r := <-c:
			if r.err != nil {
				return n, r.err
			}
			n++
		case <-time.After(quiet):
			s.close()
			<-c
			return n, nil
		}
	}
}

// hostNetworkPod is a pod config on the host's network (no CNI: no address to run out of), labeled
// with the test's run id, and with a 4 KiB annotation, as pods often carry (the last applied
// configuration, ...): every event of the pod carries it, so that the HTTP/2 buffers of a stuck
// stream hold a few dozen events rather than hundreds.
func hostNetworkPod(name, run string) *runtimeapi.PodSandboxConfig {
	cfg := env.PodConfig(name)
	cfg.Labels["plegit-load"] = run
	cfg.Annotations["plegit/padding"] = strings.Repeat("x", 4<<10)
	cfg.Hostname = "" // a host-network pod has the host's UTS namespace: runc refuses to set a hostname
	cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
		NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
	}
	return cfg
}

// removePodsOf stops and removes, through containerd directly, every pod labeled with run.
func removePodsOf(t *testing.T, run string) {
	t.Helper()
	rt := newCRI(t, env.Address).rt
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	resp, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"plegit-load": run}}})
	if err != nil {
		t.Errorf("list the pods of %s: %v", run, err)
		return
	}
	parallelT(t, len(resp.Items), 4, func(i int) error {
		if err := stopAndRemovePod(ctx, rt, resp.Items[i].Id); err != nil {
			return fmt.Errorf("pod %s: %w", short(resp.Items[i].Id), err)
		}
		return nil
	})
}

// parallelT runs fn(0..n-1) on workers goroutines and fails the test with every error.
func parallelT(t *testing.T, n, workers int, fn func(i int) error) {
	t.Helper()
	if errs := runParallel(n, workers, fn); len(errs) > 0 {
		t.Errorf("%d of %d failed, the first: %s", len(errs), n, errs[0])
	}
}

// podCycle runs a host-network pod with containers that exit at once, then stops and removes it: 8
// events for one container (4 of the sandbox, 4 of the container), 4 more per container. It returns
// the pod's id, its container ids and how long RunPodSandbox took.
func podCycle(ctx context.Context, rt runtimeapi.RuntimeServiceClient, name, run string, containers int) (string, []string, time.Duration, error) {
	cfg := hostNetworkPod(name, run)
	start := time.Now()
	resp, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	took := time.Since(start)
	if err != nil {
		return "", nil, took, fmt.Errorf("RunPodSandbox %s: %w", name, err)
	}
	pod := resp.PodSandboxId
	var ctrs []string
	for i := range containers {
		c, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod,
			Config: containerConfig(fmt.Sprint("c", i), "exit 0"), SandboxConfig: cfg})
		if err != nil {
			return pod, ctrs, took, fmt.Errorf("CreateContainer %s/c%d: %w", name, i, err)
		}
		ctrs = append(ctrs, c.ContainerId)
		if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
			return pod, ctrs, took, fmt.Errorf("StartContainer %s/c%d: %w", name, i, err)
		}
	}
	if err := stopAndRemovePod(ctx, rt, pod); err != nil {
		return pod, ctrs, took, fmt.Errorf("pod %s: %w", name, err)
	}
	return pod, ctrs, took, nil
}

// podRetries counts the stop-and-remove retries of stopAndRemovePod.
var podRetries atomic.Int64

// stopAndRemovePod stops and removes a pod, as the kubelet does, trying again (up to 5 times) when
// containerd refuses the removal: a container that exits while its pod is being stopped can still be
// "running" for containerd's RemovePodSandbox ("container is still running, to stop first").
func stopAndRemovePod(ctx context.Context, rt runtimeapi.RuntimeServiceClient, pod string) error {
	var err error
	for attempt := range 5 {
		if attempt > 0 {
			podRetries.Add(1)
			time.Sleep(time.Duration(attempt) * 200 * time.Millisecond)
		}
		if _, err = rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
			err = fmt.Errorf("StopPodSandbox: %w", err)
			continue
		}
		if _, err = rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
			err = fmt.Errorf("RemovePodSandbox: %w", err)
			continue
		}
		return nil
	}
	return err
}

// processMemory returns a process's resident set size and its peak, from /proc.
func processMemory(t *testing.T, pid int) (rss, hwm uint64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		var kb uint64
		if _, err := fmt.Sscanf(l, "VmRSS: %d kB", &kb); err == nil {
			rss = kb << 10
		}
		if _, err := fmt.Sscanf(l, "VmHWM: %d kB", &kb); err == nil {
			hwm = kb << 10
		}
	}
	return rss, hwm
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// evictionLog is the counts pleg-nri logged when it evicted a subscriber.
type evictionLog struct {
	Offered, Delivered, Coalesced, Dropped int
}

var evictionRE = regexp.MustCompile(`evicted with RESOURCE_EXHAUSTED.*`)

// evictions parses pleg-nri's eviction log lines.
func evictions(t *testing.T, log string) []evictionLog {
	t.Helper()
	var out []evictionLog
	for _, line := range evictionRE.FindAllString(log, -1) {
		var e evictionLog
		for k, dst := range map[string]*int{"offered": &e.Offered, "delivered": &e.Delivered, "coalesced": &e.Coalesced, "dropped": &e.Dropped} {
			m := regexp.MustCompile(`\b` + k + `=(\d+)`).FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("eviction log line without %s: %s", k, line)
			}
			*dst, _ = strconv.Atoi(m[1])
		}
		out = append(out, e)
	}
	return out
}

// waitStable waits until f returns the same value for quiet in a row (it asks every 50 ms), and
// returns it.
func waitStable(t *testing.T, what string, quiet, limit time.Duration, f func() float64) float64 {
	t.Helper()
	last, since := f(), time.Now()
	err := testutil.PollEvery(context.Background(), limit, 50*time.Millisecond, what+" to settle", func() (bool, error) {
		if v := f(); v != last {
			last, since = v, time.Now()
			return false, nil
		}
		return time.Since(since) >= quiet, nil
	})
	if err != nil {
		t.Fatalf("%v (last %v)", err, last)
	}
	return last
}

// waitMetric waits until pleg-nri's metric is want.
func waitMetric(t *testing.T, p *plegNRI, name string, want float64) {
	t.Helper()
	err := harness.WaitFor(context.Background(), 30*time.Second, fmt.Sprintf("%s == %v", name, want), func() (bool, error) {
		return p.metric(t, name) == want, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// isSubsequence tells whether got is a subsequence of want.
func isSubsequence[T comparable](got, want []T) bool {
	j := 0
	for _, g := range got {
		for j < len(want) && want[j] != g {
			j++
		}
		if j == len(want) {
			return false
		}
		j++
	}
	return true
}

// slowSubscribersResult is what runSlowSubscribers measured.
type slowSubscribersResult struct {
	runPodBefore  []time.Duration // RunPodSandbox through pleg-nri before the stuck subscriber connected
	runPod        []time.Duration // RunPodSandbox through pleg-nri
	emitted       float64         // events emitted while the subscribers were connected
	received      []int           // per healthy subscriber
	coalesced     float64
	evicted       float64
	rss, hwm      uint64
	stuckResumed  int   // events the stuck subscriber read when it resumed
	stuckEnd      error // and the error that ended its stream
	stuckEviction evictionLog
}

// runSlowSubscribers runs pods cycles of a host-network pod with one container through pleg-nri's
// endpoint (queue bound queue), with healthy subscribers that read and one that never reads (after
// baseline cycles without it, for reference), and checks the claims:
//   - every pod call through pleg-nri completes;
//   - only the stuck subscriber is evicted;
//   - each healthy subscriber receives every event of every pod of the workload, in order;
//   - the counters account exactly for every event: for the stuck one, offered == delivered (to its
//     stream) + coalesced + dropped, as its eviction log line says; the coalesced counter is its
//     coalesced plus whatever a healthy subscriber did not receive of the events emitted;
//   - the stuck subscriber, when it reads again, gets exactly the events delivered to its stream before
//     the eviction, then RESOURCE_EXHAUSTED.
func runSlowSubscribers(t *testing.T, baseline, pods, healthy, queue, workers int) slowSubscribersResult {
	t.Helper()
	logOnFailure(t)
	run := "slow-" + randomRun()
	t.Cleanup(func() { removePodsOf(t, run) })
	// No stall timeout: the stuck subscriber is to be evicted by its full queue, as it was before
	// subscriber-stall-timeout, not by the stall of a workload longer than it (pleg/stall_test.go).
	p := startPlegNRI(t, "--subscriber-queue", strconv.Itoa(queue), "--subscriber-stall-timeout", "0", "--log-level", "info")
	var res slowSubscribersResult

	rt := newCRI(t, p.Socket).rt
	type podRun struct {
		pod  string
		ctrs []string
	}
	cycles := func(n int, prefix string) ([]podRun, []time.Duration) {
		runs := make([]podRun, n)
		var took []time.Duration
		var mu sync.Mutex
		parallelT(t, n, workers, func(i int) error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			pod, ctrs, d, err := podCycle(ctx, rt, fmt.Sprint(prefix, i), run, 1)
			mu.Lock()
			took = append(took, d)
			runs[i] = podRun{pod, ctrs}
			mu.Unlock()
			return err
		})
		if t.Failed() {
			t.FailNow()
		}
		return runs, took
	}

	// The healthy subscribers, and a few pod cycles for reference, before the stuck one connects.
	emitted := func() float64 { return p.metric(t, "pleg_nri_events_emitted_total") }
	var rs []*eventRecorder
	for range healthy {
		rs = append(rs, recordEvents(t, p.Socket))
	}
	waitMetric(t, p, "pleg_nri_subscribers", float64(healthy))
	_, res.runPodBefore = cycles(baseline, "before-")

	// The stuck subscriber connects on a quiet node; the counters are read then.
	stuck := openStuckSubscriber(t, p.Socket)
	waitMetric(t, p, "pleg_nri_subscribers", float64(healthy+1))
	emitted0 := waitStable(t, "emitted events before the workload", time.Second, 30*time.Second, emitted)
	coalesced0 := p.metric(t, "pleg_nri_events_coalesced_total")
	evicted0 := p.metric(t, "pleg_nri_subscribers_evicted_total")
	base := make([]int, healthy)
	for i, r := range rs {
		base[i] = len(r.Events())
	}
	runs, took := cycles(pods, "slow-")
	res.runPod = took

	// Everything emitted has reached the healthy subscribers.
	res.emitted = waitStable(t, "emitted events", 2*time.Second, time.Minute, emitted) - emitted0
	waitStable(t, "events received", time.Second, time.Minute, func() float64 {
		n := 0
		for _, r := range rs {
			n += len(r.Events())
		}
		return float64(n)
	})
	res.coalesced = p.metric(t, "pleg_nri_events_coalesced_total") - coalesced0
	res.evicted = p.metric(t, "pleg_nri_subscribers_evicted_total") - evicted0
	res.rss, res.hwm = processMemory(t, p.PID)

	// Who was evicted, and what the stuck one was offered.
	if res.evicted != 1 {
		t.Errorf("%v subscribers evicted, want 1 (the one that never reads)", res.evicted)
	}
	ev := evictions(t, p.Log())
	if len(ev) != 1 {
		t.Fatalf("%d eviction log lines, want 1", len(ev))
	}
	res.stuckEviction = ev[0]
	// Delivered is what its stream handler took from the queue: it sits in the HTTP/2 buffers.
	if e := ev[0]; e.Delivered+e.Coalesced+e.Dropped != e.Offered {
		t.Errorf("stuck subscriber's eviction: %+v, want offered == delivered + coalesced + dropped", e)
	}

	// The healthy ones: open, every event of every pod of the workload in order (or, if any of them had
	// to coalesce, each object's events in order and each pod's last one), and the counters.
	healthyCoalesced := res.coalesced - float64(ev[0].Coalesced)
	var lostToCoalescing float64
	for i, r := range rs {
		if err := r.Err(); err != nil {
			t.Errorf("healthy subscriber %d: stream ended: %v", i, err)
		}
		evs := r.Events()[base[i]:]
		res.received = append(res.received, len(evs))
		lostToCoalescing += res.emitted - float64(len(evs))
	objects:
		for _, pr := range runs {
			for j, id := range append([]string{pr.pod}, pr.ctrs...) {
				var got []runtimeapi.ContainerEventType
				for _, e := range evs {
					if e.ContainerId == id {
						got = append(got, e.ContainerEventType)
					}
				}
				ok := slices.Equal(got, lifecycle)
				if !ok && healthyCoalesced > 0 {
					ok = isSubsequence(got, lifecycle) && (j > 0 || (len(got) > 0 && got[len(got)-1] == evDeleted))
				}
				if !ok {
					t.Errorf("healthy subscriber %d: events of %s %v, want %v", i, short(id), got, lifecycle)
					break objects
				}
			}
		}
	}
	// Exact accounting: whatever a healthy subscriber did not receive was coalesced away (it was not
	// evicted, and its queue is empty), and the coalesced counter is the stuck subscriber's plus theirs.
	if got, want := res.coalesced, float64(ev[0].Coalesced)+lostToCoalescing; got != want {
		t.Errorf("events coalesced: the counter says %v; the stuck subscriber's %d + the healthy ones' missing %v = %v",
			got, ev[0].Coalesced, lostToCoalescing, want)
	}

	// The stuck subscriber reads again: what was buffered, then RESOURCE_EXHAUSTED.
	res.stuckResumed, res.stuckEnd = stuck.resume(10 * time.Second)
	if status.Code(res.stuckEnd) != codes.ResourceExhausted || res.stuckResumed != ev[0].Delivered {
		t.Errorf("stuck subscriber, reading again: %d events then %v, want the %d delivered to its stream before the eviction, then RESOURCE_EXHAUSTED",
			res.stuckResumed, res.stuckEnd, ev[0].Delivered)
	}
	return res
}

func randomRun() string { return strconv.FormatInt(time.Now().UnixNano()%1e9, 36) }

// logSlowSubscribers logs the figures of a runSlowSubscribers run.
func logSlowSubscribers(t *testing.T, pods, healthy, queue int, res slowSubscribersResult) {
	t.Helper()
	t.Logf("RunPodSandbox through pleg-nri (queue %d, %d healthy subscribers): before the stuck subscriber %s; with it, %d pod cycles %s",
		queue, healthy, durations(res.runPodBefore), pods, durations(res.runPod))
	t.Logf("events emitted %v; received per healthy subscriber min %d max %d; coalesced %v (stuck subscriber: offered %d, delivered to its stream %d, coalesced %d, dropped %d at eviction); evicted %v",
		res.emitted, slices.Min(res.received), slices.Max(res.received), res.coalesced, res.stuckEviction.Offered,
		res.stuckEviction.Delivered, res.stuckEviction.Coalesced, res.stuckEviction.Dropped, res.evicted)
	t.Logf("stuck subscriber reading again: %d buffered events, then %v", res.stuckResumed, status.Code(res.stuckEnd))
	t.Logf("pleg-nri RSS %.1f MiB, peak %.1f MiB; pod stop-and-remove retries so far: %d", mib(res.rss), mib(res.hwm), podRetries.Load())
}

// durations renders quantiles of ds.
func durations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "no samples"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(f float64) time.Duration { return s[min(len(s)-1, int(f*float64(len(s))))].Round(time.Millisecond) }
	return fmt.Sprintf("n=%d p50=%s p90=%s max=%s", len(s), q(0.5), q(0.9), s[len(s)-1].Round(time.Millisecond))
}

// containerdStall makes containerd's own event stream stall RunPodSandbox: a subscriber that never
// reads on containerd's socket, then host-network pods run directly on containerd one after the
// other, each given stallAfter to complete, until one does not (at most maxPods). It returns the
// latencies of the calls that completed, how many there were, and how long the stalled call took to
// complete once the stuck subscriber was gone. It fails the test if no call stalls.
func containerdStall(t *testing.T, maxPods int, stallAfter time.Duration) (done []time.Duration, released time.Duration) {
	t.Helper()
	logOnFailure(t)
	run := "stall-" + randomRun()
	t.Cleanup(func() { removePodsOf(t, run) })
	// Events published while nobody listened are replayed to the next subscriber: take them first, so
	// that the stall comes from this test's own pods.
	drain := recordEvents(t, env.Address)
	waitStable(t, "containerd's backlog", time.Second, 30*time.Second, func() float64 { return float64(len(drain.Events())) })
	drain.cancel()
	<-drain.done

	stuck := openStuckSubscriber(t, env.Address)
	time.Sleep(500 * time.Millisecond) // containerd has no signal for "subscribed"
	rt := newCRI(t, env.Address).rt
	for i := range maxPods {
		cfg := hostNetworkPod(fmt.Sprint("stall-", i), run)
		start := time.Now()
		errc := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			_, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
			errc <- err
		}()
		select {
		case err := <-errc:
			if err != nil {
				t.Fatalf("RunPodSandbox %d on containerd: %v", i, err)
			}
			done = append(done, time.Since(start))
			continue
		case <-time.After(stallAfter):
		}
		// Stalled: release it by closing the stuck subscriber.
		stuck.close()
		releasedAt := time.Now()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("the stalled RunPodSandbox failed once released: %v", err)
			}
			return done, time.Since(releasedAt)
		case <-time.After(2 * time.Minute):
			t.Fatalf("RunPodSandbox %d stalled for %s and did not complete within 2 minutes of closing the stuck subscriber", i, stallAfter)
		}
	}
	t.Fatalf("containerd's RunPodSandbox never stalled in %d pods with a subscriber that never reads: the contrast does not hold here", maxPods)
	return nil, 0
}

// TestStuckSubscriberContrast: a subscriber that never reads, next to 100 that do, on pleg-nri's
// endpoint: pod calls through pleg-nri complete, only the stuck subscriber is evicted (it gets
// RESOURCE_EXHAUSTED), the others receive every event and the counters account for every event. Then
// the same stuck subscriber on containerd's own stream: containerd's RunPodSandbox stalls until it
// goes away. pleg-nri runs with a queue of 16 here, so that 32 pods are enough to evict; the soak
// version uses the default queue.
func TestStuckSubscriberContrast(t *testing.T) {
	// The stuck stream's HTTP/2 buffers hold ~30 events (4 pods), its queue 16 pods: evicted at ~21 pods.
	const baseline, pods, healthy, queue, workers = 4, 32, 100, 16, 4
	res := runSlowSubscribers(t, baseline, pods, healthy, queue, workers)
	logSlowSubscribers(t, pods, healthy, queue, res)

	done, released := containerdStall(t, 200, 10*time.Second)
	t.Logf("containerd's own stream with a subscriber that never reads: %d RunPodSandbox completed (%s), the next one stalled for more than 10s and completed %s after the stuck subscriber was closed",
		len(done), durations(done), released.Round(time.Microsecond))
}

// TestSoakStuckSubscriber is TestStuckSubscriberContrast at full size: pleg-nri's default queue of
// 1024 events, so that the stuck subscriber is evicted only after more distinct pods than that
// (PLEG_NRI_SOAK_SLOW_PODS, default 1200 pod cycles).
func TestSoakStuckSubscriber(t *testing.T) {
	soak(t)
	pods := soakInt(t, "PLEG_NRI_SOAK_SLOW_PODS", 1200)
	const healthy, queue, workers = 100, 1024, 4
	res := runSlowSubscribers(t, 40, pods, healthy, queue, workers)
	logSlowSubscribers(t, pods, healthy, queue, res)

	done, released := containerdStall(t, 1000, 20*time.Second)
	t.Logf("containerd's own stream with a subscriber that never reads: %d RunPodSandbox completed (%s), the next one stalled for more than 20s and completed %s after the stuck subscriber was closed",
		len(done), durations(done), released.Round(time.Microsecond))
}

// runBurst starts pods host-network pods with containers containers each that exit at once, all alive
// together, then stops and removes them, through pleg-nri's endpoint with workers in parallel, with
// readers subscribers on pleg-nri and one on containerd's own stream. It checks: zero lost (every
// subscriber of pleg-nri received every (type, id) containerd's stream has for these pods, and the
// four events of each object), exact counters (each subscriber received exactly the events emitted
// while it was connected; nothing coalesced, nobody evicted).
func runBurst(t *testing.T, pods, containers, readers, workers int) {
	t.Helper()
	logOnFailure(t)
	run := "burst-" + randomRun()
	t.Cleanup(func() { removePodsOf(t, run) })
	p := startPlegNRI(t, "--log-level", "info")
	emitted := func() float64 { return p.metric(t, "pleg_nri_events_emitted_total") }
	var rs []*eventRecorder
	for range readers {
		rs = append(rs, recordEvents(t, p.Socket))
	}
	theirs := recordEvents(t, env.Address)
	waitMetric(t, p, "pleg_nri_subscribers", float64(readers))
	emitted0 := waitStable(t, "emitted events before the burst", time.Second, 30*time.Second, emitted)
	coalesced0 := p.metric(t, "pleg_nri_events_coalesced_total")
	evicted0 := p.metric(t, "pleg_nri_subscribers_evicted_total")
	base := make([]int, readers)
	for i, r := range rs {
		base[i] = len(r.Events())
	}

	rt := newCRI(t, p.Socket).rt
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	type podRun struct {
		pod  string
		cfg  *runtimeapi.PodSandboxConfig
		ctrs []string
	}
	runs := make([]podRun, pods)
	start := time.Now()
	parallelT(t, pods, workers, func(i int) error {
		cfg := hostNetworkPod(fmt.Sprint("burst-", i), run)
		resp, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
		if err != nil {
			return fmt.Errorf("RunPodSandbox %d: %w", i, err)
		}
		runs[i] = podRun{pod: resp.PodSandboxId, cfg: cfg}
		for j := range containers {
			c, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: resp.PodSandboxId,
				Config: containerConfig(fmt.Sprint("c", j), "exit 0"), SandboxConfig: cfg})
			if err != nil {
				return fmt.Errorf("CreateContainer %d/%d: %w", i, j, err)
			}
			runs[i].ctrs = append(runs[i].ctrs, c.ContainerId)
			if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
				return fmt.Errorf("StartContainer %d/%d: %w", i, j, err)
			}
		}
		return nil
	})
	if t.Failed() {
		t.FailNow()
	}
	up := time.Since(start)
	_, hwmUp := processMemory(t, p.PID)
	parallelT(t, pods, workers, func(i int) error {
		if err := stopAndRemovePod(ctx, rt, runs[i].pod); err != nil {
			return fmt.Errorf("pod %d: %w", i, err)
		}
		return nil
	})
	if t.Failed() {
		t.FailNow()
	}
	total := time.Since(start)

	want := pods * 4 * (1 + containers)
	ids := map[string]bool{}
	for _, r := range runs {
		ids[r.pod] = true
		for _, c := range r.ctrs {
			ids[c] = true
		}
	}
	mine := func(evs []*runtimeapi.ContainerEventResponse) []*runtimeapi.ContainerEventResponse {
		var out []*runtimeapi.ContainerEventResponse
		for _, e := range evs {
			if ids[e.ContainerId] {
				out = append(out, e)
			}
		}
		return out
	}
	// Wait until every subscriber has every event of the burst (or stops getting more).
	for i, r := range append(slices.Clone(rs), theirs) {
		err := harness.WaitFor(context.Background(), 2*time.Minute, fmt.Sprintf("subscriber %d's %d events", i, want), func() (bool, error) {
			return len(mine(r.Events())) >= want, r.Err()
		})
		if err != nil {
			t.Errorf("subscriber %d (%d is containerd's): %v; has %d", i, len(rs), err, len(mine(r.Events())))
		}
	}
	got := waitStable(t, "emitted events", 2*time.Second, time.Minute, emitted) - emitted0
	coalesced := p.metric(t, "pleg_nri_events_coalesced_total") - coalesced0
	evicted := p.metric(t, "pleg_nri_subscribers_evicted_total") - evicted0
	rss, hwm := processMemory(t, p.PID)

	theirKeys := multiset(mine(theirs.Events()))
	for i, r := range rs {
		evs := r.Events()
		ours := mine(evs)
		if len(ours) != want {
			t.Errorf("subscriber %d: %d events of the burst's pods, want %d", i, len(ours), want)
		}
		if diff := diffMultiset(theirKeys, multiset(ours)); diff != "" {
			t.Errorf("subscriber %d: (type, id) multiset differs from containerd's stream: %s", i, diff)
		}
		for id := range ids {
			var seq []runtimeapi.ContainerEventType
			for _, e := range ours {
				if e.ContainerId == id {
					seq = append(seq, e.ContainerEventType)
				}
			}
			if !slices.Equal(seq, lifecycle) {
				t.Errorf("subscriber %d: events of %s %v, want %v", i, short(id), seq, lifecycle)
				break
			}
		}
		if n := len(evs) - base[i]; float64(n) != got {
			t.Errorf("subscriber %d received %d events, pleg-nri emitted %v meanwhile", i, n, got)
		}
		if err := r.Err(); err != nil {
			t.Errorf("subscriber %d: stream ended: %v", i, err)
		}
	}
	if coalesced != 0 || evicted != 0 {
		t.Errorf("coalesced %v, evicted %v; want 0 and 0 with subscribers that keep up", coalesced, evicted)
	}
	t.Logf("%d pods x %d containers (%d up at once): %d events of the burst per subscriber (emitted in all: %v), up in %s, all gone after %s (%.0f events/s)",
		pods, containers, pods, want, got, up.Round(time.Second), total.Round(time.Second), float64(want)/total.Seconds())
	t.Logf("%d pleg-nri subscribers and containerd's own stream: every one received all %d events; coalesced %v, evicted %v", readers, want, coalesced, evicted)
	t.Logf("pleg-nri RSS %.1f MiB (peak %.1f MiB; peak with all pods up %.1f MiB)", mib(rss), mib(hwm), mib(hwmUp))
	// The unit's MemoryMax holds both processes (deploy/systemd/pleg-nri.service).
	if fpid, err := p.FrontPID(); err == nil {
		frss, fhwm := processMemory(t, fpid)
		t.Logf("pleg-nri front RSS %.1f MiB (peak %.1f MiB); core and front peak together %.1f MiB", mib(frss), mib(fhwm), mib(hwm+fhwm))
	}
}

// diffMultiset describes how two multisets differ, or returns "".
func diffMultiset(want, got map[eventKey]int) string {
	var out []string
	for k, n := range want {
		if got[k] != n {
			out = append(out, fmt.Sprintf("%s: containerd %d, pleg-nri %d", k, n, got[k]))
		}
	}
	for k, n := range got {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("%s: containerd 0, pleg-nri %d", k, n))
		}
	}
	slices.Sort(out)
	if len(out) > 10 {
		out = append(out[:10], fmt.Sprintf("... %d more", len(out)-10))
	}
	return strings.Join(out, "; ")
}

// TestBurstRealPods: 20 pods with 2 containers each, all up at once, then all gone: 240 events; three
// subscribers of pleg-nri and containerd's own stream get every one of them.
func TestBurstRealPods(t *testing.T) {
	runBurst(t, 20, 2, 3, 4)
}

// TestSoakBurstRealPods: 250 pods (PLEG_NRI_SOAK_PODS) with 9 containers each (PLEG_NRI_SOAK_CONTAINERS),
// all up at once: 10,000 events.
func TestSoakBurstRealPods(t *testing.T) {
	soak(t)
	runBurst(t, soakInt(t, "PLEG_NRI_SOAK_PODS", 250), soakInt(t, "PLEG_NRI_SOAK_CONTAINERS", 9), 10, 4)
}

package pleg

// Load tests of the fan-out and of the whole pipeline (Observe -> state -> fan-out -> Next): a burst of
// 10,000 events with exact per-subscriber accounting, and the memory held with 100 subscribers and one
// that never reads. They assert counts and bounds, never timings; the figures they log (latency,
// heap) are for the reader.

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

func TestSubscriptionStatsAccounting(t *testing.T) {
	m := newCountingMetrics()
	f := newFanout(4, m)
	s := f.subscribe()
	pub := func(pod, id string) { f.publish(context.Background(), podEvent(pod, id)) }
	check := func(what string, want SubscriptionStats) {
		t.Helper()
		got := s.Stats()
		if got != want {
			t.Errorf("%s: stats %+v, want %+v", what, got, want)
		}
		if got.Offered != got.Delivered+got.Coalesced+got.Dropped+uint64(got.Queued) {
			t.Errorf("%s: stats %+v do not add up", what, got)
		}
	}
	pub("a", "a1")
	pub("a", "a2")
	check("two queued", SubscriptionStats{Offered: 2, Queued: 2})
	if _, err := s.Next(context.Background()); err != nil {
		t.Fatal(err)
	}
	check("one delivered", SubscriptionStats{Offered: 2, Delivered: 1, Queued: 1})
	pub("b", "b1")
	pub("b", "b2")
	pub("c", "c1")
	pub("a", "a3") // full: a2 and b1 coalesced away
	check("coalesced", SubscriptionStats{Offered: 6, Delivered: 1, Coalesced: 2, Queued: 3})
	pub("d", "d1")
	pub("e", "e1") // full of distinct pods b, c, a, d: evicted, the 4 queued and e1 dropped
	check("evicted", SubscriptionStats{Offered: 8, Delivered: 1, Coalesced: 2, Dropped: 5, Evicted: true})
	pub("f", "f1") // not offered any more
	s.Close()
	check("closed after eviction", SubscriptionStats{Offered: 8, Delivered: 1, Coalesced: 2, Dropped: 5, Evicted: true})
	if m.coalesced != 2 || m.evicted != 1 {
		t.Errorf("metrics: coalesced %d evicted %d, want 2 and 1", m.coalesced, m.evicted)
	}

	s2 := f.subscribe()
	f.publish(context.Background(), podEvent("a", "x"))
	f.publish(context.Background(), podEvent("b", "y"))
	s2.Close()
	if got, want := s2.Stats(), (SubscriptionStats{Offered: 2, Dropped: 2}); got != want {
		t.Errorf("closed with a queue: %+v, want %+v", got, want)
	}
}

// burstPodEvents is what one pod of the synthetic burst emits: a sandbox and one container, each
// through its whole life.
const burstPodEvents = 8

// burstObservations returns the observations of pod i of a burst, each carrying the CRI status an
// input would have (so that no status call is needed and the emitted events are exactly
// burstPodEvents): run the sandbox, create, start, exit and remove the container, stop and remove the
// sandbox.
func burstObservations(i int, at time.Time) []Observation {
	sb := fmt.Sprintf("burst-sb-%05d", i)
	ctr := fmt.Sprintf("burst-ctr-%05d", i)
	ss := sandboxStatus(sb, at)
	cs := containerStatus(ctr, sb, at)
	run := proto.Clone(cs).(*runtimeapi.ContainerStatus)
	run.State, run.StartedAt = runtimeapi.ContainerState_CONTAINER_RUNNING, at.UnixNano()
	exit := proto.Clone(run).(*runtimeapi.ContainerStatus)
	exit.State, exit.FinishedAt, exit.ExitCode, exit.Reason = runtimeapi.ContainerState_CONTAINER_EXITED, at.Add(time.Millisecond).UnixNano(), 0, "Completed"
	notReady := proto.Clone(ss).(*runtimeapi.PodSandboxStatus)
	notReady.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY

	withSandbox := func(o Observation, st *runtimeapi.PodSandboxStatus) Observation { o.SandboxStatus = st; return o }
	withCtr := func(o Observation, st *runtimeapi.ContainerStatus) Observation { o.ContainerStatus = st; return o }
	started := nriContainer(ctr, sb, PhaseRunning, at)
	started.StartedAt = at
	return []Observation{
		withSandbox(nriSandbox(sb, PhaseRunning, at), ss),
		withCtr(nriContainer(ctr, sb, PhaseCreated, at), cs),
		withCtr(started, run),
		withCtr(nriExit(ctr, sb, 0, at.Add(time.Millisecond), at), exit),
		nriContainer(ctr, sb, PhaseRemoved, at),
		withSandbox(nriSandbox(sb, PhaseExited, at), notReady),
		nriSandbox(sb, PhaseRemoved, at),
	}
}

// wantPodEvents is the event sequence of one burst pod.
func wantPodEvents(i int) []string {
	sb, ctr := fmt.Sprintf("burst-sb-%05d", i), fmt.Sprintf("burst-ctr-%05d", i)
	return []string{"CREATED " + sb, "STARTED " + sb, "CREATED " + ctr, "STARTED " + ctr, "STOPPED " + ctr,
		"DELETED " + ctr, "STOPPED " + sb, "DELETED " + sb}
}

// burstReader is a subscriber of the burst test and what it received.
type burstReader struct {
	name string
	sub  *Subscription
	// resume, when not nil, holds the reader back until it is closed.
	resume chan struct{}
	// reads is false for a subscriber that never reads.
	reads bool

	done chan struct{}
	evs  []Event         // every event received, in order
	lat  []time.Duration // source time -> Next, per event
	err  error           // what ended Next, other than the last event
}

func (r *burstReader) run(ctx context.Context, final string) {
	defer close(r.done)
	if !r.reads {
		return
	}
	if r.resume != nil {
		select {
		case <-r.resume:
		case <-ctx.Done():
			return
		}
	}
	// Keep the loop cheap (the events are analysed afterwards): the readers must not be slower than a
	// real consumer.
	for {
		ev, err := r.sub.Next(ctx)
		if err != nil {
			r.err = err
			return
		}
		r.lat = append(r.lat, time.Since(ev.SourceTime))
		r.evs = append(r.evs, ev)
		if ev.Response.ContainerId == final && ev.Response.ContainerEventType == runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT {
			return
		}
	}
}

// runBurst pushes pods synthetic pods through a running PLEG (queue bound queue) as fast as Observe
// takes them, with readers fast subscribers, plus (when withSlow) one that never reads and one that
// reads nothing until the first pausedPods pods are emitted. Observations of the first pausedPods pods
// go in one burst, the rest in a second one once the readers have drained the first.
func runBurst(t *testing.T, pods, pausedPods, readers, queue int, withSlow bool) (*countingMetrics, []*burstReader) {
	t.Helper()
	m := newCountingMetrics()
	p, err := New(Config{Status: newFakeCRI(), Metrics: m, SubscriberQueue: queue, VerifyDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runDone := make(chan error, 1)
	go func() { runDone <- p.Run(ctx) }()

	var rs []*burstReader
	add := func(name string, reads bool, resume chan struct{}) {
		rs = append(rs, &burstReader{name: name, sub: p.Subscribe(), reads: reads, resume: resume,
			done: make(chan struct{})})
	}
	for i := range readers {
		add(fmt.Sprint("reader-", i), true, nil)
	}
	resume := make(chan struct{})
	if withSlow {
		add("stuck", false, nil)
		add("paused", true, resume)
	}
	final := fmt.Sprintf("burst-sb-%05d", pods-1)
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() { r.run(ctx, final) })
	}

	// Settle until the state machine has applied every observation (the counter counts emissions).
	waitEmitted := func(n int) {
		t.Helper()
		if err := testutil.Poll(ctx, 2*time.Minute, fmt.Sprintf("%d events emitted", n), func() (bool, error) {
			return m.emittedCount() >= n, fmt.Errorf("%d emitted", m.emittedCount())
		}); err != nil {
			t.Fatal(err)
		}
	}
	burst := func(from, to int) {
		for i := from; i < to; i++ {
			now := time.Now()
			for _, o := range burstObservations(i, now) {
				p.Observe(o)
			}
		}
	}
	burst(0, pausedPods)
	waitEmitted(pausedPods * burstPodEvents)
	// Let the readers drain before the second burst: then no reader can hold more distinct pods than the
	// second burst has, and only a subscriber that never reads can be evicted.
	for _, r := range rs {
		if r.reads && r.resume == nil {
			if err := testutil.Poll(ctx, 2*time.Minute, r.name+" to drain", func() (bool, error) {
				return r.sub.Len() == 0, fmt.Errorf("%+v", r.sub.Stats())
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(resume)
	burst(pausedPods, pods)
	waitEmitted(pods * burstPodEvents)

	select {
	case <-waitAll(rs):
	case <-ctx.Done():
		t.Fatal("readers did not finish")
	}
	cancel()
	if err := <-runDone; err != nil {
		t.Errorf("Run: %v", err)
	}
	wg.Wait()
	return m, rs
}

func waitAll(rs []*burstReader) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		for _, r := range rs {
			<-r.done
		}
		close(c)
	}()
	return c
}

func (m *countingMetrics) emittedCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.emitted
}

// TestBurst10k pushes 10,000 events (1,250 pods, each a sandbox and a container through their whole
// life) through the pipeline as fast as Observe takes them, to 100 subscribers that read, one that
// never reads and one that reads nothing during the first 4,000 events. It checks the claims:
//   - zero lost: every subscriber that was not evicted ends with the last event of every pod, each
//     pod's events in order; one that never coalesced got exactly the 8 events of every pod;
//   - the counters say exactly what happened: per subscriber, offered == delivered + coalesced +
//     dropped (+ queued), delivered is what the subscriber counted, offered is every event emitted
//     (or, for the evicted one, every event up to its eviction), and the coalesced and evicted
//     metrics are the sums of the per-subscriber counts;
//   - only the subscriber that never reads is evicted.
//
// 100 readers on 2 cores cannot take 10,000 events as fast as the pipeline emits them: they coalesce
// too (the log says how much), and still lose nothing they need.
func TestBurst10k(t *testing.T) {
	const (
		pods       = 1250 // 10,000 events
		pausedPods = 250  // their last STOPPED and DELETED fill half the queue: the paused one is coalesced, not evicted
		readers    = 100
	)
	m, rs := runBurst(t, pods, pausedPods, readers, DefaultSubscriberQueue, true)
	produced := uint64(m.emittedCount())
	if produced != pods*burstPodEvents {
		t.Fatalf("emitted %d events, want %d", produced, pods*burstPodEvents)
	}

	var coalesced uint64
	evicted := 0
	var lat []time.Duration
	var readerCoalesced []string
	for _, r := range rs {
		st := r.sub.Stats()
		coalesced += st.Coalesced
		if st.Offered != st.Delivered+st.Coalesced+st.Dropped+uint64(st.Queued) {
			t.Errorf("%s: stats %+v do not add up", r.name, st)
		}
		if st.Delivered != uint64(len(r.evs)) {
			t.Errorf("%s: stats say %d delivered, the subscriber received %d", r.name, st.Delivered, len(r.evs))
		}
		if st.Evicted {
			evicted++
			if r.name != "stuck" {
				t.Errorf("%s was evicted: %+v", r.name, st)
			}
			if st.Delivered != 0 || st.Coalesced+st.Dropped != st.Offered || st.Offered >= produced {
				t.Errorf("%s: evicted with %+v (produced %d)", r.name, st, produced)
			}
			if status.Code(r.sub.nextErr()) != codes.ResourceExhausted {
				t.Errorf("%s: Next after eviction: %v, want ResourceExhausted", r.name, r.sub.nextErr())
			}
			t.Logf("%s: evicted after %d events offered (%d coalesced, %d dropped); %d events emitted after its eviction",
				r.name, st.Offered, st.Coalesced, st.Dropped, produced-st.Offered)
			continue
		}
		if r.name == "stuck" {
			t.Errorf("the subscriber that never reads was not evicted: %+v", st)
			continue
		}
		if st.Offered != produced || st.Queued != 0 || st.Dropped != 0 {
			t.Errorf("%s: %+v, want every one of the %d events offered, none queued or dropped", r.name, st, produced)
		}
		// Zero lost: every pod's events in their order, ending with its last one; all of them when nothing
		// was coalesced.
		perPod := make([][]string, pods)
		for _, ev := range r.evs {
			id := ev.Response.ContainerId
			var i int
			if _, err := fmt.Sscanf(id[len(id)-5:], "%d", &i); err != nil || i >= pods {
				t.Fatalf("%s: event of an unknown object %s", r.name, id)
			}
			perPod[i] = append(perPod[i], summary([]Event{ev})[0])
		}
		for i := range pods {
			got, want := perPod[i], wantPodEvents(i)
			if !isSubsequence(got, want) || (st.Coalesced == 0 && !slices.Equal(got, want)) {
				t.Errorf("%s: events of pod %d %v, want %v (or, coalesced, a subsequence ending with its last)", r.name, i, got, want)
				break
			}
		}
		if r.name == "paused" {
			if st.Coalesced == 0 {
				t.Errorf("paused: nothing coalesced while it did not read %d events", pausedPods*burstPodEvents)
			}
			t.Logf("paused: %d events delivered, %d coalesced while it did not read", st.Delivered, st.Coalesced)
			continue
		}
		if st.Coalesced > 0 {
			readerCoalesced = append(readerCoalesced, fmt.Sprintf("%s:%d", r.name, st.Coalesced))
		}
		lat = append(lat, r.lat...)
	}
	if evicted != 1 {
		t.Errorf("%d subscribers evicted, want 1 (the one that never reads)", evicted)
	}
	m.mu.Lock()
	if uint64(m.coalesced) != coalesced || m.evicted != evicted {
		t.Errorf("metrics: coalesced %d evicted %d; subscribers' sums: %d and %d", m.coalesced, m.evicted, coalesced, evicted)
	}
	m.mu.Unlock()
	t.Logf("%d events emitted; %d readers: coalesced %v; latency source -> Next over every reader event: %s",
		produced, readers, readerCoalesced, quantiles(lat))
}

// nextErr returns what Next returns at once.
func (s *Subscription) nextErr() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Next(ctx)
	return err
}

// isSubsequence tells whether got is a subsequence of want ending with want's last element.
func isSubsequence(got, want []string) bool {
	if len(got) == 0 || got[len(got)-1] != want[len(want)-1] {
		return false
	}
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

func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "no samples"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(f float64) time.Duration { return s[min(len(s)-1, int(f*float64(len(s))))].Round(time.Microsecond) }
	return fmt.Sprintf("n=%d p50=%s p99=%s max=%s", len(s), q(0.5), q(0.99), s[len(s)-1].Round(time.Microsecond))
}

// realisticEvent is a fresh event of pod i (a sandbox and two containers, with the statuses the kubelet
// gets), allocated anew as the state machine does for each emission.
func realisticEvent(i, seq int) Event {
	sb := fmt.Sprintf("mem-sb-%05d", i)
	at := time.Unix(1_700_000_000, int64(seq))
	return Event{
		Response: &runtimeapi.ContainerEventResponse{
			ContainerId:        sb,
			ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT,
			CreatedAt:          at.UnixNano(),
			PodSandboxStatus:   sandboxStatus(sb, at),
			ContainersStatuses: []*runtimeapi.ContainerStatus{containerStatus(sb+"-a", sb, at), containerStatus(sb+"-b", sb, at)},
		},
		SourceTime: time.Now(),
	}
}

// TestFanoutStuckSubscriberBoundedMemory publishes to 100 subscribers that read and one that never
// reads, in three phases:
//  1. without the stuck one, paced: the readers' latency (publish -> Next) for reference;
//  2. with it, paced: the readers' latency is logged next to phase 1's (logged only: timings are
//     benchmarks' work, not a test's);
//  3. as fast as possible, 20,000 fresh events (10,000 under the race detector): the heap the fan-out
//     holds once the readers drained is bounded by the stuck subscriber's queue (it would be 10 to 20
//     times more with an unbounded queue);
//     events of fewer distinct pods than the queue only coalesce it; then events of more distinct pods
//     than the queue evict it and free that memory.
func TestFanoutStuckSubscriberBoundedMemory(t *testing.T) {
	const (
		readers = 100
		queue   = DefaultSubscriberQueue
		pods    = 1000 // < queue: the stuck subscriber is coalesced, not evicted
	)
	// Under the race detector the latencies mean nothing and everything is slower: fewer events.
	paced, flood := 1000, 20000
	if raceEnabled {
		paced, flood = 200, 10000
	}
	m := newCountingMetrics()
	f := newFanout(queue, m)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	type reader struct {
		sub   *Subscription
		mu    sync.Mutex
		lat   []time.Duration
		count int
	}
	rs := make([]*reader, readers)
	var measure atomic.Bool // readers keep latencies only while set: the heap figure must not count them
	var wg sync.WaitGroup
	for i := range rs {
		r := &reader{sub: f.subscribe()}
		rs[i] = r
		wg.Go(func() {
			for {
				ev, err := r.sub.Next(ctx)
				if err != nil {
					return
				}
				d := time.Since(ev.SourceTime)
				r.mu.Lock()
				if measure.Load() {
					r.lat = append(r.lat, d)
				}
				r.count++
				r.mu.Unlock()
			}
		})
	}
	defer func() { cancel(); wg.Wait() }()
	takeLatency := func() []time.Duration {
		var all []time.Duration
		for _, r := range rs {
			r.mu.Lock()
			all = append(all, r.lat...)
			r.lat = nil
			r.mu.Unlock()
		}
		return all
	}
	drained := func() {
		t.Helper()
		testutil.Eventually(t, time.Minute, "the readers to drain", func() bool {
			for _, r := range rs {
				if r.sub.Len() > 0 {
					return false
				}
			}
			return true
		})
	}
	publishPaced := func(n int) {
		for i := range n {
			f.publish(ctx, realisticEvent(i%pods, i))
			time.Sleep(200 * time.Microsecond)
		}
		drained()
	}

	// Phase 1: readers only.
	measure.Store(true)
	publishPaced(paced)
	latAlone := quantiles(takeLatency())

	// Phase 2: and a subscriber that never reads.
	before := heapInUse()
	stuck := f.subscribe()
	publishPaced(paced)
	measure.Store(false)
	latWithStuck := quantiles(takeLatency())
	if st := stuck.Stats(); st.Evicted || st.Offered != uint64(paced) || st.Queued > queue {
		t.Errorf("stuck subscriber over %d pods: %+v, want %d events offered, at most %d queued, not evicted", pods, st, paced, queue)
	}

	// Phase 3: a flood of fresh events over the same pods.
	for i := range flood {
		f.publish(ctx, realisticEvent(i%pods, paced+i))
	}
	drained()
	held := heapInUse() - min(before, heapInUse())
	st := stuck.Stats()
	if st.Evicted || st.Queued > queue || st.Coalesced == 0 {
		t.Fatalf("stuck subscriber after the flood: %+v, want coalesced, not evicted", st)
	}
	// What one queue's worth of such events weighs, measured the same way.
	base := heapInUse()
	ref := make([]Event, queue)
	for i := range ref {
		ref[i] = realisticEvent(i, i)
	}
	queueWorth := heapInUse() - min(base, heapInUse())
	runtime.KeepAlive(ref)
	ref = nil
	// The fan-out holds the stuck queue's events, the rings of 101 subscribers and the queues' bookkeeping.
	ringBytes := uint64(readers+1) * queue * uint64(unsafe.Sizeof(Event{}))
	limit := queueWorth + ringBytes + 8<<20
	if held > limit {
		t.Errorf("the fan-out holds %.1f MiB after %d events with a stuck subscriber; bound %.1f MiB (its queue of %d events is %.1f MiB)",
			mib(held), flood+2*paced, mib(limit), queue, mib(queueWorth))
	}

	// Phase 4: more distinct pods than the queue evicts it, and its memory goes.
	for i := range queue + 1 {
		f.publish(ctx, realisticEvent(pods+i, paced+flood+i))
	}
	drained()
	after := heapInUse() - min(before, heapInUse())
	est := stuck.Stats()
	if !est.Evicted || status.Code(stuck.nextErr()) != codes.ResourceExhausted {
		t.Errorf("stuck subscriber after %d distinct pods: %+v, %v", pods+queue+1, est, stuck.nextErr())
	}
	total := uint64(2*paced + flood + queue + 1)
	for i, r := range rs {
		rst := r.sub.Stats()
		if rst.Evicted || rst.Offered != total || rst.Delivered+rst.Coalesced != total {
			t.Errorf("reader %d: %+v, want %d events offered, delivered or coalesced", i, rst, total)
		}
		r.mu.Lock()
		if uint64(r.count) != rst.Delivered {
			t.Errorf("reader %d received %d events, stats say %d", i, r.count, rst.Delivered)
		}
		r.mu.Unlock()
	}
	m.mu.Lock()
	evicted := m.evicted
	m.mu.Unlock()
	if evicted != 1 {
		t.Errorf("%d evictions, want 1", evicted)
	}
	t.Logf("readers' latency publish -> Next, %d paced events to %d readers: alone %s; with a stuck subscriber %s",
		paced, readers, latAlone, latWithStuck)
	t.Logf("heap held with %d readers and a stuck subscriber after %d events: %.1f MiB (one queue of %d events: %.1f MiB, rings %.1f MiB); after its eviction: %.1f MiB",
		readers, flood+2*paced, mib(held), queue, mib(queueWorth), mib(ringBytes), mib(after))
	t.Logf("stuck subscriber: %+v", est)
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

package containerdit

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/pleg"
)

// TestStalledSubscriberEvicted (issue 56) is runStalledSubscriber with a stall timeout of 5 s and 30 s
// of churn: the real processes' side of pleg/stall_test.go (which runs the fan-out on a fake clock).
func TestStalledSubscriberEvicted(t *testing.T) {
	res := runStalledSubscriber(t, 5*time.Second, 30*time.Second, time.Second)
	res.log(t)
}

// TestSoakStalledSubscriber is TestStalledSubscriberEvicted as the goal row asks: the
// default stall timeout (1 m) and PLEG_NRI_SOAK_STALL_MINUTES (10) minutes of churn, the memory of
// both processes sampled every 10 s, and the core's RSS required flat after the eviction.
func TestSoakStalledSubscriber(t *testing.T) {
	soak(t)
	minutes := soakInt(t, "PLEG_NRI_SOAK_STALL_MINUTES", 10)
	res := runStalledSubscriber(t, time.Minute, time.Duration(minutes)*time.Minute, 10*time.Second)
	res.log(t)
	// Flat: the core's RSS over the last quarter of the run after the eviction is no more than its RSS
	// over the first quarter and a margin for the garbage collector's pacing. A subscriber that pinned
	// every deleted object would grow it by every pod cycled (~1,200 in 10 minutes).
	after := res.afterEviction()
	if len(after) < 8 {
		t.Fatalf("%d samples after the eviction: too few to tell whether the RSS is flat", len(after))
	}
	q := len(after) / 4
	first, last := medianRSS(after[:q]), medianRSS(after[len(after)-q:])
	t.Logf("core RSS after the eviction: median %.1f MiB over its first quarter, %.1f MiB over its last", mib(first), mib(last))
	if last > first+first/4+(4<<20) {
		t.Errorf("the core's RSS grew after the stalled subscriber's eviction: median %.1f MiB, then %.1f MiB", mib(first), mib(last))
	}
}

// stallSample is what runStalledSubscriber saw once a period.
type stallSample struct {
	at                time.Duration // since the stalled subscriber stopped reading
	coreRSS, frontRSS uint64
	// checkpointAge is how long before the sample the checkpoint was written; checkpointPods the
	// sandboxes it records; deleted those of them whose DELETED the healthy subscriber had received
	// at least a second before the sample.
	checkpointAge  time.Duration
	checkpointPods int
	deleted        int
	evicted        bool // the stalled subscriber was evicted by then
}

// stallResult is what runStalledSubscriber measured.
type stallResult struct {
	stall, churn time.Duration
	evictedAfter time.Duration // from the subscriber's last read (it never read) to its eviction
	pods         int           // pod cycles run
	samples      []stallSample
	resumed      int   // events the stalled subscriber read when it read again
	end          error // and the error that ended its stream
	eviction     evictionLog
}

// afterEviction returns the samples taken once the stalled subscriber was gone.
func (r stallResult) afterEviction() []stallSample {
	i := slices.IndexFunc(r.samples, func(s stallSample) bool { return s.evicted })
	if i < 0 {
		return nil
	}
	return r.samples[i:]
}

func (r stallResult) log(t *testing.T) {
	t.Helper()
	t.Logf("stall timeout %s, %s of churn (%d pod cycles): the stalled subscriber was evicted %s after it stopped reading (offered %d, delivered to its stream %d, coalesced %d, dropped %d)",
		r.stall, r.churn, r.pods, r.evictedAfter.Round(10*time.Millisecond), r.eviction.Offered, r.eviction.Delivered, r.eviction.Coalesced, r.eviction.Dropped)
	t.Logf("the stalled subscriber reading again: %d buffered events, then %v", r.resumed, status.Code(r.end))
	var b strings.Builder
	for _, s := range r.samples {
		fmt.Fprintf(&b, "\n  %7s core %5.1f MiB  front %5.1f MiB  checkpoint written %5s ago, %3d pods (%3d already deleted)  evicted=%v",
			s.at.Round(time.Second), mib(s.coreRSS), mib(s.frontRSS), s.checkpointAge.Round(time.Millisecond), s.checkpointPods, s.deleted, s.evicted)
	}
	t.Logf("samples:%s", b.String())
}

func medianRSS(ss []stallSample) uint64 {
	v := make([]uint64, len(ss))
	for i, s := range ss {
		v[i] = s.coreRSS
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// runStalledSubscriber (issue 56): through the front, one subscriber that reads and one that never
// reads (a `crictl events` suspended with Ctrl-Z: its own connection with 64 KiB windows), while one
// worker cycles pods (a pod, a container that exits, stop and remove) one after the other for churn;
// pleg-nri with its default queue and the stall timeout stall, so that the queue never fills and
// only the stall can evict it. Every period it samples both processes' RSS and the checkpoint. It
// checks:
//   - the stalled subscriber is evicted once, for "stalled", no sooner than stall after it stopped
//     reading and within stall + 30 s (its buffers fill within seconds, the sweep runs every second);
//   - before the eviction the checkpoint holds deleted pods (the stalled subscriber, not told of their
//     DELETED, pins them: the check below can fail), and from the first checkpoint written after it
//     none: the checkpoint keeps advancing and is written while the pods churn;
//   - the reading subscriber received every event of every pod cycled, in order, and was not ended;
//   - the stalled subscriber, reading again, receives what was buffered for it, then
//     RESOURCE_EXHAUSTED saying it took no event: it is told, never left to lose events silently.
func runStalledSubscriber(t *testing.T, stall, churn, period time.Duration) stallResult {
	t.Helper()
	logOnFailure(t)
	run := "stalled-" + randomRun()
	t.Cleanup(func() { removePodsOf(t, run) })
	p := startPlegNRI(t, "--subscriber-stall-timeout", stall.String(), "--log-level", "info")
	res := stallResult{stall: stall, churn: churn}
	frontPID := p.frontPID(t)
	checkpoint := filepath.Join(p.stateDir(), "checkpoint")

	healthy := recordEvents(t, p.Socket)
	waitMetric(t, p, "pleg_nri_subscribers", 1)
	stuck := openStuckSubscriber(t, p.Socket)
	waitMetric(t, p, "pleg_nri_subscribers", 2)
	stopped := time.Now() // it never reads

	// The eviction, watched every 100 ms.
	evictedAt := make(chan time.Time, 1)
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	go func() {
		_ = testutil.PollEvery(watchCtx, churn+stall, 100*time.Millisecond, "the eviction", func() (bool, error) {
			v, err := p.Metric("pleg_nri_subscribers_evicted_total")
			if err != nil || v == 0 {
				return false, nil
			}
			evictedAt <- time.Now()
			return true, nil
		})
	}()

	// The churn: one worker, pod after pod.
	rt := newCRI(t, p.Socket).rt
	type podRun struct{ pod, ctr string }
	var (
		mu   sync.Mutex
		runs []podRun
	)
	churnCtx, stopChurn := context.WithTimeout(context.Background(), churn)
	defer stopChurn()
	churnErr := make(chan error, 1)
	go func() {
		for i := 0; churnCtx.Err() == nil; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			pod, ctrs, _, err := podCycle(ctx, rt, fmt.Sprint("stalled-", i), run, 1)
			cancel()
			if err != nil {
				churnErr <- err
				return
			}
			mu.Lock()
			runs = append(runs, podRun{pod, ctrs[0]})
			mu.Unlock()
		}
		churnErr <- nil
	}()

	// deletedBy returns the sandboxes whose DELETED the healthy subscriber had received by then.
	deletedBy := func(by time.Time) map[string]bool {
		out := map[string]bool{}
		mu.Lock()
		pods := map[string]bool{}
		for _, r := range runs {
			pods[r.pod] = true
		}
		mu.Unlock()
		for _, e := range healthy.Events() {
			if e.ContainerEventType == evDeleted && pods[e.ContainerId] && time.Unix(0, e.CreatedAt).Before(by) {
				out[e.ContainerId] = true
			}
		}
		return out
	}
	var evicted time.Time
	tick := time.NewTicker(period)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case err := <-churnErr:
			if err != nil {
				t.Fatalf("the churn: %v", err)
			}
			done = true
			continue
		case at := <-evictedAt:
			evicted = at
			continue
		case <-tick.C:
		}
		now := time.Now()
		s := stallSample{at: now.Sub(stopped), evicted: !evicted.IsZero()}
		s.coreRSS, _ = processMemory(t, p.PID)
		s.frontRSS, _ = processMemory(t, frontPID)
		ck, err := pleg.ReadCheckpoint(checkpoint)
		if err != nil {
			t.Fatalf("the checkpoint at %s: %v", s.at.Round(time.Second), err)
		}
		s.checkpointAge = now.Sub(ck.WrittenAt)
		deleted := deletedBy(now.Add(-time.Second))
		for _, o := range ck.Objects {
			if o.Kind == pleg.KindSandbox {
				s.checkpointPods++
				if deleted[o.ID] {
					s.deleted++
				}
			}
		}
		res.samples = append(res.samples, s)
	}
	stopWatch()
	res.pods = len(runs)
	if evicted.IsZero() {
		select {
		case evicted = <-evictedAt:
		default:
			t.Fatalf("the stalled subscriber was not evicted in %s of churn (stall timeout %s)", churn, stall)
		}
	}
	res.evictedAfter = evicted.Sub(stopped)

	// The eviction: once, for the stall, within the bound.
	if v := p.metric(t, "pleg_nri_subscribers_evicted_total", `reason="stalled"`); v != 1 {
		t.Errorf("%v subscribers evicted for a stall, want 1; all evictions: %v", v, p.metric(t, "pleg_nri_subscribers_evicted_total"))
	}
	if res.evictedAfter < stall || res.evictedAfter > stall+30*time.Second {
		t.Errorf("the stalled subscriber was evicted %s after it stopped reading, want between the stall timeout %s and 30 s more", res.evictedAfter, stall)
	}
	ev := evictions(t, p.Log())
	if len(ev) != 1 {
		t.Fatalf("%d eviction log lines, want 1", len(ev))
	}
	res.eviction = ev[0]
	waitMetric(t, p, "pleg_nri_subscribers", 1)

	// The checkpoint: pinned before the eviction, advancing after it.
	pinned := false
	for _, s := range res.samples {
		if !s.evicted {
			pinned = pinned || s.deleted > 0
			continue
		}
		// A sample within a second of the eviction may read a checkpoint written just before it.
		if s.at-res.evictedAfter < time.Second {
			continue
		}
		if s.deleted > 0 || s.checkpointAge > 5*time.Second {
			t.Errorf("checkpoint at %s, after the eviction: written %s before, %d pods of which %d already deleted; want written within 5 s and none deleted",
				s.at.Round(time.Second), s.checkpointAge.Round(time.Millisecond), s.checkpointPods, s.deleted)
		}
	}
	if !pinned {
		t.Errorf("no checkpoint before the eviction held a deleted pod: the stalled subscriber pinned nothing, so this run shows nothing of its release")
	}

	// The reading subscriber: every event of every pod, in order.
	if err := healthy.Err(); err != nil {
		t.Errorf("the reading subscriber's stream ended: %v", err)
	}
	waitStable(t, "events received", time.Second, time.Minute, func() float64 { return float64(len(healthy.Events())) })
	evs := healthy.Events()
	for _, r := range runs {
		for _, id := range []string{r.pod, r.ctr} {
			var got []runtimeapi.ContainerEventType
			for _, e := range evs {
				if e.ContainerId == id {
					got = append(got, e.ContainerEventType)
				}
			}
			if !slices.Equal(got, lifecycle) {
				t.Errorf("the reading subscriber's events of %s: %v, want %v", short(id), got, lifecycle)
			}
		}
	}

	// The stalled subscriber reads again.
	res.resumed, res.end = stuck.resume(10 * time.Second)
	if status.Code(res.end) != codes.ResourceExhausted || !strings.Contains(res.end.Error(), "took no event") {
		t.Errorf("the stalled subscriber, reading again: %d events, then %v; want RESOURCE_EXHAUSTED saying it took no event", res.resumed, res.end)
	}
	return res
}

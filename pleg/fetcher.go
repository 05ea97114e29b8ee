package pleg

// The status fetcher: the CRI status calls the state machine asks for (a first status, a retry, a
// verification, a recheck, an OOM check), queued ready or delayed, made by a pool of workers, each
// answer handed back to the state machine through the inbox (applyFetch in calls.go).

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/retry"
)

// fetchReq asks for one CRI status.
type fetchReq struct {
	id     string
	kind   Kind
	verify bool // the delayed verification after a STARTED/STOPPED built from fast facts
	// recheck asks again for a status that changed in a way no phase tells (a resource update)
	recheck bool
	// oom asks Config.OOM whether the container's cgroup recorded an OOM kill
	oom    bool
	cgroup string    // the container's cgroupsPath, for an oom request
	due    time.Time // not before
}

// fetchResult is a status answer, delivered back to the state machine through the inbox.
type fetchResult struct {
	req       fetchReq
	sandbox   *runtimeapi.PodSandboxStatus
	container *runtimeapi.ContainerStatus
	oomKilled bool // the answer of an OOM check
	err       error
	at        time.Time // when the answer came
}

// fetcher queues status calls: ready ones for the workers, delayed ones (retries, verifications) in a
// heap by due time. The state machine pushes under PLEG.mu; the dispatcher and the test helper take.
type fetcher struct {
	clock Clock

	// mu guards ready and delayed.
	mu      sync.Mutex
	ready   []fetchReq
	delayed fetchHeap

	wake chan struct{} // capacity 1: a request was pushed
}

func newFetcher(c Clock) *fetcher {
	return &fetcher{clock: c, wake: make(chan struct{}, 1)}
}

func (f *fetcher) push(r fetchReq) {
	f.mu.Lock()
	if r.due.IsZero() || !r.due.After(f.clock()) {
		f.ready = append(f.ready, r)
	} else {
		heap.Push(&f.delayed, r)
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// take returns the requests due at now (all of them when force is set), in order, and the due time of
// the next delayed one (zero when none).
func (f *fetcher) take(now time.Time, force bool) ([]fetchReq, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for f.delayed.Len() > 0 && (force || !f.delayed[0].due.After(now)) {
		f.ready = append(f.ready, heap.Pop(&f.delayed).(fetchReq))
	}
	out := f.ready
	f.ready = nil
	var next time.Time
	if f.delayed.Len() > 0 {
		next = f.delayed[0].due
	}
	return out, next
}

// fetchHeap orders the delayed requests by due time (container/heap).
type fetchHeap []fetchReq

func (h fetchHeap) Len() int           { return len(h) }
func (h fetchHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h fetchHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *fetchHeap) Push(x any)        { *h = append(*h, x.(fetchReq)) }
func (h *fetchHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// backoff is the retry policy of status calls.
type backoff struct {
	initial     time.Duration // first NotFound retry delay
	max         time.Duration // NotFound retry delay cap
	errMax      time.Duration // retry delay cap for other errors
	window      time.Duration // NotFound retries stop after this long...
	maxAttempts int           // ...or after this many attempts (bounds the window under a fake clock)
}

var defaultBackoff = backoff{
	initial:     2 * time.Millisecond,
	max:         100 * time.Millisecond,
	errMax:      time.Second,
	window:      5 * time.Second,
	maxAttempts: 64,
}

func (b backoff) delay(attempt int, limit time.Duration) time.Duration {
	return retry.Nth(b.initial, limit, attempt-1)
}

// runFetchers runs the dispatcher and the status workers until ctx is done.
func (p *PLEG) runFetchers(ctx context.Context, wg *sync.WaitGroup) {
	work := make(chan fetchReq)
	for range p.cfg.StatusWorkers {
		wg.Go(func() {
			for {
				select {
				case r := <-work:
					res := p.callStatus(ctx, r)
					if ctx.Err() != nil {
						return
					}
					p.enqueue(input{res: &res})
				case <-ctx.Done():
					return
				}
			}
		})
	}
	wg.Go(func() {
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		for {
			batch, next := p.fetch.take(p.clock(), false)
			for _, r := range batch {
				select {
				case work <- r:
				case <-ctx.Done():
					return
				}
			}
			if len(batch) > 0 {
				continue
			}
			var tc <-chan time.Time
			if !next.IsZero() {
				timer.Reset(max(next.Sub(p.clock()), 0))
				tc = timer.C
			}
			select {
			case <-ctx.Done():
				return
			case <-p.fetch.wake:
			case <-tc:
			}
		}
	})
}

// callStatus makes one status call under the per-call timeout and measures it.
func (p *PLEG) callStatus(ctx context.Context, r fetchReq) fetchResult {
	if r.oom {
		return p.callOOM(ctx, r)
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.StatusTimeout)
	defer cancel()
	start := time.Now()
	res := fetchResult{req: r}
	switch r.kind {
	case KindSandbox:
		res.sandbox, res.err = p.cfg.Status.PodSandboxStatus(cctx, r.id)
		if res.err == nil && res.sandbox == nil {
			res.err = fmt.Errorf("failed to get status of sandbox %s: empty status", r.id)
		}
	default:
		res.container, res.err = p.cfg.Status.ContainerStatus(cctx, r.id)
		if res.err == nil && res.container == nil {
			res.err = fmt.Errorf("failed to get status of container %s: empty status", r.id)
		}
	}
	d := time.Since(start)
	result := callResult(cctx, res.err)
	// The StatusSource's errors say what failed (containerd.CRIClient: "failed to get status of ...").
	p.metrics.StatusCall(r.kind, r.verify, result, d)
	res.at = p.clock()
	return res
}

// callOOM makes one OOM check under its timeout and measures it.
func (p *PLEG) callOOM(ctx context.Context, r fetchReq) fetchResult {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.OOMCheckTimeout)
	defer cancel()
	start := time.Now()
	res := fetchResult{req: r}
	res.oomKilled, res.err = p.cfg.OOM.OOMKilled(cctx, r.id, r.cgroup)
	result := callResult(cctx, res.err)
	if res.err != nil {
		res.err = fmt.Errorf("failed to check container %s for an OOM kill: %w", r.id, res.err)
	}
	if m, ok := p.metrics.(OOMCheckMetrics); ok {
		m.OOMCheckCall(result, time.Since(start))
	}
	res.at = p.clock()
	return res
}

// callResult classifies a status or OOM call's outcome for the metrics: ok, not found, timed out (ctx is
// the call's own), or another error.
func callResult(ctx context.Context, err error) string {
	switch {
	case err == nil:
		return StatusResultOK
	case isNotFound(err):
		return StatusResultNotFound
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded:
		return StatusResultTimeout
	}
	return StatusResultError
}

// isNotFound reports whether err says the object does not exist, as an errdefs error or a gRPC status.
func isNotFound(err error) bool {
	if errdefs.IsNotFound(err) {
		return true
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus().Code() == codes.NotFound
	}
	return false
}

package fresh

import (
	"context"
	"sync"
	"time"

	"github.com/containerd/log"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/retry"
)

// After a held read gave up (the hold mode's bound passed with the runtime still showing running an
// object the stream reported stopped), the client has the runtime's older answer, and a kubelet 1.35 or
// 1.36 caches it as newer than the STOPPED it got: nothing would correct it until the pod's next event
// or the 300 s relist. So the proxy watches the runtime until its answer shows the stop and then asks
// the event source to send the object's STOPPED again (ProxyConfig.Refresh: the core stamps it now and
// fills it from its state, in order with the pod's other events), for every subscriber.
const (
	// refreshWatch bounds how long the runtime is watched for one object.
	refreshWatch = 2 * time.Minute
	// refreshPollMin and refreshPollMax are the backoff of that watch.
	refreshPollMin = 50 * time.Millisecond
	refreshPollMax = time.Second
	// refreshCallTimeout bounds each status call of the watch, and the refresh asked.
	refreshCallTimeout = 10 * time.Second
)

// refresher watches the objects whose held reads gave up and asks for their refresh.
type refresher struct {
	cri runtimeapi.RuntimeServiceClient
	// refresh asks the event source for the refresh of an object (ProxyConfig.Refresh).
	refresh func(ctx context.Context, id string) error
	now     func() time.Time
	// done ends the watches (the proxy's shutdown).
	done <-chan struct{}
	// sent reports each refresh (nil: not wanted).
	sent func(caughtUp bool)

	// mu guards watching: the objects being watched.
	mu       sync.Mutex
	watching map[string]bool
}

func newRefresher(cri runtimeapi.RuntimeServiceClient, refresh func(context.Context, string) error, now func() time.Time, done <-chan struct{}, sent func(bool)) *refresher {
	return &refresher{cri: cri, refresh: refresh, now: now, done: done, sent: sent, watching: map[string]bool{}}
}

// watch starts watching object id (a container when sandboxID differs, else a sandbox), once.
func (r *refresher) watch(ctx context.Context, id, sandboxID string) {
	r.mu.Lock()
	if r.watching[id] {
		r.mu.Unlock()
		return
	}
	r.watching[id] = true
	r.mu.Unlock()
	go func() {
		defer func() {
			r.mu.Lock()
			delete(r.watching, id)
			r.mu.Unlock()
		}()
		logger := log.G(ctx).WithField("id", id)
		deadline := r.now().Add(refreshWatch)
		poll := retry.Doubling(refreshPollMin, refreshPollMax)
		for delay := poll.NextBackOff(); ; delay = poll.NextBackOff() {
			if r.caughtUp(id, sandboxID) {
				break
			}
			if r.now().Add(delay).After(deadline) {
				logger.Warn("the runtime never showed the stop the event stream reported: no refresh")
				if r.sent != nil {
					r.sent(false)
				}
				return
			}
			select {
			case <-time.After(delay):
			case <-r.done:
				return
			}
		}
		cctx, cancel := r.callCtx()
		defer cancel()
		if err := r.refresh(cctx, id); err != nil {
			logger.WithError(err).Warn("the runtime caught up with a stop whose read had been answered with its older state: the refresh was not taken")
			return
		}
		if r.sent != nil {
			r.sent(true)
		}
		logger.Info("refresh asked for: the runtime caught up with a stop whose read had been answered with its older state")
	}()
}

func (r *refresher) callCtx() (context.Context, context.CancelFunc) {
	return boundedCtx(context.Background(), refreshCallTimeout, r.done)
}

// boundedCtx is ctx bounded by timeout and ended when done is closed (the proxy's shutdown).
func boundedCtx(ctx context.Context, timeout time.Duration, done <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// caughtUp says whether the runtime's answer shows the stop of id (or that it is gone).
func (r *refresher) caughtUp(id, sandboxID string) bool {
	ctx, cancel := r.callCtx()
	defer cancel()
	if id == sandboxID {
		resp, err := r.cri.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
		return status.Code(err) == codes.NotFound || (err == nil && resp.GetStatus().GetState() != runtimeapi.PodSandboxState_SANDBOX_READY)
	}
	resp, err := r.cri.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	return status.Code(err) == codes.NotFound || (err == nil && !running(resp.GetStatus().GetState()))
}

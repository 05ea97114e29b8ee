package kubelet

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/containerd/log"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// After a held read gave up (the hold mode's bound passed with the runtime still showing running an
// object the stream reported stopped), the client has the runtime's older answer, and a kubelet 1.35 or
// 1.36 caches it as newer than the STOPPED it got: nothing would correct it until the pod's next event
// or the 300 s relist. So the proxy watches the runtime until its answer shows the stop and then sends
// every subscriber a refresh: a STOPPED for the object, with a new created_at and the pod's statuses as
// the runtime answers them then (built as containerd builds its own events).
const (
	// refreshWatch bounds how long the runtime is watched for one object.
	refreshWatch = 2 * time.Minute
	// refreshPollMin and refreshPollMax are the backoff of that watch.
	refreshPollMin = 50 * time.Millisecond
	refreshPollMax = time.Second
	// injectedKeep bounds the refresh events kept for the streams that have not sent them yet.
	injectedKeep = 64
	// refreshCallTimeout bounds each status call of the watch.
	refreshCallTimeout = 10 * time.Second
)

// injected is one refresh event.
type injected struct {
	seq uint64
	b   []byte
}

// refresher watches the objects whose held reads gave up and hands the refresh events to the streams.
type refresher struct {
	cri runtimeapi.RuntimeServiceClient
	now func() time.Time
	// done ends the watches (the proxy's shutdown).
	done <-chan struct{}
	// sent reports each refresh (nil: not wanted).
	sent func(caughtUp bool)

	// mu guards everything below.
	mu sync.Mutex
	// watching are the objects being watched.
	watching map[string]bool
	// seq numbers the refresh events; events are the last injectedKeep of them.
	seq    uint64
	events []injected
	// wake is closed (and replaced) when a refresh event is added.
	wake chan struct{}
}

func newRefresher(cri runtimeapi.RuntimeServiceClient, now func() time.Time, done <-chan struct{}, sent func(bool)) *refresher {
	return &refresher{cri: cri, now: now, done: done, sent: sent, watching: map[string]bool{}, wake: make(chan struct{})}
}

// position returns the sequence number of the last refresh event and the channel closed by the next.
func (r *refresher) position() (uint64, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq, r.wake
}

// since returns the refresh events after seq, and the new position.
func (r *refresher) since(seq uint64) ([][]byte, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out [][]byte
	for _, e := range r.events {
		if e.seq > seq {
			out = append(out, e.b)
		}
	}
	return out, r.seq
}

func (r *refresher) inject(b []byte) {
	r.mu.Lock()
	r.seq++
	r.events = append(r.events, injected{seq: r.seq, b: b})
	if len(r.events) > injectedKeep {
		r.events = r.events[len(r.events)-injectedKeep:]
	}
	close(r.wake)
	r.wake = make(chan struct{})
	r.mu.Unlock()
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
		for delay := refreshPollMin; ; delay = min(2*delay, refreshPollMax) {
			if r.caughtUp(id, sandboxID) {
				break
			}
			if r.now().Add(delay).After(deadline) {
				logger.Warn("the runtime never showed the stop the event stream reported: no refresh event")
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
		ev, err := r.event(id, sandboxID)
		if err != nil {
			logger.WithError(err).Warn("failed to build the refresh event")
			return
		}
		b, err := proto.Marshal(ev)
		if err != nil {
			return
		}
		r.inject(b)
		if r.sent != nil {
			r.sent(true)
		}
		logger.Info("sent a refresh event: the runtime caught up with a stop whose read had been answered with its older state")
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

// event builds the refresh: a STOPPED of id carrying the runtime's statuses of its sandbox and of every
// container of that sandbox, as containerd builds its own events.
func (r *refresher) event(id, sandboxID string) (*runtimeapi.ContainerEventResponse, error) {
	ctx, cancel := r.callCtx()
	defer cancel()
	sb, err := r.cri.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandboxID})
	if err != nil {
		return nil, err
	}
	list, err := r.cri.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sandboxID}})
	if err != nil {
		return nil, err
	}
	var statuses []*runtimeapi.ContainerStatus
	for _, c := range list.GetContainers() {
		st, err := r.cri.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
		if status.Code(err) == codes.NotFound {
			continue
		}
		if err != nil {
			return nil, err
		}
		statuses = append(statuses, st.GetStatus())
	}
	sort.Slice(statuses, func(i, j int) bool {
		if statuses[i].GetCreatedAt() != statuses[j].GetCreatedAt() {
			return statuses[i].GetCreatedAt() < statuses[j].GetCreatedAt()
		}
		return statuses[i].GetId() < statuses[j].GetId()
	})
	return &runtimeapi.ContainerEventResponse{
		ContainerId:        id,
		ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		CreatedAt:          r.now().UnixNano(),
		PodSandboxStatus:   sb.GetStatus(),
		ContainersStatuses: statuses,
	}, nil
}

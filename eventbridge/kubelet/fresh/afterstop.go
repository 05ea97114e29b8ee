package fresh

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/log"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
)

// A refresh after a stop. A kubelet 1.35 or 1.36 with EventedPLEG ends each sync of a pod by noting
// the time, and its next sync of that pod waits (pod cache, GetNewerThan) for a status of the pod newer
// than that time: an event of the pod, or the global cache tick every 5 s. When the sync is the one that
// stops the pod, the STOPPED events of that stop were stamped before the sync ended, so the next step
// of the termination waits for the tick: 0-5 s more per step than on GenericPLEG, whose relist ticks
// every second (k/k #124704, #139493).
//
// The endpoint sees the stop (StopContainer, StopPodSandbox) and the reads the kubelet makes of the pod
// right after it, the last calls of that sync. Once the client's calls about the pod have been quiet
// for afterStopQuiet, the endpoint asks the event source (ProxyConfig.Refresh: the core, through
// corelink.Relay.RefreshStopped) to send the stopped object's STOPPED again: the core stamps it after
// everything it sent for the pod and fills it from its state, in order with the pod's other events
// (pleg.PLEG.RefreshStopped).
//
// NOTE(issue 59): an early exit. A container that exits within earlyExitWindow of its start (an init
// container, a job's, one that fails at once) races with the kubelet's own syncs of its pod. Kubelet
// 1.37.2 ends the sync that started it with a relist of the pod (kubelet.go:2322-2326, postSync), which
// shows the container running and starts another sync with that status; pleg-nri's STOPPED comes a few
// ms later, while that sync runs, and the relist it asks for (generic.go:413-444) is stamped when it
// begins (kuberuntime_manager.go:491), before that sync ends (pod_workers.go:1322). The sync after it,
// the one the ContainerDied starts, waits for a status newer than that end (pod_workers.go:1288): the
// next 1 s relist, 381-986 ms in 5 pods of 24 three-step init chains. A sync with nothing to start makes
// no relist of its own. Kubelets 1.35 and 1.36 hit the same race with the STOPPED's created_at. So
// the endpoint also asks for the refresh of a container whose STOPPED it sends within earlyExitWindow
// of the runtime's answer to its StartContainer, once the calls about its pod have been quiet for
// earlyExitQuiet: the refresh's relist (1.37) or created_at (1.35, 1.36) is newer than that sync's
// end. docs/workloads-standalone.md has the kubelet's log and the figures.
const (
	// afterStopQuiet is how long the client's calls about a stopped pod must have been quiet: the
	// kubelet ends its sync within microseconds of its last read.
	afterStopQuiet = 50 * time.Millisecond
	// afterStopMax bounds the wait for that quiet.
	afterStopMax = 2 * time.Second
	// earlyExitWindow: a container that exits within it of the answer to its StartContainer exited
	// early (see earlyexit below).
	earlyExitWindow = time.Second
	// earlyExitQuiet is how long the calls about the pod of an early exit must have been quiet.
	earlyExitQuiet = 20 * time.Millisecond
	// afterStopCallTimeout bounds each call the stopRefresher makes.
	afterStopCallTimeout = 2 * time.Second
)

// settleMethods are the calls that name one object by the first field of their request (a container
// or sandbox id): the stops start a settling, and each of them about a settling pod pushes its end.
var settleMethods = map[string]bool{
	kubelet.StopContainerMethod:    true,
	kubelet.StopPodSandboxMethod:   true,
	kubelet.ContainerStatusMethod:  true,
	kubelet.PodSandboxStatusMethod: true,
	kubelet.RemoveContainerMethod:  true,
}

// stopRefresher asks for the refreshes after the stops its proxy forwarded. It is safe for concurrent use.
type stopRefresher struct {
	cri runtimeapi.RuntimeServiceClient
	// refresh asks the core for the refresh of an object.
	refresh func(ctx context.Context, id string) error
	now     func() time.Time
	done    <-chan struct{}
	// quiet and max are afterStopQuiet and afterStopMax (shorter in tests); earlyWindow and earlyQuiet
	// are earlyExitWindow and earlyExitQuiet.
	quiet, max              time.Duration
	earlyWindow, earlyQuiet time.Duration
	// index knows the pods from the events sent; the runtime is asked about the others.
	index *podIndex

	// n counts the settling pods, read without the lock by every call that could touch one.
	n  atomic.Int64
	mu sync.Mutex
	// pods are the settling pods by sandbox id; ids maps each of their objects' ids to its pod.
	pods map[string]*settling
	ids  map[string]*settling
	// started maps each container the client starts to when the runtime answered its StartContainer
	// (while the call runs: when it began), until its STOPPED is sent or earlyWindow has passed.
	started map[string]time.Time
}

// settling is a pod whose stop is settling.
type settling struct {
	sandboxID string
	// target is the object whose STOPPED is sent again: the sandbox once it was stopped, else the
	// container stopped last.
	target string
	// last is the end of the last call about the pod; start the first stop's.
	last, start time.Time
	// quiet is how long the calls about the pod must have been quiet: the stopRefresher's quiet, or
	// its earlyQuiet when an early exit began the settling.
	quiet time.Duration
}

func newStopRefresher(cri runtimeapi.RuntimeServiceClient, refresh func(context.Context, string) error, now func() time.Time, done <-chan struct{}) *stopRefresher {
	return &stopRefresher{cri: cri, refresh: refresh, now: now, done: done, quiet: afterStopQuiet, max: afterStopMax,
		earlyWindow: earlyExitWindow, earlyQuiet: earlyExitQuiet,
		index: newPodIndex(), pods: map[string]*settling{}, ids: map[string]*settling{}, started: map[string]time.Time{}}
}

var _ kubelet.ReadHook = (*stopRefresher)(nil)

// Sending learns the pods from the events sent (podIndex), and begins the settling of the pod of a
// container that exited early: its STOPPED is sent within earlyWindow of its start.
func (s *stopRefresher) Sending(event []byte) {
	s.index.observe(event)
	h, ok := scanEvent(event, false)
	if !ok || h.typ != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT || h.id == "" {
		return
	}
	now := s.now()
	s.mu.Lock()
	at, found := s.started[h.id]
	delete(s.started, h.id)
	s.mu.Unlock()
	if !found || now.Sub(at) > s.earlyWindow {
		return
	}
	// Sending has no context of its own: the settling's calls are bounded by callCtx and end with
	// s.done.
	go s.begin(context.Background(), h.id, false, s.earlyQuiet)
}

// Wants the starts and the stops, and the calls about an object that may belong to a settling pod.
func (s *stopRefresher) Wants(method string) bool {
	return method == kubelet.StartContainerMethod || method == kubelet.StopContainerMethod || method == kubelet.StopPodSandboxMethod ||
		(settleMethods[method] && s.n.Load() > 0)
}

// Call forwards c and reports it once the runtime answered.
func (s *stopRefresher) Call(ctx context.Context, c *kubelet.Call, forward func(context.Context) error) error {
	id := c.ObjectID()
	if c.Method() == kubelet.StartContainerMethod && id != "" {
		// A container can exit, and its STOPPED be sent, before the runtime answers its start.
		s.mu.Lock()
		s.started[id] = s.now()
		s.mu.Unlock()
	}
	if err := forward(ctx); err != nil {
		s.called(ctx, c.Method(), id, err)
		return err
	}
	_, answerErr := c.Answer()
	s.called(ctx, c.Method(), id, answerErr)
	return nil
}

// called reports a call of method about id that the runtime answered with err.
func (s *stopRefresher) called(ctx context.Context, method, id string, err error) {
	if id == "" {
		return
	}
	now := s.now()
	s.mu.Lock()
	if p := s.ids[id]; p != nil {
		p.last = now
		if method == kubelet.StopPodSandboxMethod && err == nil {
			p.target = id
		}
	}
	if method == kubelet.StartContainerMethod {
		// The starts older than the window can no longer exit early.
		for c, at := range s.started {
			if now.Sub(at) > s.earlyWindow {
				delete(s.started, c)
			}
		}
		// The window runs from the answer, unless the STOPPED was already sent (the entry is gone) or
		// the start failed.
		if _, pending := s.started[id]; pending && err == nil {
			s.started[id] = now
		} else {
			delete(s.started, id)
		}
	}
	s.mu.Unlock()
	if err != nil || (method != kubelet.StopContainerMethod && method != kubelet.StopPodSandboxMethod) {
		return
	}
	go s.begin(context.WithoutCancel(ctx), id, method == kubelet.StopPodSandboxMethod, s.quiet)
}

// begin starts settling the pod of the stopped object id, its calls to be quiet for quiet, or joins its
// settling.
func (s *stopRefresher) begin(ctx context.Context, id string, sandbox bool, quiet time.Duration) {
	sandboxID, containers, ok := s.index.pod(id, sandbox)
	if !ok {
		// The events sent named neither the object nor its pod (a pod older than this front's
		// stream that had no event since): the runtime says.
		if sandboxID, containers, ok = s.podFromRuntime(ctx, id, sandbox); !ok {
			return
		}
	}
	now := s.now()
	s.mu.Lock()
	p := s.pods[sandboxID]
	fresh := p == nil
	if fresh {
		p = &settling{sandboxID: sandboxID, target: id, start: now, quiet: quiet}
		s.pods[sandboxID] = p
		s.ids[sandboxID] = p
		s.n.Add(1)
	} else if sandbox || p.target != sandboxID {
		p.target = id
	}
	p.last = now
	for _, c := range containers {
		s.ids[c] = p
	}
	s.mu.Unlock()
	if fresh {
		s.settle(ctx, p)
	}
}

// podFromRuntime asks the runtime for the sandbox of object id and its containers.
func (s *stopRefresher) podFromRuntime(ctx context.Context, id string, sandbox bool) (sandboxID string, containers []string, ok bool) {
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	sandboxID = id
	if !sandbox {
		list, err := s.cri.ListContainers(cctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: id}})
		if err != nil || len(list.GetContainers()) != 1 {
			log.G(ctx).WithError(err).WithField("container", id).Debug("refresh after a stop: the container's pod is unknown")
			return "", nil, false
		}
		sandboxID = list.GetContainers()[0].GetPodSandboxId()
	}
	list, err := s.cri.ListContainers(cctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sandboxID}})
	if err != nil {
		log.G(ctx).WithError(err).WithField("sandbox", sandboxID).Debug("refresh after a stop: cannot list the pod's containers")
		return "", nil, false
	}
	for _, c := range list.GetContainers() {
		containers = append(containers, c.GetId())
	}
	return sandboxID, containers, true
}

// settle waits until the client's calls about p have been quiet for p.quiet (at most s.max after its
// first stop), then asks for the refresh.
func (s *stopRefresher) settle(ctx context.Context, p *settling) {
	for {
		s.mu.Lock()
		now := s.now()
		wait := p.last.Add(p.quiet).Sub(now)
		if over := p.start.Add(s.max).Sub(now); over < wait {
			wait = over
		}
		if wait <= 0 {
			for id, q := range s.ids {
				if q == p {
					delete(s.ids, id)
				}
			}
			delete(s.pods, p.sandboxID)
			s.n.Add(-1)
			target := p.target
			s.mu.Unlock()
			s.ask(ctx, target)
			return
		}
		s.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-s.done:
			t.Stop()
			return
		}
	}
}

// ask asks for the refresh of id.
func (s *stopRefresher) ask(ctx context.Context, id string) {
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	logger := log.G(ctx).WithField("id", id)
	if err := s.refresh(cctx, id); err != nil {
		logger.WithError(err).Debug("refresh after a stop: the core did not take it")
		return
	}
	logger.Debug("refresh after a stop asked for")
}

// callCtx is a call's context: bounded, and ended by the proxy's shutdown.
func (s *stopRefresher) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return boundedCtx(ctx, afterStopCallTimeout, s.done)
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

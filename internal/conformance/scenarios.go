package conformance

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	created = runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
	started = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
	stopped = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
	deleted = runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT
)

// allTypes are the four transitions of an object, in the order they happen.
var allTypes = []runtimeapi.ContainerEventType{created, started, stopped, deleted}

// The paths of the lifecycle scenario: one container each, in one pod.
const (
	caseExit0     = "exit-0"
	caseExitNon0  = "exit-3"
	caseStop      = "stop-container"
	caseOOM       = "oom-kill"
	caseStartFail = "start-fails"
	casePodStop   = "stop-pod"
)

// lifecycleCase is one container of the lifecycle scenario.
type lifecycleCase struct {
	name    string
	command []string
	// memory, if set, is the container's memory limit.
	memory int64
	// id is the container's id once created.
	id string
	// startErr is StartContainer's error.
	startErr error
	// final is the runtime's status of the container once it exited (nil if it never did).
	final *runtimeapi.ContainerStatus
}

// lifecycleRun is the recording of the lifecycle scenario: a pod whose containers take every path out.
type lifecycleRun struct {
	podID string
	cases []*lifecycleCase
	// evs is what the first subscriber received of the scenario's objects; all is what it received in all
	// (for created_at's order per subscriber); reader's are the second subscriber's.
	evs, all, readerAll []received
	// reads are the second subscriber's reads after each STOPPED it got.
	reads *readLog
}

func (l *lifecycleRun) byName(name string) *lifecycleCase {
	for _, c := range l.cases {
		if c.name == name {
			return c
		}
	}
	return nil
}

// containerIDs are the ids of the scenario's containers that were created.
func (l *lifecycleRun) containerIDs() []string {
	var ids []string
	for _, c := range l.cases {
		if c.id != "" {
			ids = append(ids, c.id)
		}
	}
	return ids
}

// readLog is what the reads after STOPPED events saw: the first contradiction, and the figures.
type readLog struct {
	mu sync.Mutex
	// violations are the reads that did not show the exit yet.
	violations []string
	// checked counts the STOPPED events read after.
	checked int
	// timestamps are PodSandboxStatus answers whose timestamp was set without containers_statuses.
	timestamps []string
}

func (r *readLog) add(v ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violations = append(r.violations, v...)
}

// lifecycleScenario runs (once per run) a pod with one container for each path out of a container:
// exit 0, exit non-zero, StopContainer, an OOM kill, a start that fails, StopPodSandbox; then removes
// them all, and returns what two subscribers received.
func (s *suite) lifecycleScenario(ctx context.Context) (*lifecycleRun, error) {
	return s.lifecycle.get("lifecycle", func() (*lifecycleRun, error) { return s.runLifecycle(ctx) })
}

// memo is a scenario's recording, made at most once per run.
type memo[T any] struct {
	done bool
	v    T
	err  error
}

func (m *memo[T]) get(scenario string, run func() (T, error)) (T, error) {
	if !m.done {
		m.done = true
		if m.v, m.err = run(); m.err != nil {
			m.err = fmt.Errorf("the %s scenario failed: %w", scenario, m.err)
		}
	}
	return m.v, m.err
}

// subscribeSynced subscribes and returns once the subscription is live (sync).
func (s *suite) subscribeSynced(ctx context.Context) (*recorder, error) {
	rec, err := subscribe(ctx, s.rt, s.opts.Now, nil)
	if err != nil {
		return nil, err
	}
	if err := s.sync(ctx, rec); err != nil {
		rec.stop()
		return nil, err
	}
	return rec, nil
}

func (s *suite) runLifecycle(ctx context.Context) (*lifecycleRun, error) {
	run := &lifecycleRun{reads: &readLog{}, cases: []*lifecycleCase{
		{name: caseExit0, command: []string{"sh", "-c", "exit 0"}},
		{name: caseExitNon0, command: []string{"sh", "-c", "exit 3"}},
		{name: caseStop, command: []string{"sleep", "3600"}},
		{name: caseOOM, command: []string{"sh", "-c", "exec tail /dev/zero"}, memory: 32 << 20},
		{name: caseStartFail, command: []string{"/pleg-nri-conformance-no-such-binary"}},
		{name: casePodStop, command: []string{"sleep", "3600"}},
	}}
	main, err := subscribe(ctx, s.rt, s.opts.Now, nil)
	if err != nil {
		return nil, err
	}
	defer main.stop()
	reader, err := subscribe(ctx, s.rt, s.opts.Now, func(r received) { s.readAfter(ctx, r, run.reads) })
	if err != nil {
		return nil, err
	}
	defer reader.stop()
	if err := s.sync(ctx, main, reader); err != nil {
		return nil, err
	}

	podID, podCfg, err := s.drv.runPod(ctx, "lifecycle")
	if err != nil {
		return nil, err
	}
	run.podID = podID
	for _, c := range run.cases {
		cfg := s.drv.containerConfig(c.name, c.command...)
		if c.memory > 0 {
			cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: c.memory}
		}
		if c.id, err = s.drv.create(ctx, podID, podCfg, cfg); err != nil {
			return nil, err
		}
	}
	for _, c := range run.cases {
		cctx, cancel := callCtx(ctx)
		_, c.startErr = s.rt.StartContainer(cctx, &runtimeapi.StartContainerRequest{ContainerId: c.id})
		cancel()
		if c.startErr != nil && c.name != caseStartFail {
			return nil, fmt.Errorf("failed to start container %s: %w", c.name, c.startErr)
		}
	}
	if c := run.byName(caseStartFail); c.startErr == nil {
		return nil, fmt.Errorf("container %s started: the runtime ran %v", c.name, c.command)
	}
	cctx, cancel := callCtx(ctx)
	_, err = s.rt.StopContainer(cctx, &runtimeapi.StopContainerRequest{ContainerId: run.byName(caseStop).id, Timeout: 0})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("failed to stop container %s: %w", caseStop, err)
	}
	// Each exited container is removed once both subscribers have its STOPPED (or EventWait passed),
	// so the reads after it find it.
	for _, name := range []string{caseExit0, caseExitNon0, caseStop, caseOOM, caseStartFail} {
		c := run.byName(name)
		if c.final, err = s.drv.waitExited(ctx, c.id, s.opts.EventWait); err != nil {
			return nil, err
		}
		if name != caseStartFail {
			for _, r := range []*recorder{main, reader} {
				r.waitFor(ctx, s.opts.EventWait, hasEvent(c.id, stopped))
			}
		}
		s.drv.removing(c.id)
		cctx, cancel := callCtx(ctx)
		_, err = s.rt.RemoveContainer(cctx, &runtimeapi.RemoveContainerRequest{ContainerId: c.id})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("failed to remove container %s: %w", name, err)
		}
	}
	cctx, cancel = callCtx(ctx)
	_, err = s.rt.StopPodSandbox(cctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: podID})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("failed to stop pod %s: %w", short(podID), err)
	}
	c := run.byName(casePodStop)
	if c.final, err = s.drv.waitExited(ctx, c.id, s.opts.EventWait); err != nil {
		return nil, err
	}
	for _, r := range []*recorder{main, reader} {
		r.waitFor(ctx, s.opts.EventWait, hasEvent(podID, stopped))
	}
	s.drv.removing(podID, c.id)
	cctx, cancel = callCtx(ctx)
	_, err = s.rt.RemovePodSandbox(cctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: podID})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("failed to remove pod %s: %w", short(podID), err)
	}
	// Every object's DELETED ends its events; then listen a little longer for duplicates.
	main.waitFor(ctx, s.opts.EventWait, func(evs []received) bool {
		for _, id := range append(run.containerIDs(), podID) {
			if !hasEvent(id, deleted)(evs) {
				return false
			}
		}
		return true
	})
	s.quiet(ctx)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids := append(run.containerIDs(), podID)
	run.evs = main.events(func(ev *runtimeapi.ContainerEventResponse) bool { return slices.Contains(ids, ev.ContainerId) })
	run.all, run.readerAll = main.events(everything), reader.events(everything)
	return run, nil
}

// quiet waits Options.Quiet, or until ctx ends.
func (s *suite) quiet(ctx context.Context) {
	select {
	case <-time.After(s.opts.Quiet):
	case <-ctx.Done():
	}
}

func everything(*runtimeapi.ContainerEventResponse) bool { return true }

// hasEvent is a condition on received events: one of type typ about id is among them.
func hasEvent(id string, typ runtimeapi.ContainerEventType) func([]received) bool {
	return func(evs []received) bool {
		for _, e := range evs {
			if e.ev.ContainerId == id && e.ev.ContainerEventType == typ {
				return true
			}
		}
		return false
	}
}

// readAfter is the second subscriber's reaction to an event: on a STOPPED of the run, the reads a
// kubelet makes through the same endpoint must already show the exit.
func (s *suite) readAfter(ctx context.Context, r received, log *readLog) {
	ev := r.ev
	if ev.ContainerEventType != stopped || !s.keep(ev) {
		return
	}
	ctx, cancel := callCtx(ctx)
	defer cancel()
	podID := ev.GetPodSandboxStatus().GetId()
	log.mu.Lock()
	log.checked++
	log.mu.Unlock()
	var bad []string
	// An object the suite has begun to remove may be gone by the read (a STOPPED that comes just
	// before the removal, such as one for a failed start, which the scenario does not wait for): not
	// found is then no stale read.
	gone := func(id string, err error) bool { return isNotFound(err) && s.drv.isRemoving(id) }
	if podID == ev.ContainerId {
		resp, err := s.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: podID})
		if gone(podID, err) {
			return
		}
		if err != nil {
			bad = append(bad, fmt.Sprintf("PodSandboxStatus %s after its STOPPED: %v", short(podID), err))
		} else if st := resp.GetStatus().GetState(); st != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
			bad = append(bad, fmt.Sprintf("PodSandboxStatus says sandbox %s is %s after its STOPPED", short(podID), st))
		}
		log.add(bad...)
		return
	}
	id := ev.ContainerId
	cs, err := s.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if gone(id, err) {
		return
	}
	if err != nil {
		bad = append(bad, fmt.Sprintf("ContainerStatus %s after its STOPPED: %v", short(id), err))
	} else if st := cs.GetStatus().GetState(); st != runtimeapi.ContainerState_CONTAINER_EXITED {
		bad = append(bad, fmt.Sprintf("ContainerStatus says container %s is %s after its STOPPED", short(id), st))
	}
	list, err := s.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: id}})
	switch {
	case err != nil:
		bad = append(bad, fmt.Sprintf("ListContainers %s after its STOPPED: %v", short(id), err))
	case len(list.Containers) == 0 && s.drv.isRemoving(id):
		// Removed between the two reads: gone, as above.
	case len(list.Containers) != 1:
		bad = append(bad, fmt.Sprintf("ListContainers lists %d containers of id %s after its STOPPED", len(list.Containers), short(id)))
	case list.Containers[0].State != runtimeapi.ContainerState_CONTAINER_EXITED:
		bad = append(bad, fmt.Sprintf("ListContainers says container %s is %s after its STOPPED", short(id), list.Containers[0].State))
	}
	if podID != "" {
		ps, err := s.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: podID})
		if err != nil {
			bad = append(bad, fmt.Sprintf("PodSandboxStatus %s after a STOPPED of its container: %v", short(podID), err))
		} else {
			for _, c := range ps.ContainersStatuses {
				if c.Id == id && c.State != runtimeapi.ContainerState_CONTAINER_EXITED {
					bad = append(bad, fmt.Sprintf("PodSandboxStatus's containers_statuses say container %s is %s after its STOPPED", short(id), c.State))
				}
			}
			if ps.Timestamp != 0 && len(ps.ContainersStatuses) == 0 {
				log.mu.Lock()
				log.timestamps = append(log.timestamps, fmt.Sprintf("PodSandboxStatus %s has timestamp %d and no containers_statuses", short(podID), ps.Timestamp))
				log.mu.Unlock()
			}
		}
	}
	log.add(bad...)
}

// loadRun is the recording of the load scenario: N containers in one pod, all stopped with it.
type loadRun struct {
	podID string
	ids   []string
	evs   []received
	// lines are the lines the runtime logged (Options.LogLines) from the pod's start until its events
	// were received; -1 without Options.LogLines.
	lines int
}

// loadScenario runs (once per run) a pod with Options.Load sleeping containers, stops and removes it.
func (s *suite) loadScenario(ctx context.Context) (*loadRun, error) {
	return s.load.get("load", func() (*loadRun, error) { return s.runLoad(ctx) })
}

func (s *suite) runLoad(ctx context.Context) (*loadRun, error) {
	rec, err := s.subscribeSynced(ctx)
	if err != nil {
		return nil, err
	}
	defer rec.stop()
	lines0, err := s.logLines()
	if err != nil {
		return nil, err
	}
	run := &loadRun{}
	if run.podID, run.ids, err = s.loadPod(ctx, "load"); err != nil {
		return nil, err
	}
	want := 4*len(run.ids) + 4
	rec.waitFor(ctx, s.opts.EventWait, func(evs []received) bool {
		n := 0
		for _, e := range evs {
			if s.keep(e.ev) {
				n++
			}
		}
		return n >= want
	})
	s.quiet(ctx)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if run.lines, err = s.linesSince(lines0); err != nil {
		return nil, err
	}
	run.evs = rec.events(s.keep)
	return run, nil
}

// loadPod runs a pod of the run named name with Options.Load sleeping containers, then stops and
// removes it, and returns the ids of the pod and its containers.
func (s *suite) loadPod(ctx context.Context, name string) (string, []string, error) {
	podID, podCfg, err := s.drv.runPod(ctx, name)
	if err != nil {
		return "", nil, err
	}
	var ids []string
	for i := 0; i < s.opts.Load; i++ {
		id, err := s.drv.create(ctx, podID, podCfg, s.drv.containerConfig(fmt.Sprintf("%s-%d", name, i), "sleep", "3600"))
		if err != nil {
			return "", nil, err
		}
		cctx, cancel := callCtx(ctx)
		_, err = s.rt.StartContainer(cctx, &runtimeapi.StartContainerRequest{ContainerId: id})
		cancel()
		if err != nil {
			return "", nil, fmt.Errorf("failed to start container %s-%d: %w", name, i, err)
		}
		ids = append(ids, id)
	}
	return podID, ids, removePod(ctx, s.rt, podID)
}

// logLines is how many lines the runtime has logged (Options.LogLines); -1 without it.
func (s *suite) logLines() (int, error) {
	if s.opts.LogLines == nil {
		return -1, nil
	}
	n, err := s.opts.LogLines()
	if err != nil {
		return 0, fmt.Errorf("failed to count the runtime's log lines: %w", err)
	}
	return n, nil
}

// linesSince is how many lines the runtime logged since it had logged from; -1 without
// Options.LogLines.
func (s *suite) linesSince(from int) (int, error) {
	n, err := s.logLines()
	if err != nil || n < 0 {
		return n, err
	}
	return n - from, nil
}

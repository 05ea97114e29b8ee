package conformance

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// checkRestart runs a pod of two sleeping containers under an open stream, stops the runtime
// (Options.RestartRuntime), kills the first container's process while the runtime is down, starts
// the runtime again, then stops the second container and removes both. What changed while the runtime
// was down must show:
//
//   - in a relist: ListContainers through the endpoint says the killed container EXITED (within
//     EventWait of the restart);
//   - in the stream, for a stream that stays open across the restart: the killed container's STOPPED
//     (its status EXITED), and then the STOPPED and DELETED of both. A stream that stays open and does
//     not carry them is a hang, which a kubelet cannot tell from a quiet node;
//   - a stream that ends at the restart must end with a status, and a new one must stay open.
//
// Whether a stream opened right after the restart carries the killed container's STOPPED is
// reported, not judged (the relist is what a kubelet does after its stream ends).
func checkRestart(ctx context.Context, s *suite) (string, error) {
	if s.opts.RestartRuntime == nil {
		return "", skipf("the suite was not told how to restart the runtime")
	}
	rec, err := s.subscribeSynced(ctx)
	if err != nil {
		return "", err
	}
	defer rec.stop()
	podID, podCfg, err := s.drv.runPod(ctx, "restart")
	if err != nil {
		return "", err
	}
	downID, err := s.startSleeper(ctx, podID, podCfg, "killed-while-down")
	if err != nil {
		return "", err
	}
	afterID, err := s.startSleeper(ctx, podID, podCfg, "stopped-after")
	if err != nil {
		return "", err
	}
	cctx, cancel := callCtx(ctx)
	st, err := s.rt.ContainerStatus(cctx, &runtimeapi.ContainerStatusRequest{ContainerId: downID, Verbose: true})
	cancel()
	if err != nil {
		return "", fmt.Errorf("failed to get the verbose status of container killed-while-down: %w", err)
	}
	pid := verbosePid(st.Info)
	if pid == 0 {
		return "", skipf("the runtime's verbose ContainerStatus gives no pid of the container's process")
	}
	var killErr error
	var killed time.Time
	if err := s.opts.RestartRuntime(ctx, func(context.Context) error {
		killErr, killed = s.opts.Kill(pid, downID), s.opts.Now()
		return nil
	}); err != nil {
		return "", fmt.Errorf("failed to restart the runtime: %w", err)
	}
	if killErr != nil {
		return "", skipf("cannot kill the container's process %d from here while the runtime is down: %v", pid, killErr)
	}
	// A stream opened now, for the figure: does it carry the exit that happened while the runtime was
	// down?
	fresh, err := subscribe(ctx, s.rt, s.opts.Now, nil)
	if err != nil {
		return "", fmt.Errorf("after the restart: %w", err)
	}
	defer fresh.stop()

	// The relist. The endpoint may take a moment to reach the restarted runtime: retry until EventWait.
	var relisted time.Duration
	if err := s.retry(ctx, "ListContainers", func(ctx context.Context) error {
		resp, err := s.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: downID}})
		switch {
		case err != nil:
			return err
		case len(resp.Containers) != 1:
			return fmt.Errorf("it lists %d containers of the id of the container killed while the runtime was down", len(resp.Containers))
		case resp.Containers[0].State != runtimeapi.ContainerState_CONTAINER_EXITED:
			return fmt.Errorf("it says the container killed while the runtime was down is %s", resp.Containers[0].State)
		}
		relisted = s.opts.Now().Sub(killed)
		return nil
	}); err != nil {
		return "", err
	}
	if err := s.retry(ctx, "StopContainer", func(ctx context.Context) error {
		_, err := s.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: afterID})
		return err
	}); err != nil {
		return "", err
	}
	for _, id := range []string{downID, afterID} {
		if err := s.retry(ctx, "RemoveContainer", func(ctx context.Context) error {
			_, err := s.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
			return err
		}); err != nil {
			return "", err
		}
	}
	all := func(evs []received) bool {
		for _, id := range []string{downID, afterID} {
			if !hasEvent(id, stopped)(evs) || !hasEvent(id, deleted)(evs) {
				return false
			}
		}
		return true
	}
	rec.waitFor(ctx, s.opts.EventWait, all)
	freshSaw := "did not carry"
	if hasEvent(downID, stopped)(fresh.events(s.keep)) {
		freshSaw = "carried"
	}
	relist := fmt.Sprintf("ListContainers said EXITED %s after the kill", relisted.Round(time.Millisecond))
	if end := rec.ended(); end != nil {
		if err := probe(ctx, s.rt, s.opts.ProbeWait); err != nil {
			return "", fmt.Errorf("the stream ended with %v at the restart, and a new one ends too: %w", end, err)
		}
		return fmt.Sprintf("the stream ended with %s; a new one stays open; %s; a stream opened after the restart %s its STOPPED",
			status.Code(end), relist, freshSaw), nil
	}
	evs := rec.events(s.keep)
	if !hasEvent(downID, stopped)(evs) {
		return "", fmt.Errorf("the stream stayed open across the restart but did not carry the STOPPED of the container killed while the runtime was down: %s", countsFigure(counts(evs, downID)))
	}
	if !all(evs) {
		return "", fmt.Errorf("the stream stayed open across the restart but did not carry the STOPPED and DELETED of the containers removed after it: killed-while-down %s; stopped-after %s",
			countsFigure(counts(evs, downID)), countsFigure(counts(evs, afterID)))
	}
	var got time.Duration
	for _, e := range evs {
		if e.ev.ContainerId != downID || e.ev.ContainerEventType != stopped {
			continue
		}
		got = e.at.Sub(killed)
		for _, c := range e.ev.ContainersStatuses {
			if c.GetId() == downID && c.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
				return "", fmt.Errorf("the STOPPED of the container killed while the runtime was down says it is %s", c.GetState())
			}
		}
		break
	}
	return fmt.Sprintf("the stream stayed open; it carried the STOPPED of the container killed while the runtime was down %s after the kill, and the events after; %s",
		got.Round(time.Millisecond), relist), nil
}

// retry calls call until it succeeds or EventWait passes.
func (s *suite) retry(ctx context.Context, what string, call func(context.Context) error) error {
	deadline := s.opts.Now().Add(s.opts.EventWait)
	for {
		cctx, cancel := callCtx(ctx)
		err := call(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if s.opts.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s after the restart: %w", what, err)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// sleeperPod runs a pod of the run with one container running sleep, and returns their ids.
func (s *suite) sleeperPod(ctx context.Context, name string) (podID, id string, err error) {
	podID, podCfg, err := s.drv.runPod(ctx, name)
	if err != nil {
		return "", "", err
	}
	id, err = s.startSleeper(ctx, podID, podCfg, "sleeper")
	return podID, id, err
}

// startSleeper creates and starts a container named name running sleep in a pod of the run.
func (s *suite) startSleeper(ctx context.Context, podID string, podCfg *runtimeapi.PodSandboxConfig, name string) (string, error) {
	id, err := s.drv.create(ctx, podID, podCfg, s.drv.containerConfig(name, "sleep", "3600"))
	if err != nil {
		return "", err
	}
	cctx, cancel := callCtx(ctx)
	defer cancel()
	if _, err := s.rt.StartContainer(cctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		return "", fmt.Errorf("failed to start container %s of pod %s: %w", name, short(podID), err)
	}
	return id, nil
}

package conformance

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// checkRestart restarts the runtime (Options.RestartRuntime) under an open stream with a running
// container, then stops and removes the container: the stream must have ended with a status (and a
// new one open), or stayed open and carry the container's STOPPED and DELETED; a stream that stays
// open and carries nothing is a hang, which a kubelet cannot tell from a quiet node.
func checkRestart(ctx context.Context, s *suite) (string, error) {
	if s.opts.RestartRuntime == nil {
		return "", skipf("the suite was not told how to restart the runtime")
	}
	rec, err := s.subscribeSynced(ctx)
	if err != nil {
		return "", err
	}
	defer rec.stop()
	_, id, err := s.sleeperPod(ctx, "restart")
	if err != nil {
		return "", err
	}
	if err := s.opts.RestartRuntime(ctx); err != nil {
		return "", fmt.Errorf("failed to restart the runtime: %w", err)
	}
	// The endpoint may take a moment to reach the restarted runtime: retry until EventWait.
	if err := s.retry(ctx, "StopContainer", func(ctx context.Context) error {
		_, err := s.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id})
		return err
	}); err != nil {
		return "", err
	}
	if err := s.retry(ctx, "RemoveContainer", func(ctx context.Context) error {
		_, err := s.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
		return err
	}); err != nil {
		return "", err
	}
	rec.waitFor(ctx, s.opts.EventWait, func(evs []received) bool {
		return hasEvent(id, stopped)(evs) && hasEvent(id, deleted)(evs)
	})
	if end := rec.ended(); end != nil {
		if err := probe(ctx, s.rt, s.opts.ProbeWait); err != nil {
			return "", fmt.Errorf("the stream ended with %v at the restart, and a new one ends too: %w", end, err)
		}
		return fmt.Sprintf("the stream ended with %s; a new one stays open", status.Code(end)), nil
	}
	evs := rec.events(s.keep)
	if !hasEvent(id, stopped)(evs) || !hasEvent(id, deleted)(evs) {
		return "", fmt.Errorf("the stream stayed open across the restart but did not carry the STOPPED and DELETED of a container stopped after it: %s", countsFigure(counts(evs, id)))
	}
	return "the stream stayed open and carried on", nil
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
	if id, err = s.drv.create(ctx, podID, podCfg, s.drv.containerConfig("sleeper", "sleep", "3600")); err != nil {
		return "", "", err
	}
	cctx, cancel := callCtx(ctx)
	defer cancel()
	if _, err := s.rt.StartContainer(cctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		return "", "", fmt.Errorf("failed to start container sleeper of pod %s: %w", name, err)
	}
	return podID, id, nil
}

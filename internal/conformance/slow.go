package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/dial"
)

// A slow consumer's harm is judged against the same calls and the same subscriber with no slow
// consumer: the suite runs on shared machines, so the bound is loose, made to catch a stall (a
// producer blocked on the slow stream), not a few ms.
const (
	slowFactor = 2
	slowSlack  = 100 * time.Millisecond
	// slowPadding is the size of an annotation of the phase's pods: every event carries it, so that a
	// stream that is not read fills its HTTP/2 window after a few events.
	slowPadding = 4 << 10
	// slowWindow is the slow subscriber's HTTP/2 window (no growth with BDP estimation).
	slowWindow = 64 << 10
)

// phase is what one run of pods measured: each pod's RunPodSandbox + CreateContainer + StartContainer
// time, and the reading subscriber's created_at → receipt latencies.
type phase struct {
	calls, lat []time.Duration
	// ids are the phase's pods and containers.
	ids []string
	// missing is the first object the reading subscriber did not get all four events of.
	missing string
}

func checkSlowConsumer(ctx context.Context, s *suite) (string, error) {
	base, err := s.slowPhase(ctx, "base")
	if err != nil {
		return "", err
	}
	conn, err := dial.CRI(s.opts.Endpoint, grpc.WithInitialWindowSize(slowWindow), grpc.WithInitialConnWindowSize(slowWindow))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	slow, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(sctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		return "", fmt.Errorf("failed to subscribe the slow consumer: %w", err)
	}
	loaded, err := s.slowPhase(ctx, "slow")
	if err != nil {
		return "", fmt.Errorf("with a subscriber that does not read: %w", err)
	}
	bc, lc, bl, ll := p50(base.calls), p50(loaded.calls), p50(base.lat), p50(loaded.lat)
	figure := fmt.Sprintf("pod start p50 %s (alone %s), other subscriber p50 %s (alone %s)",
		lc.Round(time.Millisecond), bc.Round(time.Millisecond), ll.Round(time.Microsecond), bl.Round(time.Microsecond))
	switch {
	case loaded.missing != "":
		return figure, fmt.Errorf("with a slow consumer, the reading subscriber missed events of %s", loaded.missing)
	case base.missing != "":
		return figure, fmt.Errorf("with no slow consumer, the reading subscriber missed events of %s", base.missing)
	case lc > slowFactor*bc+slowSlack:
		return figure, fmt.Errorf("with a slow consumer, pods start in %s (p50), against %s with none", lc, bc)
	case ll > slowFactor*bl+slowSlack:
		return figure, fmt.Errorf("with a slow consumer, the other subscriber gets events %s after created_at (p50), against %s with none", ll, bl)
	}
	// The slow consumer reads now: it must either have been ended with an error, or get the last event
	// of every object (coalescing may have left out the ones before).
	got, last, end := drain(ctx, slow, loaded.ids, s.opts.EventWait)
	switch {
	case end != nil && !errors.Is(end, io.EOF) && status.Code(end) != codes.Canceled:
		return figure + fmt.Sprintf("; slow consumer ended: %s", status.Code(end)), nil
	case last == "":
		return figure + fmt.Sprintf("; slow consumer got %d events, each object's DELETED", got), nil
	case end != nil:
		return figure, fmt.Errorf("the slow consumer's stream ended with %v, not an error status, and never got %s", end, last)
	}
	return figure, fmt.Errorf("the slow consumer was neither ended nor sent %s (it got %d events): events lost silently", last, got)
}

func p50(d []time.Duration) time.Duration {
	d = append([]time.Duration(nil), d...)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return percentile(d, 0.5)
}

// slowPhase starts SlowPods pods of one sleeping container each, measuring each start, with a
// subscriber that reads; then removes them, and waits until the subscriber has every event.
func (s *suite) slowPhase(ctx context.Context, name string) (*phase, error) {
	rec, err := s.subscribeSynced(ctx)
	if err != nil {
		return nil, err
	}
	defer rec.stop()
	ph := &phase{}
	var pods []string
	for i := 0; i < s.opts.SlowPods; i++ {
		t0 := s.opts.Now()
		cfg := s.drv.podConfig(fmt.Sprintf("%s-%d", name, i))
		if cfg.Annotations == nil {
			cfg.Annotations = map[string]string{}
		}
		cfg.Annotations["pleg-nri.io/conformance-padding"] = strings.Repeat("x", slowPadding)
		cctx, cancel := callCtx(ctx)
		resp, err := s.rt.RunPodSandbox(cctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("failed to run pod %s-%d: %w", name, i, err)
		}
		podID := resp.PodSandboxId
		s.drv.remember(podID, func(ctx context.Context) error { return removePod(ctx, s.rt, podID) })
		id, err := s.drv.create(ctx, podID, cfg, s.drv.containerConfig("sleeper", "sleep", "3600"))
		if err != nil {
			return nil, err
		}
		cctx, cancel = callCtx(ctx)
		_, err = s.rt.StartContainer(cctx, &runtimeapi.StartContainerRequest{ContainerId: id})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("failed to start a container of pod %s-%d: %w", name, i, err)
		}
		ph.calls = append(ph.calls, s.opts.Now().Sub(t0))
		pods = append(pods, podID)
		ph.ids = append(ph.ids, podID, id)
	}
	for _, id := range pods {
		if err := removePod(ctx, s.rt, id); err != nil {
			return nil, err
		}
	}
	complete := func(evs []received) string {
		for _, id := range ph.ids {
			for _, t := range allTypes {
				if !hasEvent(id, t)(evs) {
					return short(id) + " (" + eventName(t) + ")"
				}
			}
		}
		return ""
	}
	rec.waitFor(ctx, s.opts.EventWait, func(evs []received) bool { return complete(evs) == "" })
	evs := rec.events(s.keep)
	ph.missing = complete(evs)
	ph.lat = latencies(evs, ph.ids)
	return ph, ctx.Err()
}

// drain reads a stream until it ends, it has the DELETED of every id, or wait passes. It returns how
// many events it read, the first id whose DELETED it lacks, and how the stream ended (nil: open).
func drain(ctx context.Context, stream runtimeapi.RuntimeService_GetContainerEventsClient, ids []string, wait time.Duration) (int, string, error) {
	var mu sync.Mutex
	deletedIDs := map[string]bool{}
	n := 0
	var end error
	lacking := func() string {
		for _, id := range ids {
			if !deletedIDs[id] {
				return short(id) + "'s DELETED"
			}
		}
		return ""
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ev, err := stream.Recv()
			mu.Lock()
			if err != nil {
				end = err
				mu.Unlock()
				return
			}
			n++
			if ev.ContainerEventType == deleted {
				deletedIDs[ev.ContainerId] = true
			}
			all := lacking() == ""
			mu.Unlock()
			if all {
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(wait):
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	return n, lacking(), end
}

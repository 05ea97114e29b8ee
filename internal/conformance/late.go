package conformance

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// checkLateSubscriber runs the load scenario's pod again (Options.Load containers, started, then the
// pod stopped and removed) while none of the suite's streams is open, waits Options.LateWait, and
// then subscribes. The late stream must:
//
//   - stay open and carry the events of what happens after the subscription (a pod run then: its
//     STARTED), whatever it replays first;
//   - replay, if it replays, only well-formed events: each with a pod_sandbox_status and its uid,
//     created_at in nanoseconds and never decreasing on the stream, each object's events in the order
//     CREATED < STARTED < STOPPED < DELETED and none twice;
//   - replay what Options.ExpectReplay says the endpoint documents (all of the pod's events, or none);
//   - with Options.LogLines, show no log line per event sent to nobody: from the pod's start to the
//     late subscription, the runtime must log fewer lines beyond what it logged for the same pods
//     with a subscriber (the load scenario) than half the pod's 4N+4 events.
//
// The figure says what the endpoint replayed (and so held for nobody: its events and their bytes),
// which is all the suite can see of its memory: memory itself is not visible through the CRI.
func checkLateSubscriber(ctx context.Context, s *suite) (string, error) {
	heard, err := s.loadScenario(ctx)
	if err != nil {
		return "", err
	}
	// Nobody of the suite listens now: every scenario's stream was closed when it returned. Give the
	// endpoint Quiet to see them gone. (An endpoint that sees a stream gone only when it next sends to
	// it, as containerd, still hands the first events to it: the figure shows how many are missing.)
	s.quiet(ctx)
	lines0, err := s.logLines()
	if err != nil {
		return "", err
	}
	podID, ids, err := s.loadPod(ctx, "late")
	if err != nil {
		return "", err
	}
	s.quiet(ctx)
	select {
	case <-time.After(s.opts.LateWait):
	case <-ctx.Done():
		return "", ctx.Err()
	}
	unheardLines, err := s.linesSince(lines0)
	if err != nil {
		return "", err
	}

	rec, err := subscribe(ctx, s.rt, s.opts.Now, nil)
	if err != nil {
		return "", err
	}
	defer rec.stop()
	syncIDs, live, err := s.liveAfter(ctx, rec)
	if err != nil {
		return "", err
	}

	unheard := append(slices.Clone(ids), podID)
	evs := rec.events(func(ev *runtimeapi.ContainerEventResponse) bool {
		return s.keep(ev) || syncIDs[ev.ContainerId]
	})
	replayed, bytes := 0, 0
	complete := 0
	for _, id := range unheard {
		n := counts(evs, id)
		if n[created] > 0 && n[started] > 0 && n[stopped] > 0 && n[deleted] > 0 {
			complete++
		}
		for _, e := range evs {
			if e.ev.ContainerId == id {
				replayed++
				bytes += proto.Size(e.ev)
			}
		}
	}
	total := 4 * len(unheard)
	figure := fmt.Sprintf("replayed %d of the %d events sent while nobody listened (%d of %d objects whole, %d KiB)",
		replayed, total, complete, len(unheard), (bytes+1023)/1024)
	if heard.lines >= 0 {
		figure += fmt.Sprintf("; the runtime logged %d lines for them, %d for the same pods heard", unheardLines, heard.lines)
	}

	if end := rec.ended(); end != nil {
		return figure, fmt.Errorf("a stream opened after events were sent to nobody ended with %v", end)
	}
	if !live {
		return figure, fmt.Errorf("a stream opened after events were sent to nobody did not carry the STARTED of a pod run after it subscribed (within %s)", s.opts.EventWait)
	}
	if err := wellFormed(evs); err != nil {
		return figure, fmt.Errorf("a late subscriber's stream: %w", err)
	}
	switch {
	case s.opts.ExpectReplay == ReplayAll && replayed != total:
		return figure, fmt.Errorf("a late subscriber got %d of the %d events sent while nobody listened, and the endpoint is said to replay them all", replayed, total)
	case s.opts.ExpectReplay == ReplayNone && replayed != 0:
		return figure, fmt.Errorf("a late subscriber got %d of the %d events sent while nobody listened, and the endpoint is said to replay none", replayed, total)
	}
	if heard.lines >= 0 && 2*(unheardLines-heard.lines) >= total {
		return figure, fmt.Errorf("while nobody listened the runtime logged %d lines for the %d events of a pod, %d more than for the same pods with a subscriber: a log line per event sent to nobody",
			unheardLines, total, unheardLines-heard.lines)
	}
	return figure, nil
}

// liveAfter runs sync pods, one after the other, until rec gets the STARTED of one run after rec had
// received an event, or EventWait passes: a stream's call returns before the endpoint has registered
// the subscriber, and an endpoint that holds events for nobody would replay the events of a pod run
// meanwhile; an event sent after the stream delivered one is sent to a registered subscriber. It
// returns the sync pods' ids and whether such a STARTED came.
func (s *suite) liveAfter(ctx context.Context, rec *recorder) (map[string]bool, bool, error) {
	ids := map[string]bool{}
	deadline := s.opts.Now().Add(s.opts.EventWait)
	for {
		registered := len(rec.events(everything)) > 0
		id, err := s.drv.runSyncPod(ctx)
		if err != nil {
			return ids, false, err
		}
		ids[id] = true
		wait := min(liveTry, max(0, deadline.Sub(s.opts.Now())))
		got := rec.waitFor(ctx, wait, hasEvent(id, started))
		cctx, cancel := callCtx(ctx)
		err = removePod(cctx, s.rt, id)
		cancel()
		live := got && registered
		switch {
		case err != nil:
			return ids, live, err
		case ctx.Err() != nil:
			return ids, live, ctx.Err()
		case live || rec.ended() != nil || !s.opts.Now().Before(deadline):
			return ids, live, nil
		}
	}
}

// liveTry is how long liveAfter waits for one sync pod's STARTED before it runs another.
const liveTry = 500 * time.Millisecond

// wellFormed checks the events of one stream, in the order received: each with a pod_sandbox_status
// and its uid, created_at in nanoseconds and never decreasing, each object's events in the order of
// its life and none twice.
func wellFormed(evs []received) error {
	seen := map[string]map[runtimeapi.ContainerEventType]bool{}
	last := map[string]runtimeapi.ContainerEventType{}
	for i, e := range evs {
		id, typ := e.ev.ContainerId, e.ev.ContainerEventType
		what := fmt.Sprintf("the %s of %s", eventName(typ), short(id))
		switch {
		case e.ev.PodSandboxStatus == nil:
			return fmt.Errorf("%s has no pod_sandbox_status", what)
		case e.ev.PodSandboxStatus.GetMetadata().GetUid() == "":
			return fmt.Errorf("%s has a pod_sandbox_status without metadata.uid", what)
		case e.ev.CreatedAt < 1e18:
			return fmt.Errorf("%s has created_at %d: not nanoseconds since the epoch", what, e.ev.CreatedAt)
		case seen[id][typ]:
			return fmt.Errorf("%s came twice", what)
		case i > 0 && e.ev.CreatedAt < evs[i-1].ev.CreatedAt:
			return fmt.Errorf("%s has created_at %d, after the %s of %s with %d", what, e.ev.CreatedAt,
				eventName(evs[i-1].ev.ContainerEventType), short(evs[i-1].ev.ContainerId), evs[i-1].ev.CreatedAt)
		}
		if prev, ok := last[id]; ok && rank(typ) < rank(prev) {
			return fmt.Errorf("%s came after its %s", what, eventName(prev))
		}
		if seen[id] == nil {
			seen[id] = map[runtimeapi.ContainerEventType]bool{}
		}
		seen[id][typ], last[id] = true, typ
	}
	return nil
}

package conformance

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// spec is one check: id is its short name (what --checks selects), name the sentence its failure
// contradicts; check returns the figure and nil, a skipError, or the first violation.
type spec struct {
	id, name string
	check    func(context.Context, *suite) (string, error)
}

const idUnsupported = "unsupported"

// specs are every check, in the order they run.
var specs = []spec{
	{idUnsupported, "a stream the endpoint does not serve ends with Unimplemented or FailedPrecondition, never an immediate EOF", checkUnsupported},
	{"once/exit-0", "a container that exits 0 gets CREATED, STARTED, STOPPED and DELETED exactly once each", onceContainer(caseExit0)},
	{"once/exit-nonzero", "a container that exits non-zero gets CREATED, STARTED, STOPPED and DELETED exactly once each", onceContainer(caseExitNon0)},
	{"once/stop-container", "a container stopped by StopContainer gets CREATED, STARTED, STOPPED and DELETED exactly once each", onceContainer(caseStop)},
	{"once/oom-kill", "an OOM-killed container gets CREATED, STARTED, STOPPED and DELETED exactly once each", onceContainer(caseOOM)},
	{"once/stop-pod", "a container stopped by StopPodSandbox gets CREATED, STARTED, STOPPED and DELETED exactly once each", onceContainer(casePodStop)},
	{"once/start-fails", "a container whose start fails gets CREATED and DELETED exactly once each and no event twice", onceContainer(caseStartFail)},
	{"once/sandbox", "a sandbox gets CREATED, STARTED, STOPPED and DELETED exactly once each", onceSandbox},
	{"once/pause-killed", "a sandbox whose pause process is killed gets its STOPPED exactly once", checkPauseKilled},
	{"order/container", "each container's events come in the order CREATED < STARTED < STOPPED < DELETED", orderContainer},
	{"order/pod", "a sandbox's STARTED comes before its containers' CREATED, and its STOPPED after their STOPPED", orderPod},
	{"order/created-at", "created_at is in nanoseconds, within seconds of the wall clock, and never decreases on a stream", orderCreatedAt},
	{"content/pod-status", "every event carries a pod_sandbox_status with metadata.uid", contentPodStatus},
	{"content/sandbox-id", "a sandbox's event has the sandbox id as container_id", contentSandboxID},
	{"content/all-containers", "containers_statuses lists every container of the pod, exited ones included", contentAllContainers},
	{"content/stopped-status", "a STOPPED says its container EXITED, with finished_at, the exit code and reason Completed, Error or OOMKilled", contentStoppedStatus},
	{"content/status-timestamp", "PodSandboxStatus's timestamp is 0, or set with containers_statuses", contentStatusTimestamp},
	{"read-after-event", "once a STOPPED is received, ContainerStatus, ListContainers and PodSandboxStatus through the same endpoint show the exit", readAfterEvent},
	{"load", "every one of the 4N+4 events of N containers in one pod arrives, exactly once", checkLoad},
	{"slow-consumer", "a subscriber that stops reading slows no other subscriber and no CRI call, and is never left to lose events silently", checkSlowConsumer},
	{"late-subscriber", "a stream opened after events were sent to nobody serves, replays only well-formed events and what the endpoint documents, and the runtime logs no line per event sent to nobody", checkLateSubscriber},
	{"runtime-restart", "across a restart of the runtime the stream ends with a status or carries on, and what changed shows", checkRestart},
}

// Check names one check.
type Check struct {
	// ID is what Options.Checks selects; Name the sentence its failure contradicts.
	ID, Name string
}

// Checks are every check, in the order they run.
func Checks() []Check {
	out := make([]Check, len(specs))
	for i, sp := range specs {
		out[i] = Check{sp.id, sp.name}
	}
	return out
}

// CheckIDs are the ids of every check, in the order they run.
func CheckIDs() []string {
	ids := make([]string, len(specs))
	for i, sp := range specs {
		ids[i] = sp.id
	}
	return ids
}

// matches reports whether the selector sel (an id, or an id's prefix up to a '/') selects id.
func matches(sel, id string) bool {
	return sel == id || strings.HasPrefix(id, strings.TrimSuffix(sel, "/")+"/")
}

func knownCheck(sel string) bool {
	return slices.ContainsFunc(specs, func(sp spec) bool { return matches(sel, sp.id) })
}

// selected are the specs sels select (every spec when sels is empty), in their order.
func selected(sels []string) []spec {
	if len(sels) == 0 {
		return specs
	}
	var out []spec
	for _, sp := range specs {
		if slices.ContainsFunc(sels, func(sel string) bool { return matches(sel, sp.id) }) {
			out = append(out, sp)
		}
	}
	return out
}

func checkUnsupported(_ context.Context, s *suite) (string, error) {
	switch s.support {
	case Supported:
		return fmt.Sprintf("served: the stream stayed open %s", s.opts.ProbeWait), nil
	case SaysUnsupported:
		return fmt.Sprintf("not served: %v", s.unsupported), nil
	}
	return "", fmt.Errorf("the stream ended at once with %v: a kubelet burns one of its 5 retries on it and never learns why", s.unsupported)
}

// eventName is how a failure names an event.
func eventName(t runtimeapi.ContainerEventType) string {
	return strings.TrimSuffix(strings.TrimPrefix(t.String(), "CONTAINER_"), "_EVENT")
}

// counts are the events of each type about id.
func counts(evs []received, id string) map[runtimeapi.ContainerEventType]int {
	n := map[runtimeapi.ContainerEventType]int{}
	for _, e := range evs {
		if e.ev.ContainerId == id {
			n[e.ev.ContainerEventType]++
		}
	}
	return n
}

func countsFigure(n map[runtimeapi.ContainerEventType]int) string {
	var parts []string
	for _, t := range allTypes {
		parts = append(parts, fmt.Sprintf("%s %d", eventName(t), n[t]))
	}
	return strings.Join(parts, ", ")
}

// exactlyOnce checks that each of want was received once, and no type more than once.
func exactlyOnce(what string, n map[runtimeapi.ContainerEventType]int, want ...runtimeapi.ContainerEventType) error {
	for _, t := range allTypes {
		if slices.Contains(want, t) && n[t] != 1 || n[t] > 1 {
			times := "once"
			if !slices.Contains(want, t) {
				times = "at most once"
			}
			return fmt.Errorf("%s's %s was received %d times, want %s", what, eventName(t), n[t], times)
		}
	}
	return nil
}

func onceContainer(name string) func(context.Context, *suite) (string, error) {
	return func(ctx context.Context, s *suite) (string, error) {
		lc, err := s.lifecycleScenario(ctx)
		if err != nil {
			return "", err
		}
		c := lc.byName(name)
		if name == caseOOM && c.final.GetReason() != "OOMKilled" {
			return "", skipf("the runtime did not OOM-kill the container (reason %q, exit code %d): the path was not taken", c.final.GetReason(), c.final.GetExitCode())
		}
		n := counts(lc.evs, c.id)
		want := allTypes
		if name == caseStartFail {
			want = []runtimeapi.ContainerEventType{created, deleted}
		}
		return countsFigure(n), exactlyOnce("container "+name, n, want...)
	}
}

func onceSandbox(ctx context.Context, s *suite) (string, error) {
	lc, err := s.lifecycleScenario(ctx)
	if err != nil {
		return "", err
	}
	n := counts(lc.evs, lc.podID)
	return countsFigure(n), exactlyOnce("the sandbox", n, allTypes...)
}

// rank is a transition's place in an object's life.
func rank(t runtimeapi.ContainerEventType) int { return slices.Index(allTypes, t) }

func orderContainer(ctx context.Context, s *suite) (string, error) {
	lc, err := s.lifecycleScenario(ctx)
	if err != nil {
		return "", err
	}
	ids := append(lc.containerIDs(), lc.podID)
	for _, id := range ids {
		last := created
		for _, e := range lc.evs {
			if e.ev.ContainerId != id {
				continue
			}
			if t := e.ev.ContainerEventType; rank(t) < rank(last) {
				return "", fmt.Errorf("%s's %s came after its %s", lc.nameOf(id), eventName(t), eventName(last))
			} else {
				last = t
			}
		}
	}
	return fmt.Sprintf("%d objects, %d events", len(ids), len(lc.evs)), nil
}

// nameOf names an object of the lifecycle scenario in a failure.
func (l *lifecycleRun) nameOf(id string) string {
	if id == l.podID {
		return "the sandbox " + short(id)
	}
	for _, c := range l.cases {
		if c.id == id {
			return "container " + c.name
		}
	}
	return short(id)
}

// index is the position of the first event of type typ about id, -1 if none.
func index(evs []received, id string, typ runtimeapi.ContainerEventType) int {
	return slices.IndexFunc(evs, func(e received) bool { return e.ev.ContainerId == id && e.ev.ContainerEventType == typ })
}

func orderPod(ctx context.Context, s *suite) (string, error) {
	lc, err := s.lifecycleScenario(ctx)
	if err != nil {
		return "", err
	}
	podStarted, podStopped := index(lc.evs, lc.podID, started), index(lc.evs, lc.podID, stopped)
	if podStarted < 0 || podStopped < 0 {
		return "", fmt.Errorf("the sandbox's STARTED or STOPPED was not received: nothing to order")
	}
	for _, id := range lc.containerIDs() {
		if i := index(lc.evs, id, created); i >= 0 && i < podStarted {
			return "", fmt.Errorf("%s's CREATED came before the sandbox's STARTED", lc.nameOf(id))
		}
		if i := index(lc.evs, id, stopped); i > podStopped {
			return "", fmt.Errorf("%s's STOPPED came after the sandbox's STOPPED", lc.nameOf(id))
		}
	}
	return fmt.Sprintf("%d containers", len(lc.containerIDs())), nil
}

// createdAtSlack is how far an event's created_at may be from the wall clock at its receipt.
const createdAtSlack = 30 * time.Second

func orderCreatedAt(ctx context.Context, s *suite) (string, error) {
	lc, err := s.lifecycleScenario(ctx)
	if err != nil {
		return "", err
	}
	var worst time.Duration
	for _, e := range lc.evs {
		if e.ev.CreatedAt < 1e18 {
			return "", fmt.Errorf("%s's %s has created_at %d: not nanoseconds since the epoch", lc.nameOf(e.ev.ContainerId), eventName(e.ev.ContainerEventType), e.ev.CreatedAt)
		}
		d := e.at.Sub(time.Unix(0, e.ev.CreatedAt))
		if d.Abs() > createdAtSlack {
			return "", fmt.Errorf("%s's %s has created_at %s, %s from its receipt", lc.nameOf(e.ev.ContainerId), eventName(e.ev.ContainerEventType), time.Unix(0, e.ev.CreatedAt).UTC().Format(time.RFC3339Nano), d)
		}
		worst = max(worst, d.Abs())
	}
	for i, all := range [][]received{lc.all, lc.readerAll} {
		for j := 1; j < len(all); j++ {
			if all[j].ev.CreatedAt < all[j-1].ev.CreatedAt {
				return "", fmt.Errorf("subscriber %d: %s of %s has created_at %d, after %s of %s with %d", i+1,
					eventName(all[j].ev.ContainerEventType), short(all[j].ev.ContainerId), all[j].ev.CreatedAt,
					eventName(all[j-1].ev.ContainerEventType), short(all[j-1].ev.ContainerId), all[j-1].ev.CreatedAt)
			}
		}
	}
	return fmt.Sprintf("%d events, receipt - created_at at most %s", len(lc.evs), worst.Round(time.Microsecond)), nil
}

func contentPodStatus(ctx context.Context, s *suite) (string, error) {
	lc, err := s.lifecycleScenario(ctx)
	if err != nil {
		return "", err
	}
	for _, e := range lc.evs {
		if e.ev.PodSandboxStatus == nil {
			return "", fmt.Errorf("%s's %s has no pod_sandbox_status", lc.nameOf(e.ev.ContainerId), eventName(e.ev.ContainerEventType))
		}
		if e.ev.PodSandboxStatus.GetMetadata().GetUid() == "" {
			return "", fmt.Errorf("%s's %s has a pod_sandbox_status without metadata.uid", lc.nameOf(e.ev.ContainerId), eventName(e.ev.ContainerEventType))
		}
	}
	return fmt.Sprintf("%d events", len(lc.evs)), nil
}

func contentSandboxID(ctx context.Context, s *suite) (string, error) {
	lc, err := s.lifecycleScenario(ctx)
	if err != nil {
		return "", err
	}
	n := 0
	for _, e := range lc.evs {
		if e.ev.ContainerId != lc.podID {
			continue
		}
		n++
		if got := e.ev.GetPodSandboxStatus().GetId(); got != lc.podID {
			return "", fmt.Errorf("the sandbox's %s has container_id %s but is about pod %q", eventName(e.ev.ContainerEventType), short(lc.podID), short(got))
		}
	}
	if n == 0 {
		return "", fmt.Errorf("no event has the sandbox id %s as container_id", short(lc.podID))
	}
	return fmt.Sprintf("%d sandbox events", n), nil
}

func contentAllContainers(ctx context.Context, s *suite) (string, error) {
	lc, err := s.lifecycleScenario(ctx)
	if err != nil {
		return "", err
	}
	mine := map[string]bool{}
	for _, id := range lc.containerIDs() {
		mine[id] = true
	}
	// live are the pod's containers whose CREATED was received and whose DELETED was not, yet.
	live := map[string]bool{}
	checked := 0
	for _, e := range lc.evs {
		id, typ := e.ev.ContainerId, e.ev.ContainerEventType
		if mine[id] && typ == created {
			live[id] = true
		}
		if mine[id] && typ == deleted {
			delete(live, id)
		}
		listed := map[string]bool{}
		for _, c := range e.ev.ContainersStatuses {
			listed[c.GetId()] = true
		}
		for _, want := range lc.containerIDs() {
			if live[want] && !listed[want] {
				return "", fmt.Errorf("%s's %s does not list %s in containers_statuses (it lists %d)", lc.nameOf(id), eventName(typ), lc.nameOf(want), len(listed))
			}
		}
		checked++
	}
	return fmt.Sprintf("%d events", checked), nil
}

// wantExit is what a STOPPED of each path must say, beyond agreeing with the runtime's own status.
var wantExit = map[string]struct {
	code   int32 // -1: any non-zero
	reason string
}{
	caseExit0:    {0, "Completed"},
	caseExitNon0: {3, "Error"},
	caseStop:     {-1, "Error"},
	caseOOM:      {-1, "OOMKilled"},
	casePodStop:  {-1, "Error"},
}

func contentStoppedStatus(ctx context.Context, s *suite) (string, error) {
	lc, err := s.lifecycleScenario(ctx)
	if err != nil {
		return "", err
	}
	var seen []string
	for _, c := range lc.cases {
		want, ok := wantExit[c.name]
		if !ok || c.name == caseOOM && c.final.GetReason() != "OOMKilled" {
			continue
		}
		for _, e := range lc.evs {
			if e.ev.ContainerId != c.id || e.ev.ContainerEventType != stopped {
				continue
			}
			var st *runtimeapi.ContainerStatus
			for _, cs := range e.ev.ContainersStatuses {
				if cs.GetId() == c.id {
					st = cs
				}
			}
			switch {
			case st == nil:
				return "", fmt.Errorf("container %s's STOPPED does not carry its status", c.name)
			case st.State != runtimeapi.ContainerState_CONTAINER_EXITED:
				return "", fmt.Errorf("container %s's STOPPED says it is %s", c.name, st.State)
			case st.FinishedAt == 0:
				return "", fmt.Errorf("container %s's STOPPED has no finished_at", c.name)
			case want.code >= 0 && st.ExitCode != want.code || want.code < 0 && st.ExitCode == 0:
				return "", fmt.Errorf("container %s's STOPPED says exit code %d", c.name, st.ExitCode)
			case st.Reason != want.reason:
				return "", fmt.Errorf("container %s's STOPPED says reason %q, want %q (exit code %d)", c.name, st.Reason, want.reason, st.ExitCode)
			case c.final != nil && st.ExitCode != c.final.ExitCode:
				return "", fmt.Errorf("container %s's STOPPED says exit code %d, the runtime's status %d", c.name, st.ExitCode, c.final.ExitCode)
			}
			seen = append(seen, fmt.Sprintf("%s %d/%s", c.name, st.ExitCode, st.Reason))
		}
	}
	if len(seen) == 0 {
		return "", fmt.Errorf("no STOPPED of the scenario's containers was received")
	}
	return strings.Join(seen, ", "), nil
}

func contentStatusTimestamp(ctx context.Context, s *suite) (string, error) {
	lc, err := s.lifecycleScenario(ctx)
	if err != nil {
		return "", err
	}
	lc.reads.mu.Lock()
	defer lc.reads.mu.Unlock()
	if len(lc.reads.timestamps) > 0 {
		return "", fmt.Errorf("%s", lc.reads.timestamps[0])
	}
	return fmt.Sprintf("%d reads", lc.reads.checked), nil
}

func readAfterEvent(ctx context.Context, s *suite) (string, error) {
	lc, err := s.lifecycleScenario(ctx)
	if err != nil {
		return "", err
	}
	lc.reads.mu.Lock()
	defer lc.reads.mu.Unlock()
	figure := fmt.Sprintf("%d STOPPED read after, %d stale reads", lc.reads.checked, len(lc.reads.violations))
	if lc.reads.checked == 0 {
		return figure, fmt.Errorf("no STOPPED of the scenario was received: nothing to read after")
	}
	if len(lc.reads.violations) > 0 {
		return figure, fmt.Errorf("%s", lc.reads.violations[0])
	}
	return figure, nil
}

// percentile is the p-th percentile (0..1) of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

// latencies are the created_at → receipt times of the events about ids (not those of other objects,
// which an endpoint may replay to a new subscriber long after their created_at).
func latencies(evs []received, ids []string) []time.Duration {
	var out []time.Duration
	for _, e := range evs {
		if slices.Contains(ids, e.ev.ContainerId) {
			out = append(out, e.at.Sub(time.Unix(0, e.ev.CreatedAt)))
		}
	}
	return out
}

func checkLoad(ctx context.Context, s *suite) (string, error) {
	lr, err := s.loadScenario(ctx)
	if err != nil {
		return "", err
	}
	lat := latencies(lr.evs, append(slices.Clone(lr.ids), lr.podID))
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	want := 4*len(lr.ids) + 4
	got := 0
	var first error
	for i, id := range append(slices.Clone(lr.ids), lr.podID) {
		n := counts(lr.evs, id)
		for _, t := range allTypes {
			got += min(n[t], 1)
		}
		what := fmt.Sprintf("container load-%d", i)
		if id == lr.podID {
			what = "the sandbox"
		}
		if err := exactlyOnce(what, n, allTypes...); err != nil && first == nil {
			first = err
		}
	}
	figure := fmt.Sprintf("%d of %d events, created_at to receipt p50 %s p99 %s",
		got, want, percentile(lat, 0.5).Round(time.Microsecond), percentile(lat, 0.99).Round(time.Microsecond))
	return figure, first
}

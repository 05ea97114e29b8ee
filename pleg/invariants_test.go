package pleg

import (
	"fmt"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// eventChecker checks, event by event, the contract every event stream of a PLEG keeps:
//   - every event carries a sandbox status with metadata, its pod's, and created_at strictly increasing
//     per pod (across restarts too);
//   - per object, causal order: nothing before its CREATED (unless the process started from a
//     checkpoint that had it), nothing after its DELETED, no container event before its sandbox's
//     CREATED; a sandbox's DELETED after its containers';
//   - exactly once per object and type, except a second STOPPED that corrects the first one to
//     OOMKilled; nothing the process's checkpoint says was received already;
//   - a STOPPED carries an exited status (a sandbox: NOTREADY);
//   - containers_statuses are the pod's containers CREATED and not DELETED, each once.
//
// A restart world checks one checker per pleg-nri process (restart).
type eventChecker struct {
	// sandboxOf, when set, is the runtime's sandbox of each container: its events must carry it.
	sandboxOf map[string]string
	// baseline is the phase, by id, of the checkpoint the process started from.
	baseline map[string]Phase
	// lastAt is, per pod (sandbox id), the created_at of its last event.
	lastAt map[string]int64
	// live is, per pod, the containers CREATED and not DELETED: its containers_statuses.
	live map[string]map[string]bool
	// objects is what the stream told of each object.
	objects map[string]*objectEvents
	// n counts the events checked.
	n int
}

// objectEvents is what a stream told of one object.
type objectEvents struct {
	// first is the index in the stream of its first event of each type.
	first map[runtimeapi.ContainerEventType]int
	// count is the number of its events of each type.
	count map[runtimeapi.ContainerEventType]int
	// stopped are the reasons its STOPPED events carried ("" for a sandbox).
	stopped []string
}

func newEventChecker(sandboxOf map[string]string) *eventChecker {
	c := &eventChecker{sandboxOf: sandboxOf, lastAt: map[string]int64{}}
	c.restart(nil, nil)
	return c
}

// restart starts the stream of a new pleg-nri process, from a checkpoint that has the phases baseline
// (by id) and the containers live (by pod): created_at keeps increasing, everything else starts over.
func (c *eventChecker) restart(baseline map[string]Phase, live map[string]map[string]bool) {
	c.baseline, c.objects, c.n = baseline, map[string]*objectEvents{}, 0
	c.live = map[string]map[string]bool{}
	for pod, ctrs := range live {
		c.live[pod] = map[string]bool{}
		for id := range ctrs {
			c.live[pod][id] = true
		}
	}
}

// object returns what the stream told of id (empty when nothing).
func (c *eventChecker) object(id string) *objectEvents {
	o := c.objects[id]
	if o == nil {
		o = &objectEvents{first: map[runtimeapi.ContainerEventType]int{}, count: map[runtimeapi.ContainerEventType]int{}}
		c.objects[id] = o
	}
	return o
}

// known says whether the stream, or the checkpoint the process started from, had id's CREATED.
func (c *eventChecker) known(id string) bool {
	return c.object(id).count[evCreated] > 0 || c.baseline[id] >= PhaseCreated
}

// check checks the next event of the stream; it returns the first rule the event breaks, "" if none.
func (c *eventChecker) check(ev Event) string {
	i := c.n
	c.n++
	r := ev.Response
	ps := r.GetPodSandboxStatus()
	if ps == nil || ps.Metadata == nil || ps.Metadata.Uid == "" {
		return "no sandbox status or metadata"
	}
	podID, id, typ := ps.Id, r.ContainerId, r.ContainerEventType
	if r.CreatedAt <= c.lastAt[podID] {
		return fmt.Sprintf("created_at %d not after %d", r.CreatedAt, c.lastAt[podID])
	}
	c.lastAt[podID] = r.CreatedAt
	isSandbox := id == podID
	if !isSandbox && c.sandboxOf != nil && c.sandboxOf[id] != podID {
		return fmt.Sprintf("container of sandbox %s carries sandbox %s", c.sandboxOf[id], podID)
	}
	if ph := c.baseline[id]; eventPhase(typ) <= ph {
		return fmt.Sprintf("emitted again: the checkpoint the process started from says %s was received", ph)
	}
	o := c.object(id)
	switch {
	case o.count[typ] > 0 && typ != evStopped:
		return "duplicate"
	case o.count[evDeleted] > 0:
		return "after DELETED"
	case typ != evCreated && !c.known(id):
		return "before CREATED"
	case !isSandbox && !c.known(podID):
		return "container event before its sandbox's CREATED"
	}
	if typ == evStopped {
		reason := ""
		if isSandbox {
			if ps.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
				return fmt.Sprintf("sandbox STOPPED with state %s", ps.State)
			}
		} else if st := statusOf(ev, id); st == nil || st.State != runtimeapi.ContainerState_CONTAINER_EXITED {
			return fmt.Sprintf("STOPPED with status %v", st)
		} else {
			reason = st.Reason
		}
		switch prev := o.stopped; {
		case len(prev) == 1 && (prev[0] == reasonOOMKilled || reason != reasonOOMKilled):
			return fmt.Sprintf("second STOPPED is not an OOM correction (%v then %s)", prev, reason)
		case len(prev) == 2:
			return "third STOPPED"
		}
		o.stopped = append(o.stopped, reason)
	}
	if o.count[typ] == 0 {
		o.first[typ] = i
	}
	o.count[typ]++
	live := c.live[podID]
	if live == nil {
		live = map[string]bool{}
		c.live[podID] = live
	}
	if !isSandbox {
		switch typ {
		case evCreated:
			live[id] = true
		case evDeleted:
			delete(live, id)
		}
	}
	if isSandbox && typ == evDeleted && len(live) > 0 {
		return fmt.Sprintf("sandbox DELETED with live containers %v", live)
	}
	got := map[string]bool{}
	for _, st := range r.ContainersStatuses {
		if got[st.Id] {
			return fmt.Sprintf("container %s listed twice", st.Id)
		}
		got[st.Id] = true
	}
	if len(got) != len(live) {
		return fmt.Sprintf("statuses of %v, live containers %v", got, live)
	}
	for ct := range live {
		if !got[ct] {
			return fmt.Sprintf("live container %s missing from the statuses %v", ct, got)
		}
	}
	return ""
}

// checkStream checks a whole stream with a new checker and fails t at the first broken rule; it returns
// the checker, for what the test checks of each object.
func checkStream(t testing.TB, sandboxOf map[string]string, evs []Event) *eventChecker {
	t.Helper()
	c := newEventChecker(sandboxOf)
	for i, ev := range evs {
		if msg := c.check(ev); msg != "" {
			t.Fatalf("event %d (%s): %s\nall: %v", i, summary(evs[i : i+1])[0], msg, summary(evs))
		}
	}
	return c
}

// TestEventChecker: the checker catches each rule broken (the property tests rely on it).
func TestEventChecker(t *testing.T) {
	// ev builds an event of id in pod s1 at created_at at, listing the containers live.
	ev := func(typ runtimeapi.ContainerEventType, id string, at int64, live ...string) Event {
		r := &runtimeapi.ContainerEventResponse{ContainerId: id, ContainerEventType: typ, CreatedAt: at,
			PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: "s1", Metadata: &runtimeapi.PodSandboxMetadata{Uid: "u1"},
				State: runtimeapi.PodSandboxState_SANDBOX_READY}}
		for _, c := range live {
			st := &runtimeapi.ContainerStatus{Id: c, State: runtimeapi.ContainerState_CONTAINER_RUNNING}
			if typ == evStopped && c == id {
				st.State, st.Reason = runtimeapi.ContainerState_CONTAINER_EXITED, reasonError
			}
			r.ContainersStatuses = append(r.ContainersStatuses, st)
		}
		return Event{Response: r}
	}
	good := []Event{ev(evCreated, "s1", 1), ev(evStarted, "s1", 2), ev(evCreated, "c1", 3, "c1"), ev(evStarted, "c1", 4, "c1"),
		ev(evStopped, "c1", 5, "c1"), ev(evDeleted, "c1", 6)}
	for _, tc := range []struct {
		name     string
		baseline map[string]Phase
		evs      []Event
		want     string
	}{
		{"good", nil, good, ""},
		{"created_at", nil, []Event{ev(evCreated, "s1", 2), ev(evStarted, "s1", 2)}, "created_at 2 not after 2"},
		{"duplicate", nil, []Event{ev(evCreated, "s1", 1), ev(evCreated, "s1", 2)}, "duplicate"},
		{"before CREATED", nil, []Event{ev(evStarted, "s1", 1)}, "before CREATED"},
		{"after DELETED", nil, []Event{ev(evCreated, "s1", 1), ev(evDeleted, "s1", 2), ev(evStarted, "s1", 3)}, "after DELETED"},
		{"container before its sandbox", nil, []Event{ev(evCreated, "c1", 1, "c1")}, "before its sandbox's CREATED"},
		{"statuses", nil, []Event{ev(evCreated, "s1", 1), ev(evCreated, "c1", 2)}, "statuses of map[], live containers map[c1:true]"},
		{"STOPPED not exited", nil, []Event{ev(evCreated, "s1", 1), ev(evCreated, "c1", 2, "c1"), ev(evStopped, "c1", 3, "c2")}, "STOPPED with status <nil>"},
		{"second STOPPED", nil, append(good[:5:5], ev(evStopped, "c1", 6, "c1")), "second STOPPED is not an OOM correction"},
		{"emitted again", map[string]Phase{"s1": PhaseRunning}, []Event{ev(evStarted, "s1", 1)}, "emitted again"},
		{"after a checkpoint", map[string]Phase{"s1": PhaseRunning}, []Event{ev(evCreated, "c1", 1, "c1")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newEventChecker(nil)
			c.restart(tc.baseline, nil)
			got := ""
			for _, e := range tc.evs {
				if got = c.check(e); got != "" {
					break
				}
			}
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

package fresh

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// stoppedTTL bounds how long an object stays "stopped ahead" when the runtime never shows the stop
// (runtime stuck, or the object went away without a DELETED through this endpoint). The overlay costs a
// read nothing, so the bound is long: containerd under IO pressure can take many seconds to handle an
// exit, and a kubelet that read RUNNING after the STOPPED would keep it.
const stoppedTTL = 2 * time.Minute

// stoppedTracker holds the objects this endpoint sent a STOPPED for, with the status the STOPPED
// carried, until the runtime's own answers show the stop, a DELETED for the object is sent, or
// its TTL has passed. It learns only from the events the endpoint sends (see observe), so it works
// wherever the endpoint runs, with or without the event core in the same process.
//
// It is safe for concurrent use.
type stoppedTracker struct {
	now func() time.Time
	// ttl is stoppedTTL (tests shorten it).
	ttl time.Duration
	// n is len(containers)+len(sandboxes), read without the lock: every status read asks it.
	n atomic.Int64
	// mu guards containers and sandboxes.
	mu sync.Mutex
	// containers are the containers reported stopped, by id.
	containers map[string]*stoppedContainer
	// sandboxes are the sandboxes reported stopped (NOTREADY), by id.
	sandboxes map[string]*stoppedSandbox
}

// stoppedContainer is a container the endpoint sent a STOPPED for.
type stoppedContainer struct {
	// idb is the container's id as bytes (see mentioned).
	idb []byte
	// status is the container's status in the last STOPPED event sent for it.
	status *runtimeapi.ContainerStatus
	// sandboxID is its sandbox: a sandbox's DELETED forgets its containers.
	sandboxID string
	// createdAt is the event's created_at (a second subscriber's copy of the same event is not news).
	createdAt int64
	// at is when the event was sent (for the TTL).
	at time.Time
}

// stoppedSandbox is a sandbox the endpoint sent a STOPPED (NOTREADY) for; its fields are
// stoppedContainer's.
type stoppedSandbox struct {
	idb       []byte
	createdAt int64
	at        time.Time
}

// newStoppedTracker returns a tracker whose entries last ttl on the clock now.
func newStoppedTracker(now func() time.Time, ttl time.Duration) *stoppedTracker {
	return &stoppedTracker{now: now, ttl: ttl, containers: map[string]*stoppedContainer{}, sandboxes: map[string]*stoppedSandbox{}}
}

// any reports whether some object is tracked; a single atomic load.
func (t *stoppedTracker) any() bool { return t.n.Load() > 0 }

// observe records an event (encoded) that is about to be sent to a subscriber. It must be called
// before the event is written, so that no read the event causes can come before it. STARTED and
// CREATED events cost a few field reads; a STOPPED is decoded.
func (t *stoppedTracker) observe(b []byte) {
	h, ok := scanEvent(b, false)
	id, typ, createdAt := h.id, h.typ, h.createdAt
	if !ok || id == "" {
		return
	}
	switch typ {
	case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
		t.observeStopped(b, id, createdAt)
	case runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
		if t.any() {
			t.forgetDeleted(id)
		}
	}
}

func (t *stoppedTracker) observeStopped(b []byte, id string, createdAt int64) {
	t.mu.Lock()
	if c := t.containers[id]; c != nil && c.createdAt == createdAt {
		t.mu.Unlock()
		return // another subscriber's copy
	}
	if s := t.sandboxes[id]; s != nil && s.createdAt == createdAt {
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	var ev runtimeapi.ContainerEventResponse
	if proto.Unmarshal(b, &ev) != nil {
		return
	}
	now := t.now()
	sandboxID := ev.GetPodSandboxStatus().GetId()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	if id == sandboxID {
		if ev.GetPodSandboxStatus().GetState() != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
			return
		}
		if _, ok := t.sandboxes[id]; !ok {
			t.n.Add(1)
		}
		t.sandboxes[id] = &stoppedSandbox{idb: []byte(id), createdAt: createdAt, at: now}
		return
	}
	for _, st := range ev.GetContainersStatuses() {
		if st.GetId() != id {
			continue
		}
		if st.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
			return
		}
		if _, ok := t.containers[id]; !ok {
			t.n.Add(1)
		}
		t.containers[id] = &stoppedContainer{idb: []byte(id), status: st, sandboxID: sandboxID, createdAt: createdAt, at: now}
		return
	}
}

// forgetDeleted forgets an object a DELETED was sent for; a sandbox takes its containers with it.
func (t *stoppedTracker) forgetDeleted(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forgetLocked(id)
	if _, ok := t.sandboxes[id]; ok {
		delete(t.sandboxes, id)
		t.n.Add(-1)
	}
	for cid, c := range t.containers {
		if c.sandboxID == id {
			t.forgetLocked(cid)
		}
	}
}

// forgetLocked forgets object id, container or sandbox.
func (t *stoppedTracker) forgetLocked(id string) {
	if _, ok := t.containers[id]; ok {
		delete(t.containers, id)
		t.n.Add(-1)
	}
	if _, ok := t.sandboxes[id]; ok {
		delete(t.sandboxes, id)
		t.n.Add(-1)
	}
}

// forget drops an object whose stop the runtime's answers now show.
func (t *stoppedTracker) forget(id string) {
	if !t.any() {
		return
	}
	t.mu.Lock()
	t.forgetLocked(id)
	t.mu.Unlock()
}

// expireLocked forgets every object whose TTL has passed.
func (t *stoppedTracker) expireLocked(now time.Time) {
	for id, c := range t.containers {
		t.expiredLocked(id, c.at, now)
	}
	for id, s := range t.sandboxes {
		t.expiredLocked(id, s.at, now)
	}
}

// expiredLocked reports whether the TTL of object id, whose STOPPED was sent at at, has passed by now;
// it then forgets it.
func (t *stoppedTracker) expiredLocked(id string, at, now time.Time) bool {
	if now.Sub(at) < t.ttl {
		return false
	}
	t.forgetLocked(id)
	return true
}

// container returns the status sent in the STOPPED of container id, or nil when it is not tracked
// (or its entry expired).
func (t *stoppedTracker) container(id string) *runtimeapi.ContainerStatus {
	if id == "" || !t.any() {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.containers[id]
	if c == nil || t.expiredLocked(id, c.at, t.now()) {
		return nil
	}
	return c.status
}

// mentioned reports whether an answer (encoded) contains the id of a tracked object. When it does not,
// the answer says nothing about them and is not decoded: a kubelet reads many pods, and few of them hold
// an object still ahead of the runtime.
func (t *stoppedTracker) mentioned(answer []byte) bool {
	if !t.any() {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.containers {
		if bytes.Contains(answer, c.idb) {
			return true
		}
	}
	for _, s := range t.sandboxes {
		if bytes.Contains(answer, s.idb) {
			return true
		}
	}
	return false
}

// sandbox reports whether sandbox id is tracked as stopped.
func (t *stoppedTracker) sandbox(id string) bool {
	if id == "" || !t.any() {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.sandboxes[id]
	return s != nil && !t.expiredLocked(id, s.at, t.now())
}

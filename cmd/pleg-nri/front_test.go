package main

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestEventFreshness: the front's freshness marks exactly the ids of relayed STOPPED events (read from
// the encoded event), for the freshness window.
func TestEventFreshness(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newEventFreshness(func() time.Time { return now }, 5*time.Second)
	enc := func(id string, typ runtimeapi.ContainerEventType) []byte {
		b, err := proto.Marshal(&runtimeapi.ContainerEventResponse{ContainerId: id, ContainerEventType: typ, CreatedAt: 42,
			PodSandboxStatus:   &runtimeapi.PodSandboxStatus{Id: "s1", State: runtimeapi.PodSandboxState_SANDBOX_READY},
			ContainersStatuses: []*runtimeapi.ContainerStatus{{Id: id, State: runtimeapi.ContainerState_CONTAINER_EXITED}}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if f.AnyStoppedAhead() {
		t.Fatal("ahead before any event")
	}
	f.observe(enc("c1", runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT))
	f.observe(enc("c2", runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT))
	f.observe([]byte{0xff, 0xff}) // not an event: ignored
	if f.AnyStoppedAhead() || f.StoppedAhead("c1") || f.StoppedAhead("c2") {
		t.Fatal("ahead after events that are not STOPPED")
	}
	f.observe(enc("c1", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT))
	if !f.AnyStoppedAhead() || !f.StoppedAhead("c1") || f.StoppedAhead("c2") || f.StoppedAhead("s1") {
		t.Fatalf("after STOPPED c1: any %v c1 %v c2 %v s1 %v", f.AnyStoppedAhead(), f.StoppedAhead("c1"), f.StoppedAhead("c2"), f.StoppedAhead("s1"))
	}
	now = now.Add(5 * time.Second)
	if !f.StoppedAhead("c1") {
		t.Fatal("c1 not ahead at the end of the window")
	}
	now = now.Add(time.Millisecond)
	if f.AnyStoppedAhead() || f.StoppedAhead("c1") {
		t.Fatal("c1 still ahead after the window")
	}
	f.observe(enc("c3", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT))
	f.mu.Lock()
	n := len(f.stopped)
	f.mu.Unlock()
	if n != 1 {
		t.Errorf("%d marks kept, want 1 (c1's expired)", n)
	}
}

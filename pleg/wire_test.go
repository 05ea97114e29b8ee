package pleg

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestEventMarshaled: every copy of an event shares one encoding, which decodes to the event; an event
// made without the cache still encodes.
func TestEventMarshaled(t *testing.T) {
	resp := &runtimeapi.ContainerEventResponse{ContainerId: "c1", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		CreatedAt: 42, PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: "sb1"}}
	ev := Event{Response: resp, wire: &wireCache{}}
	cp := ev
	a, err := ev.Marshaled()
	if err != nil {
		t.Fatal(err)
	}
	b, err := cp.Marshaled()
	if err != nil {
		t.Fatal(err)
	}
	if len(a) == 0 || &a[0] != &b[0] {
		t.Errorf("copies of an event do not share its encoding")
	}
	var got runtimeapi.ContainerEventResponse
	if err := proto.Unmarshal(a, &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(resp, &got, protocmp.Transform()); diff != "" {
		t.Errorf("decoded (-want +got):\n%s", diff)
	}
	c, err := Event{Response: resp}.Marshaled()
	if err != nil || !proto.Equal(mustDecode(t, c), resp) {
		t.Errorf("uncached encoding: %v", err)
	}
}

func mustDecode(t *testing.T, b []byte) *runtimeapi.ContainerEventResponse {
	t.Helper()
	var m runtimeapi.ContainerEventResponse
	if err := proto.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return &m
}

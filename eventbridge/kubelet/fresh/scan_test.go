package fresh

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// FuzzScanEvent: scanEvent reads what a full decode reads (the head always, the pod's ids when asked),
// and never panics on bytes that are not an event.
func FuzzScanEvent(f *testing.F) {
	for _, ev := range append(stoppedEvents(), podEvent("c1", runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT, "c0", "c1")) {
		b, err := proto.Marshal(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0xff})
	f.Add([]byte{0x22, 0x02, 0x0a, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		head, okHead := scanEvent(b, false)
		full, okFull := scanEvent(b, true)
		var ev runtimeapi.ContainerEventResponse
		if proto.Unmarshal(b, &ev) != nil {
			return
		}
		if !okHead || !okFull {
			t.Fatalf("scanEvent refused bytes that decode as %v", &ev)
		}
		var containers []string
		for _, c := range ev.GetContainersStatuses() {
			if c.GetId() != "" {
				containers = append(containers, c.GetId())
			}
		}
		if head.id != ev.GetContainerId() || head.typ != ev.GetContainerEventType() || head.createdAt != ev.GetCreatedAt() ||
			head.sandbox != "" || head.containers != nil {
			t.Fatalf("scanEvent without the pod: %+v; decoded: %q %s %d", head, ev.GetContainerId(), ev.GetContainerEventType(), ev.GetCreatedAt())
		}
		if full.id != head.id || full.typ != head.typ || full.createdAt != head.createdAt ||
			full.sandbox != ev.GetPodSandboxStatus().GetId() || !slices.Equal(full.containers, containers) {
			t.Fatalf("scanEvent with the pod: %+v; decoded: %q %q", full, ev.GetPodSandboxStatus().GetId(), containers)
		}
	})
}

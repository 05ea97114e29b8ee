package containerdit

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// TestCacheTick: with cache-tick, every tick brings a CREATED of each pod's sandbox whose created_at is
// after every earlier event of the pod and whose statuses are containerd's own, field by field; a pod
// stopped and removed ticks no more.
func TestCacheTick(t *testing.T) {
	const tick = 300 * time.Millisecond
	p := startPlegNRI(t, "--cache-tick", tick.String())
	rec := recordEvents(t, p.Socket)
	via, direct := newCRI(t, p.Socket), newCRI(t, env.Address)

	podID, podCfg := via.runPod("tick")
	id := via.create(podID, podCfg, containerConfig("sleeper", "sleep 3600"))
	via.start(id)
	started := rec.wait(t, id, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)

	// ticks returns the pod's CREATED events of its sandbox after the container's STARTED.
	ticks := func() []*runtimeapi.ContainerEventResponse {
		var out []*runtimeapi.ContainerEventResponse
		after := false
		for _, ev := range rec.Events() {
			switch {
			case ev == started:
				after = true
			case after && ev.GetContainerId() == podID && ev.GetContainerEventType() == runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT:
				out = append(out, ev)
			}
		}
		return out
	}
	var got []*runtimeapi.ContainerEventResponse
	err := harness.WaitFor(context.Background(), 30*time.Second, "three ticks of the pod", func() (bool, error) {
		got = ticks()
		return len(got) >= 3, rec.Err()
	})
	if err != nil {
		t.Fatalf("%v; recorded: %s", err, describeEvents(rec.Events()))
	}
	prev := started.GetCreatedAt()
	for i, ev := range got[:3] {
		if ev.GetCreatedAt() <= prev {
			t.Errorf("tick %d: created_at %d, not after the pod's previous event %d", i, ev.GetCreatedAt(), prev)
		}
		prev = ev.GetCreatedAt()
	}
	if gap := time.Duration(got[2].GetCreatedAt() - got[1].GetCreatedAt()); gap < tick/2 || gap > 10*tick {
		t.Errorf("ticks %s apart, want about %s", gap, tick)
	}
	last := got[2]
	if diff := cmp.Diff(direct.podStatus(podID), last.GetPodSandboxStatus(), protocmp.Transform()); diff != "" {
		t.Errorf("the tick's sandbox status against containerd's (-containerd +tick):\n%s", diff)
	}
	if n := len(last.GetContainersStatuses()); n != 1 {
		t.Fatalf("the tick carries %d container statuses, want 1", n)
	}
	if diff := cmp.Diff(direct.status(id), last.GetContainersStatuses()[0], protocmp.Transform()); diff != "" {
		t.Errorf("the tick's container status against containerd's (-containerd +tick):\n%s", diff)
	}
	if n := p.metric(t, "pleg_nri_events_emitted_total", `type="created"`, `source="tick"`); n < 3 {
		t.Errorf("pleg_nri_events_emitted_total{type=\"created\",source=\"tick\"} = %g, want at least 3", n)
	}

	via.stopPod(podID)
	via.removePod(podID)
	rec.wait(t, podID, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT)
	n := len(ticks())
	time.Sleep(4 * tick)
	if more := len(ticks()) - n; more != 0 {
		t.Errorf("%d ticks of the pod after its sandbox's DELETED", more)
	}
}

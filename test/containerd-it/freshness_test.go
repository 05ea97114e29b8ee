package containerdit

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// TestOverlaidReads: with read-freshness overlay (the default), while containerd has not handled an
// exit that pleg-nri already reported, reads through pleg-nri show the container exited with the
// fields containerd shows once it catches up (compared field by field), a list of running containers
// leaves it out, and the calls a kubelet makes on such a container (StopContainer, RemoveContainer)
// work through pleg-nri: containerd finishes them once its exit handling is done.
func TestOverlaidReads(t *testing.T) {
	gate := env.GateRuncDelete(t)
	p := startPlegNRI(t)
	rec := recordEvents(t, p.Socket)
	via, direct := newCRI(t, p.Socket), newCRI(t, env.Address)

	podID, podCfg := via.runPod("overlay")
	// Exits 3 once the test has closed the gate.
	id := via.create(podID, podCfg, containerConfig("exiter", "sleep 2; exit 3"))
	via.start(id)
	gate.Close()
	stopped := rec.wait(t, id, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	var sent *runtimeapi.ContainerStatus
	for _, c := range stopped.GetContainersStatuses() {
		if c.GetId() == id {
			sent = c
		}
	}
	if sent == nil || sent.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("pleg-nri's STOPPED does not show %s exited: %v", short(id), stopped)
	}
	if st := direct.status(id); st.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("containerd shows %s %s while its runc delete is held: the gate did not hold the exit handler", short(id), st.GetState())
	}

	overlaid := via.status(id)
	if overlaid.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED || overlaid.GetExitCode() != 3 ||
		overlaid.GetFinishedAt() != sent.GetFinishedAt() || overlaid.GetReason() != sent.GetReason() {
		t.Errorf("through pleg-nri: %s exit %d reason %q finished %d; pleg-nri sent exit %d reason %q finished %d",
			overlaid.GetState(), overlaid.GetExitCode(), overlaid.GetReason(), overlaid.GetFinishedAt(),
			sent.GetExitCode(), sent.GetReason(), sent.GetFinishedAt())
	}
	sb, err := via.rt.PodSandboxStatus(ctx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: podID})
	if err != nil || sb.GetStatus().GetState() != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("sandbox through pleg-nri: %v %v, want READY (only its container exited)", sb.GetStatus().GetState(), err)
	}
	running, err := via.rt.ListContainers(ctx(t), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		PodSandboxId: podID, State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
	if err != nil || len(running.GetContainers()) != 0 {
		t.Errorf("running containers of the pod through pleg-nri: %v (%v), want none", running.GetContainers(), err)
	}
	all, err := via.rt.ListContainers(ctx(t), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: id}})
	if err != nil || len(all.GetContainers()) != 1 || all.GetContainers()[0].GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("ListContainers of %s through pleg-nri: %v (%v), want it EXITED", short(id), all.GetContainers(), err)
	}

	// A kubelet may stop such a container (killing its pod): containerd answers once its exit handling
	// is done.
	stopDone := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := via.rt.StopContainer(cctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 0})
		stopDone <- err
	}()
	gate.Open()
	if err := <-stopDone; err != nil {
		t.Errorf("StopContainer through pleg-nri: %v", err)
	}

	// containerd caught up: its answer is what pleg-nri answered, field by field, and goes through
	// unchanged from now on.
	truth := direct.waitState(id, runtimeapi.ContainerState_CONTAINER_EXITED)
	if diff := cmp.Diff(truth, overlaid, protocmp.Transform()); diff != "" {
		t.Errorf("overlaid answer against containerd's once it caught up (-containerd +overlaid):\n%s", diff)
	}
	if diff := cmp.Diff(truth, via.status(id), protocmp.Transform()); diff != "" {
		t.Errorf("answer through pleg-nri after containerd caught up (-containerd +pleg-nri):\n%s", diff)
	}

	// And removes it.
	via.remove(id)
	rec.wait(t, id, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT)
	if _, err := via.rt.ContainerStatus(ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id}); status.Code(err) != codes.NotFound {
		t.Errorf("ContainerStatus of the removed %s through pleg-nri: %v, want NotFound", short(id), err)
	}
	if n := p.metric(t, "pleg_nri_overlaid_reads_total"); n < 3 {
		t.Errorf("pleg_nri_overlaid_reads_total = %g, want at least the 3 reads above", n)
	}
}

// TestRefreshAfterStop (issue 11, item 7; issue 57): with refresh-after-stop, a StopContainer through
// the endpoint is followed, once the client's calls about the pod went quiet, by a refresh: a second
// STOPPED of the container from the core, with a newer created_at, carrying containerd's own statuses,
// sent beside the relayed events without ending the front's stream from the core. (It replaces the
// hold mode's refresh test: the core's refresh is the same, only its trigger differs.)
func TestRefreshAfterStop(t *testing.T) {
	p := startPlegNRI(t, "--refresh-after-stop")
	rec := recordEvents(t, p.Socket)
	via, direct := newCRI(t, p.Socket), newCRI(t, env.Address)

	podID, podCfg := via.runPod("refresh")
	id := via.create(podID, podCfg, containerConfig("sleeper", "sleep 3600"))
	via.start(id)
	// Past the early exit's window (1 s from the start, fresh.earlyExitWindow): a stop that soon would
	// also be refreshed as an early exit, and this test is about the refresh after a stop.
	time.Sleep(1500 * time.Millisecond)
	via.stop(id, 0)
	first := rec.wait(t, id, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)

	var refresh *runtimeapi.ContainerEventResponse
	err := harness.WaitFor(context.Background(), 30*time.Second, "a refresh STOPPED of "+short(id), func() (bool, error) {
		n := 0
		for _, ev := range rec.Events() {
			if ev.GetContainerId() == id && ev.GetContainerEventType() == runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
				if n++; n == 2 {
					refresh = ev
					return true, nil
				}
			}
		}
		return false, rec.Err()
	})
	if err != nil {
		t.Fatalf("%v; recorded: %s", err, describeEvents(rec.Events()))
	}
	if refresh.GetCreatedAt() <= first.GetCreatedAt() {
		t.Errorf("refresh created_at %d, not after the first STOPPED's %d", refresh.GetCreatedAt(), first.GetCreatedAt())
	}
	truth := direct.status(id)
	var got *runtimeapi.ContainerStatus
	for _, c := range refresh.GetContainersStatuses() {
		if c.GetId() == id {
			got = c
		}
	}
	if diff := cmp.Diff(truth, got, protocmp.Transform()); diff != "" {
		t.Errorf("the refresh's status of %s against containerd's (-containerd +refresh):\n%s", short(id), diff)
	}
	if diff := cmp.Diff(direct.podStatus(podID), refresh.GetPodSandboxStatus(), protocmp.Transform()); diff != "" {
		t.Errorf("the refresh's sandbox status against containerd's (-containerd +refresh):\n%s", diff)
	}
	if n := p.metric(t, "pleg_nri_events_emitted_total", `source="refresh"`, `type="stopped"`, `kind="container"`); n != 1 {
		t.Errorf("pleg_nri_events_emitted_total{source=\"refresh\",type=\"stopped\",kind=\"container\"} = %g, want 1", n)
	}
	// The refresh went out beside the relayed events: the front's relay kept its stream from the core
	// (a refresh that ended it lost what the core had queued, issue 26).
	if n := p.metric(t, "pleg_nri_front_resubscriptions_total"); n != 0 {
		t.Errorf("pleg_nri_front_resubscriptions_total = %g, want 0: the front subscribed to the core again", n)
	}
}

package containerdit

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestStateReadsCheckMode runs a workload through pleg-nri's endpoint with read-source check, reading
// the four reads the state can answer (with their filters) all along, and requires that every read the
// check mode compared equalled containerd's answer: pods run, containers created, started, exiting by
// themselves or stopped, removed, pods stopped and removed.
func TestStateReadsCheckMode(t *testing.T) {
	logOnFailure(t)
	p := startPlegNRI(t, "--read-source", "check")
	c := newCRI(t, p.Socket)

	// A reader that keeps reading through the endpoint while the workload runs.
	var (
		mu       sync.Mutex
		pods     []string
		ctrs     []string
		readErrs []error
	)
	readCtx, stopReading := context.WithCancel(context.Background())
	readerDone := make(chan struct{})
	readAll := func(ctx context.Context) {
		mu.Lock()
		ps, cs := append([]string(nil), pods...), append([]string(nil), ctrs...)
		mu.Unlock()
		fail := func(what string, err error) {
			if err != nil && ctx.Err() == nil {
				mu.Lock()
				readErrs = append(readErrs, fmt.Errorf("%s: %w", what, err))
				mu.Unlock()
			}
		}
		_, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		fail("ListPodSandbox", err)
		_, err = c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
			State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}}})
		fail("ListPodSandbox READY", err)
		_, err = c.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		fail("ListContainers", err)
		_, err = c.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
			State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
		fail("ListContainers RUNNING", err)
		for _, id := range ps {
			// Statuses of removed objects are NotFound: containerd's answer, forwarded.
			_, _ = c.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
			_, err = c.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: id}})
			fail("ListContainers of a pod", err)
			_, err = c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{Id: id}})
			fail("ListPodSandbox of a pod", err)
		}
		for _, id := range cs {
			_, _ = c.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		}
	}
	go func() {
		defer close(readerDone)
		for readCtx.Err() == nil {
			readAll(readCtx)
		}
	}()

	// Each call of the workload is followed at once by a read of everything: what the state answers
	// right after a create, start, stop or remove came back is compared too.
	step := func(call func()) {
		call()
		readAll(ctx(t))
	}
	const rounds = 3
	for r := range rounds {
		var round []string
		for i := range 3 {
			podID, podCfg := c.runPod(fmt.Sprintf("reads-%d-%d", r, i))
			mu.Lock()
			pods = append(pods, podID)
			mu.Unlock()
			long := c.create(podID, podCfg, containerConfig("long", "sleep 300"))
			short := c.create(podID, podCfg, containerConfig("short", "exit 3"))
			mu.Lock()
			ctrs = append(ctrs, long, short)
			mu.Unlock()
			step(func() { c.start(long) })
			step(func() { c.start(short) })
			round = append(round, podID, long, short)
		}
		for i := 0; i < len(round); i += 3 {
			podID, long, short := round[i], round[i+1], round[i+2]
			c.waitState(short, runtimeapi.ContainerState_CONTAINER_EXITED)
			step(func() { c.stop(long, 1) })
			step(func() { c.remove(short) })
			step(func() { c.remove(long) })
			step(func() { c.stopPod(podID) })
			step(func() { c.removePod(podID) })
		}
	}
	// One pod left running, and reads on a quiet node: the state settles, and the reads compare.
	podID, podCfg := c.runPod("reads-quiet")
	long := c.create(podID, podCfg, containerConfig("long", "sleep 300"))
	c.start(long)
	mu.Lock()
	pods, ctrs = append(pods, podID), append(ctrs, long)
	mu.Unlock()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && p.metric(t, "pleg_nri_state_reads_total", `result="equal"`, `/ContainerStatus"`) < 20 {
		readAll(ctx(t))
	}
	stopReading()
	<-readerDone
	for _, err := range readErrs {
		t.Error(err)
	}

	equal := p.metric(t, "pleg_nri_state_reads_total", `result="equal"`)
	differ := p.metric(t, "pleg_nri_state_read_differences_total")
	t.Logf("reads through the endpoint: %v compared equal, %v differed, %v forwarded (state not current), %v inconclusive",
		equal, differ, p.metric(t, "pleg_nri_state_reads_total", `result="runtime"`), p.metric(t, "pleg_nri_state_reads_total", `result="inconclusive"`))
	for _, m := range []string{"ListPodSandbox", "ListContainers", "PodSandboxStatus", "ContainerStatus"} {
		n := p.metric(t, "pleg_nri_state_reads_total", `result="equal"`, `/`+m+`"`)
		t.Logf("  %s: %v equal, %v differ", m, n, p.metric(t, "pleg_nri_state_reads_total", `result="differ"`, `/`+m+`"`))
		if n == 0 {
			t.Errorf("no %s compared: the check mode never found the state current for it", m)
		}
	}
	if differ != 0 {
		t.Errorf("%v reads answered from the state differed from containerd's", differ)
	}
}

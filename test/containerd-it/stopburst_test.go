package containerdit

import (
	"fmt"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// stopBurstContainers is how many containers of one pod BenchmarkStopBurst stops at once, as a kubelet
// does when the pod is deleted.
const stopBurstContainers = 40

// BenchmarkStopBurst measures what an NRI plugin costs a burst of container stops: containerd calls
// its NRI plugins under one lock (github.com/containerd/nri pkg/adaptation: every request and every
// exit notification), once per container that stops, and a CRI StopContainer returns only after that
// call. A pod of stopBurstContainers running containers is stopped by as many concurrent
// StopContainer calls (timeout 0: SIGKILL) in three setups, in turn: no pleg-nri, pleg-nri, and
// pleg-nri with --nri-stop-container=false; the time is from the first call to the last return.
func BenchmarkStopBurst(b *testing.B) {
	rt := benchRuntime(b, env.Address)
	setups := []struct {
		name  string
		flags []string // nil: no pleg-nri
	}{
		{"no pleg-nri", nil},
		{"pleg-nri", benchPlegFlags},
		{"pleg-nri --nri-stop-container=false", append(append([]string{}, benchPlegFlags...), "--nri-stop-container=false")},
	}
	times := make([][]float64, len(setups))
	burst := func(round, s int) {
		if setups[s].flags != nil {
			p := startPlegNRI(b, setups[s].flags...)
			defer p.stop()
		}
		id, cfg := benchRunPod(b, rt, fmt.Sprintf("stop-burst-%d-%d", round, s))
		ids := make([]string, stopBurstContainers)
		parallel(b, stopBurstContainers, 8, func(i int) error {
			c, err := rt.CreateContainer(b.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: id,
				Config: harness.ContainerConfig(fmt.Sprintf("c%02d", i), "exec sleep 3600"), SandboxConfig: cfg})
			if err != nil {
				return fmt.Errorf("CreateContainer: %w", err)
			}
			ids[i] = c.ContainerId
			_, err = rt.StartContainer(b.Context(), &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId})
			return err
		})
		start := time.Now()
		parallel(b, stopBurstContainers, stopBurstContainers, func(i int) error {
			_, err := rt.StopContainer(b.Context(), &runtimeapi.StopContainerRequest{ContainerId: ids[i], Timeout: 0})
			return err
		})
		times[s] = append(times[s], float64(time.Since(start).Microseconds())/1e3)
	}
	const rounds = 6
	for r := range rounds {
		for i := range setups {
			burst(r, (r+i)%len(setups))
		}
	}
	b.ReportMetric(0, "ns/op")
	base := benchreport.Median(times[0])
	for i, s := range setups {
		m := benchreport.Median(times[i])
		b.ReportMetric(m, fmt.Sprintf("setup%d-p50-ms", i))
		b.Logf("%d concurrent StopContainer, %s: p50 %.0f ms (%.2fx no pleg-nri's), all %v", stopBurstContainers, s.name, m, m/base, round(times[i]))
	}
}

func round(v []float64) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x + 0.5)
	}
	return out
}

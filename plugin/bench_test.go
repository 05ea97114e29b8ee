package plugin

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/pleg"
)

// nopObserver drops every observation.
type nopObserver struct{}

func (nopObserver) Observe(pleg.Observation) {}

// realisticPod and realisticContainer are about what containerd sends for a kubelet pod.
func realisticPod() *api.PodSandbox {
	return &api.PodSandbox{
		Id: "3f2b6c0a9d5e4b7c8a1f0e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6e5f4a3", Name: "web-7d9f8c6b5-x2k4p",
		Uid: "6b0c8a1e-3f4d-4e5a-9b8c-7d6e5f4a3b2c", Namespace: "default", Pid: 4242, RuntimeHandler: "",
		Labels: map[string]string{"app": "web", "pod-template-hash": "7d9f8c6b5",
			"io.kubernetes.pod.name": "web-7d9f8c6b5-x2k4p", "io.kubernetes.pod.namespace": "default"},
		Annotations: map[string]string{"kubernetes.io/config.seen": "2026-11-21T13:00:00Z", "kubernetes.io/config.source": "api"},
		Ips:         []string{"10.244.1.17"},
		Linux:       &api.LinuxPodSandbox{CgroupParent: "/kubepods/besteffort/pod6b0c8a1e", CgroupsPath: "/kubepods/besteffort/pod6b0c8a1e/3f2b6c0a"},
	}
}

func realisticContainer(state api.ContainerState) *api.Container {
	return &api.Container{
		Id: "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b", PodSandboxId: "3f2b6c0a9d5e4b7c8a1f0e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6e5f4a3",
		Name: "web", State: state, Pid: 4300,
		Labels: map[string]string{"io.kubernetes.container.name": "web", "io.kubernetes.pod.name": "web-7d9f8c6b5-x2k4p",
			"io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": "6b0c8a1e-3f4d-4e5a-9b8c-7d6e5f4a3b2c"},
		Annotations: map[string]string{"io.kubernetes.container.hash": "1b2c3d4e", "io.kubernetes.container.restartCount": "0",
			"io.kubernetes.container.terminationMessagePath": "/dev/termination-log"},
		Args:      []string{"nginx", "-g", "daemon off;"},
		Env:       []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=web-7d9f8c6b5-x2k4p"},
		Mounts:    []*api.Mount{{Destination: "/etc/hosts", Source: "/var/lib/kubelet/pods/6b0c/etc-hosts", Type: "bind"}},
		CreatedAt: created, StartedAt: started, FinishedAt: finished, ExitCode: 0,
		Linux: &api.LinuxContainer{CgroupsPath: "/kubepods/besteffort/pod6b0c8a1e/9a8b7c6d"},
	}
}

// BenchmarkHook measures one callback's handling (conversion, observer call, metrics) with a no-op observer.
func BenchmarkHook(b *testing.B) {
	p, err := New(Config{Observer: nopObserver{}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	pod := realisticPod()
	running := realisticContainer(api.ContainerState_CONTAINER_RUNNING)
	stopped := realisticContainer(api.ContainerState_CONTAINER_STOPPED)
	for _, bc := range []struct {
		name string
		call func()
	}{
		{"RunPodSandbox", func() { _ = p.RunPodSandbox(ctx, pod) }},
		{"PostCreateContainer", func() { _ = p.PostCreateContainer(ctx, pod, running) }},
		{"PostStartContainer", func() { _ = p.PostStartContainer(ctx, pod, running) }},
		{"PostUpdateContainer", func() { _ = p.PostUpdateContainer(ctx, pod, running) }},
		{"StopContainer", func() { _, _ = p.StopContainer(ctx, pod, stopped) }},
		{"RemoveContainer", func() { _ = p.RemoveContainer(ctx, pod, stopped) }},
		{"StopPodSandbox", func() { _ = p.StopPodSandbox(ctx, pod) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bc.call()
			}
		})
	}
}

// BenchmarkHookSynchronize measures Synchronize with 100 pods of 3 containers each.
func BenchmarkHookSynchronize(b *testing.B) {
	p, err := New(Config{Observer: nopObserver{}})
	if err != nil {
		b.Fatal(err)
	}
	var pods []*api.PodSandbox
	var ctrs []*api.Container
	for i := range 100 {
		pod := realisticPod()
		pod.Id = fmt.Sprintf("pod-%03d", i)
		pods = append(pods, pod)
		for j := range 3 {
			c := realisticContainer(api.ContainerState_CONTAINER_RUNNING)
			c.Id, c.PodSandboxId = fmt.Sprintf("ctr-%03d-%d", i, j), pod.Id
			ctrs = append(ctrs, c)
		}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = p.Synchronize(ctx, pods, ctrs)
	}
}

// reportPercentiles reports the median and 99th percentile of ds as the benchmark metrics prefix+"p50-ns"
// and prefix+"p99-ns" (make bench's report compares "p99-ns" with the hook goal).
func reportPercentiles(b *testing.B, prefix string, ds []time.Duration) {
	b.Helper()
	if len(ds) == 0 {
		b.Fatalf("no %sdurations recorded", prefix)
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Nanoseconds()), prefix+"p50-ns")
	b.ReportMetric(float64(ds[min(len(ds)-1, len(ds)*99/100)].Nanoseconds()), prefix+"p99-ns")
}

// hookDurations returns every recorded handling time but Synchronize's.
func (m *recMetrics) hookDurations() []time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var all []time.Duration
	for cb, ds := range m.durations {
		if cb != CallbackSynchronize {
			all = append(all, ds...)
		}
	}
	return all
}

// BenchmarkHookPercentiles times each lifecycle callback as the plugin's metrics see it (conversion,
// observer call) over b.N rounds of six direct calls, and reports p50 and p99 of the handling time.
func BenchmarkHookPercentiles(b *testing.B) {
	m := newRecMetrics()
	p, err := New(Config{Observer: nopObserver{}, Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	pod := realisticPod()
	running := realisticContainer(api.ContainerState_CONTAINER_RUNNING)
	stopped := realisticContainer(api.ContainerState_CONTAINER_STOPPED)
	for b.Loop() {
		_ = p.RunPodSandbox(ctx, pod)
		_ = p.PostCreateContainer(ctx, pod, running)
		_ = p.PostStartContainer(ctx, pod, running)
		_, _ = p.StopContainer(ctx, pod, stopped)
		_ = p.RemoveContainer(ctx, pod, stopped)
		_ = p.StopPodSandbox(ctx, pod)
	}
	reportPercentiles(b, "", m.hookDurations())
}

// BenchmarkHookRoundTrip drives b.N pod lifecycles (seven callbacks each) through NRI's own adaptation over
// ttrpc, and reports p50 and p99 of the plugin's handling time ("p50-ns", "p99-ns") and of the
// runtime-to-plugin round trip, ttrpc included ("rtt-p50-ns", "rtt-p99-ns").
func BenchmarkHookRoundTrip(b *testing.B) {
	rt := newFakeRuntime(b)
	rt.Start()
	h := startPlugin(b, rt.Outer, nil)
	h.waitSynced()
	nri := rt.NRI()
	blk := nri.BlockPluginSync()
	defer blk.Unblock()
	rt.mu.Lock()
	rt.latency = nil
	rt.mu.Unlock()
	h.metrics.mu.Lock()
	clear(h.metrics.durations)
	h.metrics.mu.Unlock()
	ctx := context.Background()
	pod := realisticPod()
	running := realisticContainer(api.ContainerState_CONTAINER_RUNNING)
	stopped := realisticContainer(api.ContainerState_CONTAINER_STOPPED)
	for b.Loop() {
		_ = nri.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod})
		_ = nri.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: pod, Container: running})
		_ = nri.PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: pod, Container: running})
		_, _ = nri.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: stopped})
		_ = nri.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: stopped})
		_ = nri.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod})
		_ = nri.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod})
	}
	b.StopTimer()
	reportPercentiles(b, "", h.metrics.hookDurations())
	rt.mu.Lock()
	rtt := slices.Clone(rt.latency)
	rt.mu.Unlock()
	reportPercentiles(b, "rtt-", rtt)
}

// fixedStatus is a pleg.StatusSource that answers at once that every container is created and every
// sandbox ready, so that the core settles each object after one status call, as with containerd.
type fixedStatus struct{}

func (fixedStatus) ContainerStatus(_ context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	return &runtimeapi.ContainerStatus{Id: id, State: runtimeapi.ContainerState_CONTAINER_CREATED, CreatedAt: created,
		Metadata: &runtimeapi.ContainerMetadata{Name: "web"}}, nil
}

func (fixedStatus) PodSandboxStatus(_ context.Context, id string) (*runtimeapi.PodSandboxStatus, error) {
	return &runtimeapi.PodSandboxStatus{Id: id, State: runtimeapi.PodSandboxState_SANDBOX_READY, CreatedAt: created,
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Uid: "uid", Namespace: "default"}}, nil
}

// BenchmarkHookIntoCore measures one callback's handling with the daemon's observer, the pleg core, running:
// unlike BenchmarkHook, each call also wakes the core's goroutine, parked since the previous call, as in the
// daemon, where callbacks come one at a time. It reports the median and 99th percentile of the handling
// time (the part the runtime waits for).
//
// It runs on one P, like the daemon (see setProcs in cmd/pleg-nri).
func BenchmarkHookIntoCore(b *testing.B) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	core, err := pleg.New(pleg.Config{Status: fixedStatus{}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- core.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	p, err := New(Config{Observer: core})
	if err != nil {
		b.Fatal(err)
	}
	pod := realisticPod()
	ctr := realisticContainer(api.ContainerState_CONTAINER_RUNNING)
	lat := make([]time.Duration, 0, b.N)
	i := 0
	for b.Loop() {
		i++
		ctr.Id = fmt.Sprintf("ctr-%d", i)
		start := time.Now()
		_ = p.PostCreateContainer(ctx, pod, ctr)
		lat = append(lat, time.Since(start))
		b.StopTimer()
		time.Sleep(200 * time.Microsecond) // let the core park again, as between two real callbacks
		b.StartTimer()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}

package kubelet

import (
	"context"
	"slices"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// BenchmarkForward measures a unary CRI call made directly to the fake runtime and through the proxy, side
// by side: the difference is the proxy's cost. ListContainers answers 100 containers (~40 KB).
//
//	go test -run '^$' -bench BenchmarkForward -benchtime 3s ./eventbridge/kubelet/
//
// Besides ns/op it reports the median and 99th percentile latency and the CPU time the whole process
// spent per call (cpu-ns/op): proxied minus direct is the proxy's CPU cost, a figure that holds on a
// busy machine where latencies do not.
func BenchmarkForward(b *testing.B) {
	e := newEnv(b, 100)
	calls := benchCalls(context.Background())
	for _, path := range []struct {
		name   string
		client runtimeapi.RuntimeServiceClient
	}{
		{"direct", runtimeapi.NewRuntimeServiceClient(e.direct)},
		{"proxied", runtimeapi.NewRuntimeServiceClient(e.proxied)},
	} {
		b.Run(path.name, func(b *testing.B) {
			for _, c := range calls {
				b.Run(c.name, func(b *testing.B) {
					if err := c.call(path.client); err != nil { // warm the connections
						b.Fatal(err)
					}
					lat := make([]time.Duration, 0, b.N)
					b.ReportAllocs()
					cpu0 := processCPU(b)
					b.ResetTimer()
					for b.Loop() {
						start := time.Now()
						if err := c.call(path.client); err != nil {
							b.Fatal(err)
						}
						lat = append(lat, time.Since(start))
					}
					b.StopTimer()
					// CPU time of the whole process (client, proxy and fake runtime) per call: unlike
					// latency, it does not depend on what else the machine runs.
					b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/float64(len(lat)), "cpu-ns/op")
					slices.Sort(lat)
					b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
					b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
				})
			}
		})
	}
}

// BenchmarkForwardInterleaved alternates a direct and a proxied call in each iteration, so that both see
// the same machine load, and reports the medians and their difference (the proxy's added latency).
func BenchmarkForwardInterleaved(b *testing.B) {
	e := newEnv(b, 100)
	direct, proxied := runtimeapi.NewRuntimeServiceClient(e.direct), runtimeapi.NewRuntimeServiceClient(e.proxied)
	for _, c := range benchCalls(context.Background()) {
		b.Run(c.name, func(b *testing.B) {
			var dl, pl []time.Duration
			timed := func(client runtimeapi.RuntimeServiceClient, into *[]time.Duration) {
				start := time.Now()
				if err := c.call(client); err != nil {
					b.Fatal(err)
				}
				*into = append(*into, time.Since(start))
			}
			timed(direct, &dl)
			timed(proxied, &pl)
			dl, pl = dl[:0], pl[:0]
			for b.Loop() {
				timed(direct, &dl)
				timed(proxied, &pl)
			}
			slices.Sort(dl)
			slices.Sort(pl)
			d50, p50 := dl[len(dl)/2], pl[len(pl)/2]
			b.ReportMetric(float64(d50.Nanoseconds()), "direct-p50-ns")
			b.ReportMetric(float64(p50.Nanoseconds()), "proxied-p50-ns")
			b.ReportMetric(float64((p50 - d50).Nanoseconds()), "added-p50-ns")
		})
	}
}

// benchCall is one unary call of the forwarding benchmarks.
type benchCall struct {
	name string
	call func(runtimeapi.RuntimeServiceClient) error
}

// benchCalls are a call with a small answer (Version) and one with a ~40 KB answer (ListContainers of
// the env's 100 containers).
func benchCalls(ctx context.Context) []benchCall {
	return []benchCall{
		{"Version", func(c runtimeapi.RuntimeServiceClient) error {
			_, err := c.Version(ctx, &runtimeapi.VersionRequest{})
			return err
		}},
		{"ListContainers", func(c runtimeapi.RuntimeServiceClient) error {
			_, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
			return err
		}},
	}
}

// processCPU returns the user+system CPU time the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

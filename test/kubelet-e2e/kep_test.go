package kubelete2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
)

// The beta criteria of KEP-3386 (EventedPLEG) name two tests upstream never wrote: a Stress test and a
// Recovery test (../shared/docs/background.md, "How upstream judges EventedPLEG"). Here they run against
// the real kubelet on both evented setups: they must pass on pleg-nri; containerd's own stream's result
// is logged beside it ("containerd's stream:" lines), as the issue asks for a comparison, not a verdict
// on containerd.

// stressContainers is how many containers the Stress test's pod has: created, started, stopped and
// stopped together, they make 3 events each (created, started, stopped) within a second or two.
const stressContainers = 40

// stressStopTimeout bounds the wait for the Stress pod to be stopped once its manifest is removed. Its
// 40 containers are killed together, and containerd handles each exit (the task's delete in the shim,
// its rootfs unmounted) within 10 s or tries it again after a back-off from 1 s, doubling
// (containerd v2.4.2, internal/cri/server/events.go: handleEventTimeout; events/events.go:
// backOffInitDuration); its StopContainer returns once that is done. With a kubelet building beside
// this suite (make test on a cold cache) some deletes missed those 10 s twice in a row ("failed to
// stop container: context deadline exceeded", then the same for the back-off's retry), and the pod
// took 1m20s to stop with pleg-nri and more than 1m30s on containerd's stream, in containerd's exit
// handling alike. How long that takes is not what this test is about.
const stressStopTimeout = 4 * time.Minute

// eventBucket is the kubelet's latency histogram bucket the KEP's Stress test reads: events handled
// within a second of their created_at.
const eventBucket = `le="1"`

// TestKEPStress is KEP-3386's Stress test: one pod with stressContainers containers, written and then
// removed at once. A subscriber of the test's own, on the same endpoint as the kubelet, counts every
// event that carries a pod sandbox status (the kubelet drops the others before counting them); the
// kubelet's evented_pleg_connection_latency_seconds must count exactly as many, every one of them in
// its 1 s bucket, its stream must not fail, and the pod must run every container and then be gone.
func TestKEPStress(t *testing.T) {
	for _, s := range []setup{setupEventedDirect, setupEventedPlegNRI} {
		t.Run(s.Name, func(t *testing.T) {
			n := startNode(t, s)
			endpoint := env.Address
			if s.PlegNRI {
				endpoint = n.p.Socket
			}
			sub := subscribe(t, endpoint)
			before := n.plegMetrics()
			bucketBefore := n.metric(metricEventBucket, eventBucket)

			pod := kubelet.Pod{Name: "stress"}
			for i := range stressContainers {
				pod.Containers = append(pod.Containers, kubelet.Container{Name: fmt.Sprintf("c%02d", i), Script: "exec sleep 3600"})
			}
			start := time.Now()
			if err := n.k.WritePod(pod); err != nil {
				t.Fatal(err)
			}
			p := n.waitPod("stress", fmt.Sprintf("all %d containers running", stressContainers), func(p *kubelet.PodStatus) (bool, error) {
				ok, err := running(p)
				return ok && len(p.Status.ContainerStatuses) == stressContainers, err
			})
			runningAfter := time.Since(start)
			if err := n.k.RemovePod("stress"); err != nil {
				t.Fatal(err)
			}
			n.waitPodStoppedWithin("stress", p.Metadata.UID, stressStopTimeout)
			gone := time.Since(start)

			// Every event the subscriber counted must reach the kubelet: wait for its count to catch up
			// (the kubelet observes an event when it takes it from the stream), then for nothing more.
			want := 0
			var got, inBucket float64
			err := harness.WaitFor(context.Background(), 10*time.Second, "the kubelet to count every event", func() (bool, error) {
				want = sub.count()
				got = n.metric(metricEventsReceived) - before.EventsReceived
				inBucket = n.metric(metricEventBucket, eventBucket) - bucketBefore
				return int(got) >= want && want >= 3*stressContainers, nil
			})
			now := n.plegMetrics()
			lat := 0.0
			if got > 0 {
				lat = (now.EventLatency - before.EventLatency) / got
			}
			summary := fmt.Sprintf("%d containers running %s after the manifest, gone %s after it; the subscriber saw %d events with a sandbox status, "+
				"the kubelet counted %g (%g within 1 s, mean latency %.0f ms); stream errors %g",
				stressContainers, runningAfter.Round(time.Millisecond), gone.Round(time.Millisecond), want, got, inBucket, lat*1000,
				now.ConnError-before.ConnError)
			if !s.PlegNRI {
				t.Logf("containerd's stream: %s (wait: %v)", summary, err)
				return
			}
			t.Log(summary)
			if err != nil {
				t.Errorf("%v: %s", err, summary)
			}
			if int(got) != want {
				t.Errorf("the kubelet counted %g events, the subscriber saw %d", got, want)
			}
			if inBucket != got {
				t.Errorf("%g of the kubelet's %g events took more than a second", got-inBucket, got)
			}
			if sub.dropped() > 0 {
				t.Errorf("%d events without a pod sandbox status (the kubelet drops them)", sub.dropped())
			}
			n.checkConsumingStream(before, now)
		})
	}
}

// metricEventBucket is the kubelet's event latency histogram's buckets.
var metricEventBucket = kubeletMetricPrefix + "evented_pleg_connection_latency_seconds_bucket"

// TestKEPRecovery is KEP-3386's Recovery test: a run-once pod's `sleep 20` container exits while the
// kubelet is stopped, so the kubelet misses its STOPPED; once the kubelet is back the pod reports
// Succeeded and the container Completed (exit code 0), and the kubelet's new stream works.
func TestKEPRecovery(t *testing.T) {
	for _, s := range []setup{setupEventedDirect, setupEventedPlegNRI} {
		t.Run(s.Name, func(t *testing.T) {
			n := startNode(t, s)
			if err := n.k.WritePod(kubelet.Pod{Name: "recovery", RestartPolicy: "Never",
				Containers: []kubelet.Container{{Name: "sleeper", Script: "exec sleep 20"}}}); err != nil {
				t.Fatal(err)
			}
			p := n.waitPod("recovery", "running", running)
			id := trimRuntime(p.Container("sleeper").ContainerID)
			n.k.Stop()
			err := harness.WaitFor(context.Background(), 40*time.Second, "the sleeper to exit in containerd", func() (bool, error) {
				return n.containerStatus(id).GetState() == runtimeapi.ContainerState_CONTAINER_EXITED, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			exited := time.Now()
			if err := n.k.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			n.waitPod("recovery", "Succeeded, its container Completed", func(p *kubelet.PodStatus) (bool, error) {
				c := p.Container("sleeper")
				if c == nil || c.State.Terminated == nil {
					return false, nil
				}
				if c.State.Terminated.Reason != "Completed" || c.State.Terminated.ExitCode != 0 {
					return false, fmt.Errorf("the container ended %s, exit code %d, not Completed with 0", c.State.Terminated.Reason, c.State.Terminated.ExitCode)
				}
				return p.Status.Phase == "Succeeded", nil
			})
			t.Logf("%s: Succeeded and Completed %s after the exit (the kubelet was restarted after it)", s.Name, time.Since(exited).Round(time.Millisecond))
			err = harness.WaitFor(context.Background(), 30*time.Second, "the restarted kubelet's stream", func() (bool, error) {
				return n.metric(metricConnSuccess) >= 1, nil
			})
			if err != nil {
				t.Error(err)
			}
			if e := n.metric(metricConnError); e != 0 {
				t.Errorf("the restarted kubelet's stream failed %g times", e)
			}
		})
	}
}

func trimRuntime(id string) string {
	const prefix = "containerd://"
	if len(id) > len(prefix) && id[:len(prefix)] == prefix {
		return id[len(prefix):]
	}
	return id
}

// eventCounter is a GetContainerEvents subscriber of the test's own.
type eventCounter struct {
	mu                     sync.Mutex
	withSandbox, noSandbox int
}

func (c *eventCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.withSandbox
}

func (c *eventCounter) dropped() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.noSandbox
}

// subscribe opens a GetContainerEvents stream on a CRI endpoint for as long as the test runs, and
// counts its events: those with a pod sandbox status (and its metadata), which the kubelet counts, and
// those without.
func subscribe(t *testing.T, socket string) *eventCounter {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		cancel()
		conn.Close()
		t.Fatal(err)
	}
	c := &eventCounter{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ev, err := stream.Recv()
			if err != nil {
				return
			}
			c.mu.Lock()
			if ev.GetPodSandboxStatus().GetMetadata() != nil {
				c.withSandbox++
			} else {
				c.noSandbox++
			}
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Close()
	})
	return c
}

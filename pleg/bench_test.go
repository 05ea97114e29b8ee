package pleg

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// BenchmarkObserve is the cost NRI hooks pay: Observe only appends to the inbox.
func BenchmarkObserve(b *testing.B) {
	p, err := New(Config{Status: newFakeCRI()})
	if err != nil {
		b.Fatal(err)
	}
	o := nriContainer("c1", "s1", PhaseRunning, time.Now())
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p.Observe(o)
		if i++; i%4096 == 0 {
			p.inboxMu.Lock()
			p.inbox = p.inbox[:0] // keep the inbox from growing: only Observe is measured
			p.inboxMu.Unlock()
		}
	}
}

// BenchmarkGenerator is the event generator's throughput: full container lifecycles (CREATED with its
// status call, STARTED, STOPPED from a task exit, DELETED) in a running pod, one subscriber reading.
func BenchmarkGenerator(b *testing.B) {
	h := newHarness(b, func(c *Config) { c.VerifyDelay = -1 })
	h.startPod("s1")
	pending(h.sub)
	events := 0
	i := 0
	start := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		id := fmt.Sprint("c", i)
		i++
		now := h.clock.Now()
		h.cri.createContainer(id, "s1", now)
		h.p.Observe(nriContainer(id, "s1", PhaseCreated, now))
		h.settle()
		h.cri.startContainer(id, now)
		o := nriContainer(id, "s1", PhaseRunning, now)
		o.StartedAt = now
		h.p.Observe(o)
		h.cri.exitContainer(id, 0, now)
		h.p.Observe(taskExit(id, 0, now))
		h.p.Observe(nriExit(id, "s1", 0, now, now))
		h.cri.removeContainer(id)
		h.p.Observe(nriContainer(id, "s1", PhaseRemoved, now))
		h.p.drain(h.ctx)
		events += len(pending(h.sub))
		h.clock.Advance(time.Millisecond)
	}
	b.ReportMetric(float64(events)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkFanout publishes events of 100 pods to N subscribers, one of them stuck (never reads: it is
// coalesced, then evicted when it holds more distinct pods than its queue).
func BenchmarkFanout(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("subs=%d", n), func(b *testing.B) {
			f := newFanout(DefaultSubscriberQueue, NopMetrics{})
			f.evictAfterStall(DefaultSubscriberStallTimeout) // as a PLEG's: the sweep does it, not publish or Next
			subs := make([]*Subscription, n)
			for i := range subs {
				subs[i] = f.subscribe()
			}
			evs := make([]Event, 100)
			for i := range evs {
				evs[i] = podEvent(fmt.Sprint("pod", i), fmt.Sprint("c", i))
			}
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				f.publish(ctx, evs[i%len(evs)])
				if i++; i%512 == 0 {
					for _, s := range subs[1:] { // subs[0] is stuck
						for s.Len() > 0 {
							if _, err := s.Next(ctx); err != nil {
								b.Fatal(err)
							}
						}
					}
				}
			}
		})
	}
}

// staticLister answers with prebuilt lists.
type staticLister struct {
	sandboxes  []*runtimeapi.PodSandbox
	containers []*runtimeapi.Container
}

func (l *staticLister) ListPodSandbox(context.Context) ([]*runtimeapi.PodSandbox, error) {
	return l.sandboxes, nil
}

func (l *staticLister) ListContainers(context.Context) ([]*runtimeapi.Container, error) {
	return l.containers, nil
}

// loadState feeds n containers (4 per pod) with realistic statuses straight into the state, as if
// each had been created, started and had its status answered; exited of them have exited through fast
// facts (so they hold a base and an effective status).
func loadState(b *testing.B, p *PLEG, n, exited int) *staticLister {
	ctx := context.Background()
	l := &staticLister{}
	now := time.Unix(1_700_000_000, 0)
	for i := 0; i < n; i += 4 {
		sb := fmt.Sprintf("sandbox-%06d-%s", i, "9f3c2e1d0b8a7f6e5d4c3b2a19f8e7d6c5b4a3928171605f4e3d2c1b0a9f8e7")
		ss := sandboxStatus(sb, now)
		p.Observe(Observation{Source: SourceNRI, Kind: KindSandbox, ID: sb, SandboxID: sb, Phase: PhaseRunning, SandboxStatus: ss, SourceTime: now})
		l.sandboxes = append(l.sandboxes, &runtimeapi.PodSandbox{Id: sb, Metadata: ss.Metadata, State: ss.State, CreatedAt: ss.CreatedAt, Labels: ss.Labels, Annotations: ss.Annotations, RuntimeHandler: ss.RuntimeHandler})
		for j := i; j < i+4 && j < n; j++ {
			id := fmt.Sprintf("container-%06d-%s", j, "1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b")
			cs := containerStatus(id, sb, now)
			cs.State = runtimeapi.ContainerState_CONTAINER_RUNNING
			cs.StartedAt = now.UnixNano()
			p.Observe(Observation{Source: SourceNRI, Kind: KindContainer, ID: id, SandboxID: sb, Phase: PhaseRunning, ContainerStatus: cs, StartedAt: now, SourceTime: now})
			st := runtimeapi.ContainerState_CONTAINER_RUNNING
			if j < exited {
				p.Observe(taskExit(id, 1, now))
				st = runtimeapi.ContainerState_CONTAINER_EXITED
			}
			l.containers = append(l.containers, &runtimeapi.Container{Id: id, PodSandboxId: sb, Metadata: cs.Metadata, Image: cs.Image, ImageRef: cs.ImageRef, ImageId: cs.ImageId, State: st, CreatedAt: cs.CreatedAt, Labels: cs.Labels, Annotations: cs.Annotations})
		}
		p.drain(ctx)
	}
	return l
}

// BenchmarkRelist is a quiet relist (the diff and its bookkeeping; the lists are prebuilt) at 100,
// 1,000 and 10,000 containers.
func BenchmarkRelist(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("containers=%d", n), func(b *testing.B) {
			cri := newFakeCRI()
			p, err := New(Config{Status: cri, Clock: testutil.NewClock().Now, VerifyDelay: -1})
			if err != nil {
				b.Fatal(err)
			}
			l := loadState(b, p, n, n/4)
			p.cfg.Lister = l
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				res, err := p.Relist(ctx)
				if err != nil || res.Repairs != nil {
					b.Fatalf("relist: %+v %v", res, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n)*1000/1e6, "ms/1000ctr")
			if cri.statusCalls() != 0 {
				b.Fatalf("quiet relist made %d status calls", cri.statusCalls())
			}
		})
	}
}

// BenchmarkMemory measures the heap the state holds for 1,000 tracked containers (250 pods) with
// realistic statuses, a quarter of them exited through fast facts.
func BenchmarkMemory(b *testing.B) {
	const n = 1000
	var held float64
	for b.Loop() {
		before := heapInUse()
		p, err := New(Config{Status: newFakeCRI(), Clock: testutil.NewClock().Now, VerifyDelay: -1})
		if err != nil {
			b.Fatal(err)
		}
		loadState(b, p, n, n/4)
		after := heapInUse()
		runtime.KeepAlive(p)
		held = float64(after-before) / (1 << 20)
	}
	b.ReportMetric(held, "MiB/1000ctr")
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

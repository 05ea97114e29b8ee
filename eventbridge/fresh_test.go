package eventbridge

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// laggingRuntime says "running" for c1 (container) and s1 (sandbox) until its first behind answers
// were given, then "exited" / "not ready", like containerd's CRI while its exit handler runs.
type laggingRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	behind atomic.Int64 // answers still to give with the old state
	calls  atomic.Int64
}

func (r *laggingRuntime) containerState() runtimeapi.ContainerState {
	r.calls.Add(1)
	if r.behind.Add(-1) >= 0 {
		return runtimeapi.ContainerState_CONTAINER_RUNNING
	}
	return runtimeapi.ContainerState_CONTAINER_EXITED
}

func (r *laggingRuntime) ContainerStatus(context.Context, *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: "c1", State: r.containerState()}}, nil
}

func (r *laggingRuntime) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{
		{Id: "c0", State: runtimeapi.ContainerState_CONTAINER_RUNNING}, {Id: "c1", State: r.containerState()}}}, nil
}

func (r *laggingRuntime) PodSandboxStatus(context.Context, *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	return &runtimeapi.PodSandboxStatusResponse{
		Status:             &runtimeapi.PodSandboxStatus{Id: "s0", State: runtimeapi.PodSandboxState_SANDBOX_READY},
		ContainersStatuses: []*runtimeapi.ContainerStatus{{Id: "c1", State: r.containerState()}},
	}, nil
}

func (r *laggingRuntime) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	st := runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	if r.containerState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
		st = runtimeapi.PodSandboxState_SANDBOX_READY
	}
	return &runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{{Id: "s1", State: st}}}, nil
}

// aheadOf is a Freshness over a fixed set of ids.
type aheadOf map[string]bool

func (a aheadOf) AnyStoppedAhead() bool       { return len(a) > 0 }
func (a aheadOf) StoppedAhead(id string) bool { return a[id] }

type staleReads struct {
	mu    sync.Mutex
	reads []bool // caughtUp, per held read
}

func (m *staleReads) StaleRead(_ string, _ time.Duration, caughtUp bool) {
	m.mu.Lock()
	m.reads = append(m.reads, caughtUp)
	m.mu.Unlock()
}

type freshMetrics struct {
	NopMetrics
	*staleReads
}

// TestFreshReads: a status read whose answer shows running what the event stream reported stopped is
// asked again until the runtime catches up, within the bound; other reads go through once.
func TestFreshReads(t *testing.T) {
	dir := shortTempDir(t)
	rt := &laggingRuntime{}
	l, err := net.Listen("unix", filepath.Join(dir, "rt.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, rt)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	upstream, err := DialCRI("unix://" + filepath.Join(dir, "rt.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = upstream.Close() })

	start := func(t *testing.T, f Freshness, wait time.Duration) (runtimeapi.RuntimeServiceClient, *staleReads) {
		m := &staleReads{}
		s, err := NewServer("unix://"+filepath.Join(t.TempDir(), "cri.sock"), NewProxy(upstream, nil,
			WithMetrics(freshMetrics{staleReads: m}), WithFreshness(f, wait)))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			s.Stop(ctx)
			<-s.Err()
		})
		conn, err := DialCRI("unix://" + s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return runtimeapi.NewRuntimeServiceClient(conn), m
	}

	ctx := testCtx(t)
	t.Run("caught up", func(t *testing.T) {
		c, m := start(t, aheadOf{"c1": true, "s1": true}, 0)
		for _, read := range []struct {
			name string
			call func() (bool, error) // reports whether the answer shows the stop
		}{
			{"ContainerStatus", func() (bool, error) {
				r, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c1"})
				return r.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_EXITED, err
			}},
			{"ListContainers", func() (bool, error) {
				r, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
				return len(r.GetContainers()) == 2 && r.GetContainers()[1].GetState() == runtimeapi.ContainerState_CONTAINER_EXITED, err
			}},
			{"PodSandboxStatus", func() (bool, error) {
				r, err := c.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "s0"})
				return r.GetContainersStatuses()[0].GetState() == runtimeapi.ContainerState_CONTAINER_EXITED, err
			}},
			{"ListPodSandbox", func() (bool, error) {
				r, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
				return r.GetItems()[0].GetState() == runtimeapi.PodSandboxState_SANDBOX_NOTREADY, err
			}},
		} {
			rt.behind.Store(3)
			rt.calls.Store(0)
			fresh, err := read.call()
			if err != nil {
				t.Fatalf("%s: %v", read.name, err)
			}
			if !fresh || rt.calls.Load() != 4 {
				t.Errorf("%s: answer shows the stop %v after %d runtime calls, want true after 4", read.name, fresh, rt.calls.Load())
			}
		}
		if len(m.reads) != 4 || m.reads[0] != true {
			t.Errorf("stale reads reported: %v, want 4 caught up", m.reads)
		}
	})
	t.Run("nothing ahead", func(t *testing.T) {
		c, m := start(t, aheadOf{}, 0)
		rt.behind.Store(3)
		rt.calls.Store(0)
		r, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c1"})
		if err != nil {
			t.Fatal(err)
		}
		if r.GetStatus().GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING || rt.calls.Load() != 1 {
			t.Errorf("got %s after %d calls, want the runtime's RUNNING after 1", r.GetStatus().GetState(), rt.calls.Load())
		}
		if len(m.reads) != 0 {
			t.Errorf("stale reads reported: %v", m.reads)
		}
	})
	t.Run("another object ahead", func(t *testing.T) {
		c, _ := start(t, aheadOf{"c9": true}, 0)
		rt.behind.Store(3)
		rt.calls.Store(0)
		if _, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c1"}); err != nil {
			t.Fatal(err)
		}
		if rt.calls.Load() != 1 {
			t.Errorf("%d runtime calls, want 1", rt.calls.Load())
		}
	})
	t.Run("never catches up", func(t *testing.T) {
		c, m := start(t, aheadOf{"c1": true}, 30*time.Millisecond)
		rt.behind.Store(1 << 30)
		r, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "c1"})
		if err != nil {
			t.Fatal(err)
		}
		if r.GetStatus().GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("got %s, want the runtime's last answer", r.GetStatus().GetState())
		}
		if len(m.reads) != 1 || m.reads[0] {
			t.Errorf("stale reads reported: %v, want one that did not catch up", m.reads)
		}
	})
}

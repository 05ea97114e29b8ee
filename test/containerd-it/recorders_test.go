package containerdit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// eventRecorder records a CRI GetContainerEvents stream (containerd's own, or pleg-nri's).
type eventRecorder struct {
	mu     sync.Mutex
	events []*runtimeapi.ContainerEventResponse
	// err is the error that ended the stream, if it ended.
	err    error
	cancel context.CancelFunc
	done   chan struct{}
}

// openEvents opens a GetContainerEvents stream on conn, a client of the CRI endpoint at socket, until
// cancel; on an error it closes conn and fails tb.
func openEvents(tb testing.TB, conn *grpc.ClientConn, socket string, opts ...grpc.CallOption) (grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse], context.CancelFunc) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{}, opts...)
	if err != nil {
		cancel()
		conn.Close()
		tb.Fatalf("GetContainerEvents on %s: %v", socket, err)
	}
	return stream, cancel
}

// recordEvents subscribes to the event stream of the CRI endpoint at socket and records it until the
// test ends.
func recordEvents(t *testing.T, socket string) *eventRecorder {
	t.Helper()
	conn, err := harness.DialUnix(socket)
	if err != nil {
		t.Fatalf("dial %s: %v", socket, err)
	}
	stream, cancel := openEvents(t, conn, socket)
	r := &eventRecorder{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		defer conn.Close()
		for {
			ev, err := stream.Recv()
			if err != nil {
				if status.Code(err) != codes.Canceled {
					r.mu.Lock()
					r.err = err
					r.mu.Unlock()
				}
				return
			}
			r.mu.Lock()
			r.events = append(r.events, ev)
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// Events returns a copy of what was recorded so far.
func (r *eventRecorder) Events() []*runtimeapi.ContainerEventResponse {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*runtimeapi.ContainerEventResponse(nil), r.events...)
}

// Err returns the error that ended the stream, if any.
func (r *eventRecorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// wait waits until the recording holds an event of type typ for id and returns the first one.
func (r *eventRecorder) wait(t *testing.T, id string, typ runtimeapi.ContainerEventType) *runtimeapi.ContainerEventResponse {
	t.Helper()
	var found *runtimeapi.ContainerEventResponse
	err := harness.WaitFor(context.Background(), 10*time.Second, fmt.Sprintf("%s of %s", typ, short(id)), func() (bool, error) {
		for _, ev := range r.Events() {
			if ev.ContainerId == id && ev.ContainerEventType == typ {
				found = ev
				return true, nil
			}
		}
		return false, r.Err()
	})
	if err != nil {
		t.Fatalf("%v; recorded: %s", err, describeEvents(r.Events()))
	}
	return found
}

// forID returns the recorded event types for id, in order.
func (r *eventRecorder) forID(id string) []runtimeapi.ContainerEventType {
	var out []runtimeapi.ContainerEventType
	for _, ev := range r.Events() {
		if ev.ContainerId == id {
			out = append(out, ev.ContainerEventType)
		}
	}
	return out
}

func describeEvents(evs []*runtimeapi.ContainerEventResponse) string {
	var parts []string
	const most = 40
	if len(evs) > most {
		parts = append(parts, fmt.Sprintf("(%d events, the first %d:)", len(evs), most))
		evs = evs[:most]
	}
	for _, ev := range evs {
		parts = append(parts, fmt.Sprintf("%s:%s", short(ev.ContainerId), strings.TrimSuffix(strings.TrimPrefix(ev.ContainerEventType.String(), "CONTAINER_"), "_EVENT")))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// nriCall is one NRI callback as the recording plugin received it.
type nriCall struct {
	Event string
	// ID is the container id, or the sandbox id for pod events.
	ID       string
	State    api.ContainerState
	ExitCode int32
	Reason   string
	Pid      uint32
	At       time.Time
}

// nriRecorder is an NRI plugin that records every callback and changes nothing.
type nriRecorder struct {
	mu     sync.Mutex
	calls  []nriCall
	synced chan struct{}
	stub   stub.Stub
}

// recordNRI connects a recording plugin to containerd's NRI socket until the test ends.
func recordNRI(t *testing.T, name string) *nriRecorder {
	t.Helper()
	r := &nriRecorder{synced: make(chan struct{})}
	s, err := stub.New(r, stub.WithPluginName(name), stub.WithPluginIdx("50"), stub.WithSocketPath(env.NRISocket),
		stub.WithOnClose(func() {}))
	if err != nil {
		t.Fatalf("NRI stub: %v", err)
	}
	r.stub = s
	if err := s.Start(context.Background()); err != nil {
		t.Fatalf("NRI stub start: %v", err)
	}
	t.Cleanup(s.Stop)
	select {
	case <-r.synced:
	case <-time.After(10 * time.Second):
		t.Fatal("NRI plugin was not synchronized")
	}
	return r
}

func (r *nriRecorder) add(c nriCall) {
	c.At = time.Now()
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
}

func (r *nriRecorder) pod(event string, p *api.PodSandbox) {
	r.add(nriCall{Event: event, ID: p.GetId(), Pid: p.GetPid()})
}

func (r *nriRecorder) ctr(event string, c *api.Container) {
	r.add(nriCall{Event: event, ID: c.GetId(), State: c.GetState(), ExitCode: c.GetExitCode(), Reason: c.GetStatusReason(), Pid: c.GetPid()})
}

// Calls returns a copy of the recorded callbacks.
func (r *nriRecorder) Calls() []nriCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]nriCall(nil), r.calls...)
}

// forID returns the names of the callbacks recorded for id, in order.
func (r *nriRecorder) forID(id string) []string {
	var out []string
	for _, c := range r.Calls() {
		if c.ID == id {
			out = append(out, c.Event)
		}
	}
	return out
}

// wait waits for a callback named event for id and returns it.
func (r *nriRecorder) wait(t *testing.T, id, event string) nriCall {
	t.Helper()
	var found nriCall
	err := harness.WaitFor(context.Background(), 10*time.Second, "NRI "+event+" of "+short(id), func() (bool, error) {
		for _, c := range r.Calls() {
			if c.ID == id && c.Event == event {
				found = c
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v; recorded for it: %v", err, r.forID(id))
	}
	return found
}

func (r *nriRecorder) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	for _, p := range pods {
		r.pod("Synchronize", p)
	}
	for _, c := range ctrs {
		r.ctr("Synchronize", c)
	}
	select {
	case <-r.synced:
	default:
		close(r.synced)
	}
	return nil, nil
}

func (r *nriRecorder) RunPodSandbox(_ context.Context, p *api.PodSandbox) error {
	r.pod("RunPodSandbox", p)
	return nil
}

func (r *nriRecorder) StopPodSandbox(_ context.Context, p *api.PodSandbox) error {
	r.pod("StopPodSandbox", p)
	return nil
}

func (r *nriRecorder) RemovePodSandbox(_ context.Context, p *api.PodSandbox) error {
	r.pod("RemovePodSandbox", p)
	return nil
}

func (r *nriRecorder) CreateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	r.ctr("CreateContainer", c)
	return nil, nil, nil
}

func (r *nriRecorder) PostCreateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	r.ctr("PostCreateContainer", c)
	return nil
}

func (r *nriRecorder) StartContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	r.ctr("StartContainer", c)
	return nil
}

func (r *nriRecorder) PostStartContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	r.ctr("PostStartContainer", c)
	return nil
}

func (r *nriRecorder) UpdateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container, _ *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	r.ctr("UpdateContainer", c)
	return nil, nil
}

func (r *nriRecorder) PostUpdateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	r.ctr("PostUpdateContainer", c)
	return nil
}

func (r *nriRecorder) StopContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) ([]*api.ContainerUpdate, error) {
	r.ctr("StopContainer", c)
	return nil, nil
}

func (r *nriRecorder) RemoveContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	r.ctr("RemoveContainer", c)
	return nil
}

// Every callback interface the recorder means to implement; a slightly wrong signature would silently
// never be called.
var (
	_ stub.SynchronizeInterface         = (*nriRecorder)(nil)
	_ stub.RunPodInterface              = (*nriRecorder)(nil)
	_ stub.StopPodInterface             = (*nriRecorder)(nil)
	_ stub.RemovePodInterface           = (*nriRecorder)(nil)
	_ stub.CreateContainerInterface     = (*nriRecorder)(nil)
	_ stub.PostCreateContainerInterface = (*nriRecorder)(nil)
	_ stub.StartContainerInterface      = (*nriRecorder)(nil)
	_ stub.PostStartContainerInterface  = (*nriRecorder)(nil)
	_ stub.UpdateContainerInterface     = (*nriRecorder)(nil)
	_ stub.PostUpdateContainerInterface = (*nriRecorder)(nil)
	_ stub.StopContainerInterface       = (*nriRecorder)(nil)
	_ stub.RemoveContainerInterface     = (*nriRecorder)(nil)
)

package containerd

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/pkg/filters"
	"github.com/containerd/typeurl/v2"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/pleg"
)

// attempt scripts one call of the fake subscribe function.
type attempt struct {
	// fail, when set, makes the subscription fail at once.
	fail error
	// ev and end drive an established subscription: events to deliver and the error that ends it.
	ev  chan *events.Envelope
	end chan error
}

func established() attempt {
	return attempt{ev: make(chan *events.Envelope), end: make(chan error, 1)}
}

// fakeSubscriber plays attempts in order, as containerd's client would.
type fakeSubscriber struct {
	attempts chan attempt
}

func (f *fakeSubscriber) subscribe(ctx context.Context) (<-chan *events.Envelope, <-chan error) {
	errc := make(chan error, 1)
	var a attempt
	select {
	case a = <-f.attempts:
	case <-ctx.Done():
		close(errc)
		return nil, errc
	}
	if a.fail != nil {
		errc <- a.fail
		close(errc)
		return nil, errc
	}
	go func() {
		defer close(errc)
		select {
		case err := <-a.end:
			errc <- err
		case <-ctx.Done():
		}
	}()
	return a.ev, errc
}

// hookRecorder records hook calls in order.
type hookRecorder struct {
	mu    sync.Mutex
	calls []string
	ch    chan string
}

func newHookRecorder() *hookRecorder { return &hookRecorder{ch: make(chan string, 100)} }

func (h *hookRecorder) record(s string) {
	h.mu.Lock()
	h.calls = append(h.calls, s)
	h.mu.Unlock()
	h.ch <- s
}
func (h *hookRecorder) OnReconnect() { h.record("reconnect") }
func (h *hookRecorder) OnConnectionState(up bool) {
	if up {
		h.record("up")
	} else {
		h.record("down")
	}
}
func (h *hookRecorder) snapshot() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.calls...)
}

func exitEnvelope(t testing.TB, containerID, id string, code uint32) *events.Envelope {
	return &events.Envelope{
		Timestamp: time.Now(), Namespace: "k8s.io", Topic: TopicTaskExit,
		Event: mustAny(t, &apievents.TaskExit{ContainerID: containerID, ID: id, ExitStatus: code, ExitedAt: timestamppb.Now()}),
	}
}

func TestTaskEventsResubscribeBackoff(t *testing.T) {
	fs := &fakeSubscriber{attempts: make(chan attempt, 20)}
	hooks := newHookRecorder()
	observed := make(chan pleg.Observation, 10)
	clock := testutil.NewClock()

	var (
		delaysMu sync.Mutex
		delays   []time.Duration
	)
	te, err := NewTaskEvents(TaskEventsConfig{Observer: pleg.ObserverFunc(func(o pleg.Observation) { observed <- o }),
		Subscribe: fs.subscribe, Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	te.now = clock.Now
	te.sleep = func(ctx context.Context, d time.Duration) error {
		delaysMu.Lock()
		delays = append(delays, d)
		delaysMu.Unlock()
		return ctx.Err()
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- te.Run(ctx) }()

	// Two failures, then a subscription that delivers events.
	unavailable := status.Error(codes.Unavailable, "connection refused")
	fs.attempts <- attempt{fail: unavailable}
	fs.attempts <- attempt{fail: unavailable}
	a3 := established()
	fs.attempts <- a3
	testutil.Receive(t, hooks.ch, "reconnect", waitTimeout)

	a3.ev <- exitEnvelope(t, "c1", "exec1", 0) // exec exit: ignored
	a3.ev <- &events.Envelope{Topic: "/tasks/delete", Event: mustAny(t, &apievents.TaskDelete{ContainerID: "c1"})}
	a3.ev <- &events.Envelope{Topic: TopicTaskOOM} // no payload: decode error
	a3.ev <- exitEnvelope(t, "c1", "c1", 3)
	if o := recv(t, observed, "an observation"); o.ID != "c1" || o.Phase != pleg.PhaseExited || o.ExitCode != 3 {
		t.Fatalf("unexpected observation %+v", o)
	}
	// The subscription was up long enough: the backoff starts over.
	clock.Advance(2 * time.Second)
	a3.end <- errors.New("EOF")

	// Containerd is gone for a while: the delay doubles up to 5s.
	for range 7 {
		fs.attempts <- attempt{fail: unavailable}
	}
	a11 := established()
	fs.attempts <- a11
	testutil.Receive(t, hooks.ch, "reconnect", waitTimeout)
	// A subscription that fails at once does not reset the backoff.
	a11.end <- errors.New("EOF")
	a12 := established()
	fs.attempts <- a12
	testutil.Receive(t, hooks.ch, "reconnect", waitTimeout)

	cancel()
	if err := recv(t, done, "Run to return after cancel"); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}

	ms := time.Millisecond
	wantDelays := []time.Duration{
		100 * ms, 200 * ms, // before a3
		100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 5000 * ms, 5000 * ms, // before a11
		5000 * ms, // a11 was not stable
	}
	delaysMu.Lock()
	gotDelays := append([]time.Duration(nil), delays...)
	delaysMu.Unlock()
	if diff := cmp.Diff(wantDelays, gotDelays); diff != "" {
		t.Errorf("backoff delays (-want +got):\n%s", diff)
	}
	wantHooks := []string{"down", "up", "reconnect", "down", "up", "reconnect", "down", "up", "reconnect"}
	if diff := cmp.Diff(wantHooks, hooks.snapshot()); diff != "" {
		t.Errorf("hooks (-want +got):\n%s", diff)
	}
	wantStats := TaskEventStats{Observed: 1, ExecExits: 1, Ignored: 1, DecodeErrors: 1, Subscriptions: 3}
	if diff := cmp.Diff(wantStats, te.Stats()); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}

func TestTaskEventsWaitsForSocket(t *testing.T) {
	fs := &fakeSubscriber{attempts: make(chan attempt, 1)}
	te, err := NewTaskEvents(TaskEventsConfig{Observer: pleg.ObserverFunc(func(pleg.Observation) {}), Subscribe: fs.subscribe})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		checks int
		delays []time.Duration
	)
	te.socketExists = func() bool {
		mu.Lock()
		defer mu.Unlock()
		checks++
		return checks > 6
	}
	te.sleep = func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		delays = append(delays, d)
		mu.Unlock()
		return ctx.Err()
	}
	hooks := newHookRecorder()
	te.hooks = hooks
	fs.attempts <- established()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- te.Run(ctx) }()
	testutil.Receive(t, hooks.ch, "reconnect", waitTimeout)
	cancel()
	if err := recv(t, done, "Run to return"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if checks != 7 {
		t.Errorf("socket checked %d times, want 7", checks)
	}
	ms := time.Millisecond
	if diff := cmp.Diff([]time.Duration{100 * ms, 200 * ms, 400 * ms, 500 * ms, 500 * ms}, delays); diff != "" {
		t.Errorf("wait delays (-want +got):\n%s", diff)
	}
}

// watchMissingSocket returns a channel told, without blocking, each time te's Run looks for containerd's
// socket and does not find it.
func watchMissingSocket(te *TaskEvents) <-chan struct{} {
	missing := make(chan struct{}, 1)
	exists := te.socketExists
	te.socketExists = func() bool {
		ok := exists()
		if !ok {
			select {
			case missing <- struct{}{}:
			default:
			}
		}
		return ok
	}
	return missing
}

func TestTaskEventsCancelWhileWaitingForSocket(t *testing.T) {
	dir := testutil.ShortTempDir(t, "eb-")
	te, err := NewTaskEvents(TaskEventsConfig{Address: "unix://" + filepath.Join(dir, "missing.sock"), Observer: pleg.ObserverFunc(func(pleg.Observation) {})})
	if err != nil {
		t.Fatal(err)
	}
	defer te.Close()
	missing := watchMissingSocket(te)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- te.Run(ctx) }()
	recv(t, missing, "Run to find the socket missing")
	cancel()
	start := time.Now()
	if err := recv(t, done, "Run to return"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Run took %s to return after cancel", d)
	}
}

func TestNewTaskEventsErrors(t *testing.T) {
	obs := pleg.ObserverFunc(func(pleg.Observation) {})
	for _, tc := range []struct {
		name string
		cfg  TaskEventsConfig
	}{
		{"nil observer", TaskEventsConfig{Address: "/run/c.sock"}},
		{"empty address", TaskEventsConfig{Observer: obs}},
		{"tcp address", TaskEventsConfig{Address: "tcp://127.0.0.1:1", Observer: obs}},
		{"bad backoff", TaskEventsConfig{Address: "/run/c.sock", Observer: obs, MinBackoff: time.Second, MaxBackoff: time.Millisecond}},
		{"negative backoff", TaskEventsConfig{Address: "/run/c.sock", Observer: obs, MinBackoff: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if te, err := NewTaskEvents(tc.cfg); err == nil {
				_ = te.Close()
				t.Fatal("no error")
			}
		})
	}
}

// fakeEvents is a containerd events service that sends what it is given to every subscriber.
type fakeEvents struct {
	eventsapi.UnimplementedEventsServer
	filters chan []string
	envs    chan *types.Envelope
}

func (f *fakeEvents) Subscribe(req *eventsapi.SubscribeRequest, srv eventsapi.Events_SubscribeServer) error {
	f.filters <- req.Filters
	for {
		select {
		case env := <-f.envs:
			if err := srv.Send(env); err != nil {
				return err
			}
		case <-srv.Context().Done():
			return nil
		}
	}
}

func startFakeEvents(t *testing.T, path string, f *fakeEvents) *grpc.Server {
	t.Helper()
	return testutil.ServeGRPC(t, path, func(s *grpc.Server) { eventsapi.RegisterEventsServer(s, f) })
}

// TestTaskEventsContainerdClient runs the real containerd client against a fake events service that
// starts late, goes away and comes back.
func TestTaskEventsContainerdClient(t *testing.T) {
	path := filepath.Join(testutil.ShortTempDir(t, "eb-"), "containerd.sock")
	fe := &fakeEvents{filters: make(chan []string, 10), envs: make(chan *types.Envelope)}
	hooks := newHookRecorder()
	observed := make(chan pleg.Observation, 10)
	te, err := NewTaskEvents(TaskEventsConfig{Address: path, Observer: pleg.ObserverFunc(func(o pleg.Observation) { observed <- o }),
		Hooks: hooks, Namespace: "k8s.io", MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer te.Close()
	missing := watchMissingSocket(te)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- te.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()

	// The socket appears late: after Run found it missing and waits for it.
	recv(t, missing, "Run to find the socket missing")
	srv := startFakeEvents(t, path, fe)
	testutil.Receive(t, hooks.ch, "reconnect", waitTimeout)
	if diff := cmp.Diff([]string{taskEventsFilter("k8s.io")}, recv(t, fe.filters, "a subscription")); diff != "" {
		t.Errorf("filters (-want +got):\n%s", diff)
	}

	send := func(id string, code uint32) {
		t.Helper()
		a, err := typeurl.MarshalAnyToProto(&apievents.TaskExit{ContainerID: id, ID: id, ExitStatus: code, ExitedAt: timestamppb.Now()})
		if err != nil {
			t.Fatal(err)
		}
		fe.envs <- &types.Envelope{Timestamp: timestamppb.Now(), Namespace: "k8s.io", Topic: TopicTaskExit, Event: a}
		if o := recv(t, observed, "an observation of "+id); o.ID != id || o.ExitCode != int32(code) || o.Phase != pleg.PhaseExited {
			t.Fatalf("unexpected observation %+v", o)
		}
	}
	send("c1", 1)

	// containerd restarts.
	srv.Stop()
	testutil.Receive(t, hooks.ch, "down", waitTimeout)
	srv = startFakeEvents(t, path, fe)
	defer srv.Stop()
	testutil.Receive(t, hooks.ch, "reconnect", waitTimeout)
	<-fe.filters
	send("c2", 2)

	if got := te.Stats().Subscriptions; got != 2 {
		t.Errorf("subscriptions = %d, want 2", got)
	}
}

// TestTaskEventsFilter checks the filter with containerd's own filter parser and matcher.
func TestTaskEventsFilter(t *testing.T) {
	f, err := filters.ParseAll(taskEventsFilter("k8s.io"))
	if err != nil {
		t.Fatalf("containerd cannot parse the filter: %v", err)
	}
	for _, tc := range []struct {
		ns, topic string
		want      bool
	}{
		{"k8s.io", "/tasks/exit", true},
		{"k8s.io", "/tasks/oom", true},
		{"k8s.io", "/tasks/start", true},
		{"k8s.io", "/tasks/exec-started", true},
		{"k8s.io", "/containers/create", false},
		{"k8s.io", "/snapshot/tasks/x", false},
		{"default", "/tasks/exit", false},
		{"moby", "/tasks/exit", false},
	} {
		env := &events.Envelope{Namespace: tc.ns, Topic: tc.topic}
		if got := f.Match(env); got != tc.want {
			t.Errorf("filter matches %s %s = %v, want %v", tc.ns, tc.topic, got, tc.want)
		}
	}
}

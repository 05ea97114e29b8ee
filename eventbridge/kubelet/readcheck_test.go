package kubelet

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

func TestParseReadSource(t *testing.T) {
	for in, want := range map[string]ReadSource{"": ReadSourceRuntime, "runtime": ReadSourceRuntime, "state": ReadSourceState, "check": ReadSourceCheck} {
		if got, err := ParseReadSource(in); err != nil || got != want {
			t.Errorf("ParseReadSource(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseReadSource("cache"); err == nil {
		t.Error("ParseReadSource(cache): no error")
	}
	if _, err := NewProxy(ProxyConfig{ReadSource: ReadSourceState}); err == nil {
		t.Error("NewProxy with read source state and no State: no error")
	}
}

// fakeState is an EncodedStateReader whose answers the test sets: nil is "not current".
type fakeState struct {
	// mu guards everything below.
	mu         sync.Mutex
	containers map[string]*runtimeapi.ContainerStatusResponse
	list       *runtimeapi.ListContainersResponse
	sandbox    *runtimeapi.PodSandboxStatusResponse
	sandboxes  *runtimeapi.ListPodSandboxResponse
	// then, when set, is called after each answer (to change the state between two reads).
	then  func()
	reads atomic.Int32
}

var _ EncodedStateReader = (*fakeState)(nil)

// ReadState answers the read of method from the answers set, encoded deterministically as the core does.
func (s *fakeState) ReadState(ctx context.Context, method string, req []byte) ([]byte, bool) {
	var m proto.Message
	var ok bool
	switch method {
	case ContainerStatusMethod:
		var r runtimeapi.ContainerStatusRequest
		if proto.Unmarshal(req, &r) != nil {
			return nil, false
		}
		m, ok = s.ContainerStatus(ctx, &r)
	case ListContainersMethod:
		m, ok = s.ListContainers(ctx, nil)
	case PodSandboxStatusMethod:
		m, ok = s.PodSandboxStatus(ctx, nil)
	case ListPodSandboxMethod:
		m, ok = s.ListPodSandbox(ctx, nil)
	}
	if !ok {
		return nil, false
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	return b, err == nil
}

func answer[T any](s *fakeState, v *T) (*T, bool) {
	s.mu.Lock()
	then := s.then
	s.mu.Unlock()
	s.reads.Add(1)
	if then != nil {
		defer then()
	}
	return v, v != nil
}

func (s *fakeState) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, bool) {
	s.mu.Lock()
	v := s.containers[r.ContainerId]
	s.mu.Unlock()
	return answer(s, v)
}

func (s *fakeState) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, bool) {
	s.mu.Lock()
	v := s.list
	s.mu.Unlock()
	return answer(s, v)
}

func (s *fakeState) PodSandboxStatus(context.Context, *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, bool) {
	s.mu.Lock()
	v := s.sandbox
	s.mu.Unlock()
	return answer(s, v)
}

func (s *fakeState) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, bool) {
	s.mu.Lock()
	v := s.sandboxes
	s.mu.Unlock()
	return answer(s, v)
}

// readMetrics records the reads' results and the forwarded calls.
type readMetrics struct {
	recordingMetrics
	// mu guards results.
	mu      sync.Mutex
	results map[string][]string // by method
}

func (m *readMetrics) StateRead(method, result string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.results == nil {
		m.results = map[string][]string{}
	}
	m.results[method] = append(m.results[method], result)
}

func (m *readMetrics) of(method string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.results[method])
}

// heldRuntime is the fake runtime whose StartContainer waits until release is closed.
type heldRuntime struct {
	*fakeRuntime
	started chan string
	release chan struct{}
}

func (h *heldRuntime) StartContainer(_ context.Context, r *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	h.started <- r.ContainerId
	<-h.release
	return &runtimeapi.StartContainerResponse{}, nil
}

// readEnv is a fake runtime (with a held StartContainer) behind a proxy that answers reads from a
// fakeState.
type readEnv struct {
	rt      *heldRuntime
	state   *fakeState
	metrics *readMetrics
	client  runtimeapi.RuntimeServiceClient
}

func newReadEnv(t *testing.T, source ReadSource) *readEnv {
	t.Helper()
	dir := testutil.ShortTempDir(t, "rs-")
	e := &readEnv{rt: &heldRuntime{fakeRuntime: newFakeRuntime(3), started: make(chan string, 1), release: make(chan struct{})},
		state: &fakeState{containers: map[string]*runtimeapi.ContainerStatusResponse{}}, metrics: &readMetrics{}}
	path := filepath.Join(dir, "backend.sock")
	testutil.ServeGRPC(t, path, func(srv *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(srv, e.rt) },
		grpc.ForceServerCodec(deterministicCodec{}))
	srv, _ := startServer(t, filepath.Join(dir, "cri.sock"), ProxyConfig{Backend: connect(t, path), Metrics: e.metrics,
		ReadSource: source, State: e.state})
	e.client = runtimeapi.NewRuntimeServiceClient(connect(t, srv.Addr().String()))
	return e
}

// runtimeStatus is the fake runtime's ContainerStatus answer about its i-th container.
func (e *readEnv) runtimeStatus(t *testing.T, i int) *runtimeapi.ContainerStatusResponse {
	t.Helper()
	r, err := e.rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: e.rt.containers[i].Id})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (e *readEnv) id(i int) string { return e.rt.containers[i].Id }

// stateAnswer is a status that differs from the runtime's (its exit code), to tell whose answer came.
func stateAnswer(r *runtimeapi.ContainerStatusResponse) *runtimeapi.ContainerStatusResponse {
	c := proto.Clone(r).(*runtimeapi.ContainerStatusResponse)
	c.Status.ExitCode = 42
	return c
}

func TestReadSourceStateAnswersFromTheStateWhenCurrent(t *testing.T) {
	e := newReadEnv(t, ReadSourceState)
	ctx := testCtx(t)
	fromState := stateAnswer(e.runtimeStatus(t, 0))
	e.state.containers[e.id(0)] = fromState
	got, err := e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: e.id(0)})
	if err != nil || !proto.Equal(got, fromState) {
		t.Fatalf("ContainerStatus = %v, %v; want the state's answer", got, err)
	}
	// Not current: the runtime's answer.
	got, err = e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: e.id(1)})
	if err != nil || !proto.Equal(got, e.runtimeStatus(t, 1)) {
		t.Fatalf("ContainerStatus = %v, %v; want the runtime's answer", got, err)
	}
	// Unknown to the state: the runtime's NotFound, as it gave it.
	_, err = e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "nope"})
	if status.Code(err) != codes.NotFound || status.Convert(err).Message() != `an error occurred when try to find container "nope": not found` {
		t.Errorf("ContainerStatus of an unknown id: %v, want the runtime's NotFound", err)
	}
	if got, want := e.metrics.of(ContainerStatusMethod), []string{StateReadState, StateReadRuntime, StateReadRuntime}; !slices.Equal(got, want) {
		t.Errorf("results %v, want %v", got, want)
	}
	e.metrics.recordingMetrics.mu.Lock()
	forwarded := len(e.metrics.forwarded[ContainerStatusMethod])
	e.metrics.recordingMetrics.mu.Unlock()
	if forwarded != 2 {
		t.Errorf("%d ContainerStatus forwarded, want 2 (the state answered the first)", forwarded)
	}
}

func TestReadSourceStateForwardsWhileAMutationIsInFlight(t *testing.T) {
	e := newReadEnv(t, ReadSourceState)
	ctx := testCtx(t)
	for i := range 2 {
		e.state.containers[e.id(i)] = stateAnswer(e.runtimeStatus(t, i))
	}
	e.state.list = &runtimeapi.ListContainersResponse{}
	startDone := make(chan error, 1)
	go func() {
		_, err := e.client.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: e.id(0)})
		startDone <- err
	}()
	recv(t, e.rt.started, "StartContainer at the runtime")

	// While the start of c0 is in flight: c0's status and the lists are the runtime's, c1's the state's.
	if got, _ := e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: e.id(0)}); !proto.Equal(got, e.runtimeStatus(t, 0)) {
		t.Errorf("ContainerStatus of the container being started = %v, want the runtime's", got)
	}
	if got, _ := e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: e.id(1)}); !proto.Equal(got, e.state.containers[e.id(1)]) {
		t.Errorf("ContainerStatus of another container = %v, want the state's", got)
	}
	if got, _ := e.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); len(got.GetContainers()) != 3 {
		t.Errorf("ListContainers during a start = %v, want the runtime's 3 containers", got)
	}
	close(e.rt.release)
	if err := recv(t, startDone, "StartContainer's answer"); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: e.id(0)}); !proto.Equal(got, e.state.containers[e.id(0)]) {
		t.Errorf("ContainerStatus after the start = %v, want the state's", got)
	}
	if got, _ := e.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); len(got.GetContainers()) != 0 {
		t.Errorf("ListContainers after the start = %v, want the state's (empty)", got)
	}
}

func TestReadSourceCheckComparesAndCountsDifferences(t *testing.T) {
	e := newReadEnv(t, ReadSourceCheck)
	ctx := testCtx(t)
	e.state.containers[e.id(0)] = e.runtimeStatus(t, 0)              // equal
	e.state.containers[e.id(1)] = stateAnswer(e.runtimeStatus(t, 1)) // differs
	e.state.containers["gone"] = e.runtimeStatus(t, 2)               // the runtime says NotFound
	e.state.list = &runtimeapi.ListContainersResponse{Containers: slices.Clone(e.rt.containers)}
	slices.Reverse(e.state.list.Containers) // another order: equal

	for i := range 2 {
		got, err := e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: e.id(i)})
		if err != nil || !proto.Equal(got, e.runtimeStatus(t, i)) {
			t.Errorf("ContainerStatus(%d) in check mode = %v, %v; want the runtime's answer", i, got, err)
		}
	}
	if _, err := e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "gone"}); status.Code(err) != codes.NotFound {
		t.Errorf("ContainerStatus(gone) in check mode: %v, want the runtime's NotFound", err)
	}
	if _, err := e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: e.id(2)}); err != nil {
		t.Error(err)
	}
	// The state's answer changes between the two reads of one check: not compared.
	e.state.mu.Lock()
	e.state.then = func() {
		e.state.mu.Lock()
		e.state.containers[e.id(0)] = stateAnswer(e.state.containers[e.id(0)])
		e.state.then = nil
		e.state.mu.Unlock()
	}
	e.state.mu.Unlock()
	if _, err := e.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: e.id(0)}); err != nil {
		t.Error(err)
	}
	want := []string{StateReadEqual, StateReadDiffer, StateReadDiffer, StateReadRuntime, StateReadInconclusive}
	if got := e.metrics.of(ContainerStatusMethod); !slices.Equal(got, want) {
		t.Errorf("ContainerStatus results %v, want %v", got, want)
	}
	if _, err := e.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := e.metrics.of(ListContainersMethod); !slices.Equal(got, []string{StateReadEqual}) {
		t.Errorf("ListContainers results %v, want equal (the lists' order does not count)", got)
	}
}

func TestCompareAnswersNamesTheDifferingFields(t *testing.T) {
	enc := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	rt := newFakeRuntime(2)
	a := &runtimeapi.ListContainersResponse{Containers: rt.containers}
	b := &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{proto.Clone(rt.containers[1]).(*runtimeapi.Container)}}
	b.Containers[0].State = runtimeapi.ContainerState_CONTAINER_EXITED
	b.Containers[0].Metadata.Attempt = 2
	diffs, err := compareAnswers(ListContainersMethod, enc(a), enc(b))
	want := []string{
		"containers[" + rt.containers[0].Id + "]: only in the state's",
		"containers[" + rt.containers[1].Id + "].metadata.attempt",
		"containers[" + rt.containers[1].Id + "].state",
	}
	if err != nil || !slices.Equal(diffs, want) {
		t.Errorf("compareAnswers = %q, %v; want %q", diffs, err, want)
	}
	st := &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: "s1"}, Info: map[string]string{"info": "{}"}}
	st2 := &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: "s1"}}
	if diffs, err := compareAnswers(PodSandboxStatusMethod, enc(st), enc(st2)); err != nil || !slices.Equal(diffs, []string{"info"}) {
		t.Errorf("compareAnswers(sandbox status) = %q, %v; want [info]", diffs, err)
	}
	if _, err := compareAnswers("/runtime.v1.RuntimeService/Version", nil, nil); err == nil {
		t.Error("compareAnswers of a method that is no read: no error")
	}
}

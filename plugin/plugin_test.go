package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/pleg"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The stub TestStuckRegistration abandons keeps these goroutines (see (*Plugin).unstick): Start,
		// its ttrpc server and its ttrpc client's close handler, both blocked behind Start.
		goleak.IgnoreAnyFunction("github.com/containerd/nri/pkg/stub.(*stub).Start"),
		goleak.IgnoreAnyFunction("github.com/containerd/nri/pkg/stub.(*stub).Start.func6"),
		goleak.IgnoreAnyFunction("github.com/containerd/nri/pkg/stub.(*stub).connClosed"),
	)
}

const waitFor = 10 * time.Second

// recorder is an Observer that keeps every observation.
type recorder struct {
	mu  sync.Mutex
	obs []pleg.Observation
}

func (r *recorder) Observe(o pleg.Observation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.obs = append(r.obs, o)
}

// take returns the observations recorded since the last take.
func (r *recorder) take() []pleg.Observation {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.obs
	r.obs = nil
	return out
}

// recMetrics is a Metrics that keeps the hook durations and counts.
type recMetrics struct {
	mu          sync.Mutex
	durations   map[Callback][]time.Duration
	obs         map[Callback]int
	states      []bool
	synced      []bool
	reconnected int
}

func newRecMetrics() *recMetrics {
	return &recMetrics{durations: map[Callback][]time.Duration{}, obs: map[Callback]int{}}
}

func (m *recMetrics) HookDuration(cb Callback, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.durations[cb] = append(m.durations[cb], d)
}

func (m *recMetrics) Observations(cb Callback, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.obs[cb] += n
}

func (m *recMetrics) ConnectionState(up bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.states = append(m.states, up)
}

func (m *recMetrics) Synchronized(done bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.synced = append(m.synced, done)
}

// waitSynchronized waits until the Synchronized states recorded are want: they follow OnSynchronized,
// once the Synchronize handler has returned.
func (m *recMetrics) waitSynchronized(t testing.TB, want ...bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		m.mu.Lock()
		got := slices.Clone(m.synced)
		m.mu.Unlock()
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Synchronized states %v, want %v", got, want)
		}
		time.Sleep(time.Millisecond)
	}
}

func (m *recMetrics) Reconnected() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reconnected++
}

// fakeRuntime is NRI's real runtime side (the adaptation containerd embeds) behind a unix socket proxy, so that
// stopping it closes the plugin's connection the way a runtime restart does (Adaptation.Stop leaves external
// plugins connected).
type fakeRuntime struct {
	t     testing.TB
	dir   string
	inner string // the adaptation's socket
	Outer string // the socket plugins dial

	mu    sync.Mutex // guards the fields below
	pods  []*api.PodSandbox
	ctrs  []*api.Container
	nri   *adaptation.Adaptation
	ln    net.Listener
	conns []net.Conn
	wg    sync.WaitGroup
	// latency is the round trip of each request to a plugin, as the adaptation measures it.
	latency []time.Duration
}

// The adaptation's metrics: only the latency is kept.
func (r *fakeRuntime) RecordPluginInvocation(string, string, error) {}
func (r *fakeRuntime) RecordPluginAdjustments(string, string, *api.ContainerAdjustment, int, int) {
}
func (r *fakeRuntime) UpdatePluginCount(int) {}
func (r *fakeRuntime) RecordPluginLatency(_, _ string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.latency = append(r.latency, d)
}

func newFakeRuntime(t testing.TB) *fakeRuntime {
	dir := t.TempDir()
	r := &fakeRuntime{t: t, dir: dir, inner: filepath.Join(dir, "nri-inner.sock"), Outer: filepath.Join(dir, "run", "nri.sock")}
	t.Cleanup(r.Stop)
	return r
}

// SetState sets what the next Synchronize reports.
func (r *fakeRuntime) SetState(pods []*api.PodSandbox, ctrs []*api.Container) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pods, r.ctrs = pods, ctrs
}

func (r *fakeRuntime) Start() {
	r.t.Helper()
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		r.mu.Lock()
		pods, ctrs := r.pods, r.ctrs
		r.mu.Unlock()
		_, err := cb(ctx, pods, ctrs)
		return err
	}
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	nri, err := adaptation.New("fake-runtime", "v0.0.1", sync, update,
		adaptation.WithPluginPath(filepath.Join(r.dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(r.dir, "conf.d")),
		adaptation.WithSocketPath(r.inner),
		adaptation.WithMetrics(r))
	if err != nil {
		r.t.Fatalf("adaptation.New: %v", err)
	}
	if err := nri.Start(); err != nil {
		r.t.Fatalf("adaptation.Start: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(r.Outer), 0o750); err != nil {
		r.t.Fatal(err)
	}
	ln, err := net.Listen("unix", r.Outer)
	if err != nil {
		r.t.Fatalf("listen: %v", err)
	}
	r.mu.Lock()
	r.nri, r.ln = nri, ln
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("unix", r.inner)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, c, up)
			r.mu.Unlock()
			r.wg.Add(2)
			go func() { defer r.wg.Done(); io.Copy(up, c); up.Close(); c.Close() }()
			go func() { defer r.wg.Done(); io.Copy(c, up); up.Close(); c.Close() }()
		}
	}()
}

// Stop closes the socket and every plugin connection, and stops the adaptation.
func (r *fakeRuntime) Stop() {
	r.mu.Lock()
	nri, ln, conns := r.nri, r.ln, r.conns
	r.nri, r.ln, r.conns = nil, nil, nil
	r.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	for _, c := range conns {
		c.Close()
	}
	r.wg.Wait()
	if nri != nil {
		nri.Stop()
	}
}

// NRI returns the running adaptation.
func (r *fakeRuntime) NRI() *adaptation.Adaptation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nri
}

// harness runs a Plugin against a fakeRuntime.
type harness struct {
	t       testing.TB
	rec     *recorder
	metrics *recMetrics
	synced  chan struct{}
	state   chan bool
	plugin  *Plugin
	done    chan error
	cancel  context.CancelFunc
}

func startPlugin(t testing.TB, socket string, mod func(*Plugin)) *harness {
	t.Helper()
	h := &harness{t: t, rec: &recorder{}, metrics: newRecMetrics(), synced: make(chan struct{}, 10),
		state: make(chan bool, 10), done: make(chan error, 1)}
	p, err := New(Config{SocketPath: socket, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Observer: h.rec,
		OnSynchronized:    func() { h.synced <- struct{}{} },
		OnConnectionState: func(up bool) { h.state <- up },
		Metrics:           h.metrics})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if mod != nil {
		mod(p)
	}
	h.plugin = p
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- p.Run(ctx) }()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run returned %v", err)
		}
		h.done <- nil // for a second stop
	case <-time.After(waitFor):
		h.t.Error("Run did not return after cancel")
	}
}

func (h *harness) waitSynced() {
	h.t.Helper()
	select {
	case <-h.synced:
	case <-time.After(waitFor):
		h.t.Fatal("no Synchronize")
	}
}

func (h *harness) waitState(want bool) {
	h.t.Helper()
	select {
	case got := <-h.state:
		if got != want {
			h.t.Fatalf("connection state %v, want %v", got, want)
		}
	case <-time.After(waitFor):
		h.t.Fatalf("no connection state %v", want)
	}
}

// diffObs compares observations, checking that SourceTime is set and ignoring it.
func diffObs(t *testing.T, want, got []pleg.Observation) {
	t.Helper()
	for i, o := range got {
		if o.SourceTime.IsZero() {
			t.Errorf("observation %d (%s) has no SourceTime", i, o)
		}
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(pleg.Observation{}, "SourceTime"), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("observations (-want +got):\n%s", diff)
	}
}

func sandboxObs(src pleg.Source, id string, ph pleg.Phase) pleg.Observation {
	return pleg.Observation{Source: src, Kind: pleg.KindSandbox, ID: id, SandboxID: id, Phase: ph}
}

func TestLifecycleAndReconnect(t *testing.T) {
	rt := newFakeRuntime(t)
	existingPod := &api.PodSandbox{Id: "sb0", Name: "old", Uid: "u0", Namespace: "ns", Pid: 7}
	existingCtr := &api.Container{Id: "c0", PodSandboxId: "sb0", Name: "app", State: api.ContainerState_CONTAINER_RUNNING,
		CreatedAt: created, StartedAt: started, Pid: 8}
	rt.SetState([]*api.PodSandbox{existingPod}, []*api.Container{existingCtr})
	rt.Start()

	h := startPlugin(t, rt.Outer, nil)
	h.waitState(true)
	h.waitSynced()
	h.metrics.waitSynchronized(t, true)
	diffObs(t, []pleg.Observation{
		sandboxObs(pleg.SourceNRISync, "sb0", pleg.PhaseRunning),
		{Source: pleg.SourceNRISync, Kind: pleg.KindContainer, ID: "c0", SandboxID: "sb0", Phase: pleg.PhaseRunning,
			CreatedAt: time.Unix(0, created), StartedAt: time.Unix(0, started)},
	}, h.rec.take())

	// A pod and a container through their lifecycle, in containerd's order.
	ctx := context.Background()
	nri := rt.NRI()
	pod := &api.PodSandbox{Id: "sb1", Name: "web", Uid: "u1", Namespace: "ns", Pid: 100, Ips: []string{"10.0.0.2"}}
	ctr := &api.Container{Id: "c1", PodSandboxId: "sb1", Name: "app", State: api.ContainerState_CONTAINER_CREATED,
		Labels: map[string]string{"io.kubernetes.container.name": "app"}, Args: []string{"sleep", "inf"}}
	snapshot := func(mod func(*api.Container)) *api.Container {
		c := proto.Clone(ctr).(*api.Container)
		mod(c)
		return c
	}
	createdC := snapshot(func(c *api.Container) { c.CreatedAt = created })
	runningC := snapshot(func(c *api.Container) {
		c.State, c.CreatedAt, c.StartedAt, c.Pid = api.ContainerState_CONTAINER_RUNNING, created, started, 101
	})
	exitedC := snapshot(func(c *api.Container) {
		c.State, c.CreatedAt, c.StartedAt, c.FinishedAt, c.ExitCode = api.ContainerState_CONTAINER_STOPPED, created, started, finished, 137
		c.StatusReason = "OOMKilled"
	})

	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: runtime got error %v", what, err)
		}
	}
	// As containerd does, hold plugin synchronization off while a request is relayed: the adaptation adds a
	// plugin to the ones it calls only once its Synchronize is over.
	b := nri.BlockPluginSync()
	defer b.Unblock()
	must("RunPodSandbox", nri.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod}))
	crsp, err := nri.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: proto.Clone(ctr).(*api.Container)})
	must("CreateContainer", err)
	// What the runtime gets must be what it gets with no plugin at all.
	bare := newFakeRuntime(t)
	bare.Start()
	brsp, err := bare.NRI().CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: proto.Clone(ctr).(*api.Container)})
	must("CreateContainer without plugins", err)
	if !proto.Equal(crsp.GetAdjust(), brsp.GetAdjust()) {
		t.Errorf("CreateContainer adjustment %v, want %v (none from the plugin)", crsp.GetAdjust(), brsp.GetAdjust())
	}
	if len(crsp.GetUpdate()) != 0 || len(crsp.GetEvict()) != 0 {
		t.Errorf("CreateContainer updates %v, evictions %v, want none", crsp.GetUpdate(), crsp.GetEvict())
	}
	must("PostCreateContainer", nri.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: pod, Container: createdC}))
	must("StartContainer", nri.StartContainer(ctx, &api.StartContainerRequest{Pod: pod, Container: createdC}))
	must("PostStartContainer", nri.PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: pod, Container: runningC}))
	// UpdateContainerResources: the plugin learns it from PostUpdateContainer (issue 11).
	must("PostUpdateContainer", nri.PostUpdateContainer(ctx, &api.PostUpdateContainerRequest{Pod: pod, Container: runningC}))
	srsp, err := nri.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: exitedC})
	must("StopContainer", err)
	if len(srsp.GetUpdate()) != 0 {
		t.Errorf("StopContainer updates %v, want none", srsp.GetUpdate())
	}
	must("RemoveContainer", nri.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: exitedC}))
	must("StopPodSandbox", nri.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod}))
	must("RemovePodSandbox", nri.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod}))
	// Not subscribed: must pass through untouched.
	ursp, err := nri.UpdateContainer(ctx, &api.UpdateContainerRequest{Pod: pod, Container: runningC, LinuxResources: &api.LinuxResources{}})
	must("UpdateContainer", err)
	for _, u := range ursp.GetUpdate() {
		if u != nil && u.GetContainerId() != "c1" {
			t.Errorf("UpdateContainer update %v from the plugin", u)
		}
	}

	cObs := func(ph pleg.Phase, mod ...func(*pleg.Observation)) pleg.Observation {
		o := pleg.Observation{Source: pleg.SourceNRI, Kind: pleg.KindContainer, ID: "c1", SandboxID: "sb1", Phase: ph,
			CreatedAt: time.Unix(0, created)}
		for _, m := range mod {
			m(&o)
		}
		return o
	}
	withStart := func(o *pleg.Observation) { o.StartedAt = time.Unix(0, started) }
	diffObs(t, []pleg.Observation{
		sandboxObs(pleg.SourceNRI, "sb1", pleg.PhaseRunning),
		cObs(pleg.PhaseCreated),
		cObs(pleg.PhaseRunning, withStart),
		cObs(pleg.PhaseNone, withStart, func(o *pleg.Observation) { o.StatusChanged = true }),
		cObs(pleg.PhaseExited, withStart, func(o *pleg.Observation) {
			o.FinishedAt, o.ExitCode, o.HasExitCode = time.Unix(0, finished), 137, true
			o.Reason, o.OOMKilled = "OOMKilled", true
		}),
		cObs(pleg.PhaseRemoved, withStart),
		sandboxObs(pleg.SourceNRI, "sb1", pleg.PhaseExited),
		sandboxObs(pleg.SourceNRI, "sb1", pleg.PhaseRemoved),
	}, h.rec.take())

	// containerd restarts: the plugin reconnects by itself and synchronizes again.
	b.Unblock()
	rt.Stop()
	h.waitState(false)
	h.metrics.waitSynchronized(t, true, false) // before the connection's state went down
	rt.SetState([]*api.PodSandbox{{Id: "sb2", Pid: 9}, {Id: "sb3"}}, []*api.Container{
		{Id: "c2", PodSandboxId: "sb2", State: api.ContainerState_CONTAINER_CREATED, CreatedAt: created},
	})
	rt.Start()
	h.waitState(true)
	h.waitSynced()
	h.metrics.waitSynchronized(t, true, false, true)
	diffObs(t, []pleg.Observation{
		sandboxObs(pleg.SourceNRISync, "sb2", pleg.PhaseRunning),
		sandboxObs(pleg.SourceNRISync, "sb3", pleg.PhaseNone),
		{Source: pleg.SourceNRISync, Kind: pleg.KindContainer, ID: "c2", SandboxID: "sb2", Phase: pleg.PhaseCreated,
			CreatedAt: time.Unix(0, created)},
	}, h.rec.take())

	// Still served after the reconnect.
	b = rt.NRI().BlockPluginSync()
	must("RunPodSandbox", rt.NRI().RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: &api.PodSandbox{Id: "sb4"}}))
	b.Unblock()
	diffObs(t, []pleg.Observation{sandboxObs(pleg.SourceNRI, "sb4", pleg.PhaseRunning)}, h.rec.take())

	h.stop()
	h.metrics.mu.Lock()
	defer h.metrics.mu.Unlock()
	if h.metrics.reconnected != 1 {
		t.Errorf("reconnects = %d, want 1", h.metrics.reconnected)
	}
	if want := []bool{true, false, true, false}; !slices.Equal(h.metrics.states, want) {
		t.Errorf("connection states %v, want %v", h.metrics.states, want)
	}
	if want := []bool{true, false, true, false}; !slices.Equal(h.metrics.synced, want) {
		t.Errorf("Synchronized states %v, want %v", h.metrics.synced, want)
	}
	wantObs := map[Callback]int{CallbackSynchronize: 5, CallbackRunPodSandbox: 2, CallbackStopPodSandbox: 1,
		CallbackRemovePodSandbox: 1, CallbackPostCreateContainer: 1, CallbackPostStartContainer: 1,
		CallbackStopContainer: 1, CallbackRemoveContainer: 1, CallbackPostUpdateContainer: 1}
	if diff := cmp.Diff(wantObs, h.metrics.obs); diff != "" {
		t.Errorf("observation counts (-want +got):\n%s", diff)
	}
	var all []time.Duration
	for cb, ds := range h.metrics.durations {
		if cb != CallbackSynchronize {
			all = append(all, ds...)
		}
	}
	logPercentiles(t, "hook duration over the adaptation test", all)
}

// logPercentiles logs p50 and p99 of ds.
func logPercentiles(t *testing.T, what string, ds []time.Duration) {
	t.Helper()
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	p := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	t.Logf("%s: n=%d p50=%s p99=%s max=%s", what, len(ds), p(0.50), p(0.99), ds[len(ds)-1])
}

func TestSocketAbsentAtStart(t *testing.T) {
	rt := newFakeRuntime(t)
	h := startPlugin(t, rt.Outer, nil)
	select {
	case <-h.synced:
		t.Fatal("synchronized without a runtime")
	case up := <-h.state:
		t.Fatalf("connection state %v without a runtime", up)
	case <-time.After(300 * time.Millisecond):
	}
	rt.Start()
	h.waitState(true)
	h.waitSynced()
}

// preconnectedFD returns the runtime's end of a pre-connected socket: a connection accepted on rt's
// socket, as a bare fd, as a runtime passes it to a plugin it launches.
func preconnectedFD(t *testing.T, rt *fakeRuntime) int {
	t.Helper()
	c, err := net.Dial("unix", rt.Outer)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f, err := c.(*net.UnixConn).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

func TestPreconnectedSocket(t *testing.T) {
	rt := newFakeRuntime(t)
	rt.Start()

	fd := preconnectedFD(t, rt)
	// What a runtime sets for a plugin it launches.
	t.Setenv(api.PluginSocketEnvVar, strconv.Itoa(fd))
	t.Setenv(api.PluginNameEnvVar, "pleg-nri")
	t.Setenv(api.PluginIdxEnvVar, "20")

	// SocketPath is wrong on purpose: the plugin must use the fd.
	h := startPlugin(t, filepath.Join(t.TempDir(), "absent.sock"), nil)
	h.waitState(true)
	h.waitSynced()

	if v, ok := os.LookupEnv(api.PluginSocketEnvVar); ok {
		t.Errorf("%s=%q left in the environment", api.PluginSocketEnvVar, v)
	}

	// Launched with name and index in the environment, the plugin also dials.
	h.stop()
	h2 := startPlugin(t, rt.Outer, nil)
	h2.waitState(true)
	h2.waitSynced()
	rt.Stop()
	h2.waitState(false)
	rt.Start()
	h2.waitState(true)
	h2.waitSynced()
}

func TestPreconnectedFallsBackToSocket(t *testing.T) {
	rt := newFakeRuntime(t)
	rt.Start()
	fd := preconnectedFD(t, rt)
	t.Setenv(api.PluginSocketEnvVar, strconv.Itoa(fd))
	h := startPlugin(t, rt.Outer, nil)
	h.waitState(true)
	h.waitSynced()
	rt.Stop()
	h.waitState(false)
	rt.Start()
	h.waitState(true)
	h.waitSynced()
}

// TestConfigure: a configuration the check refuses is refused to the runtime (the error it logs before it
// stops the plugin), an accepted one is answered with no error, and an empty one is not checked.
func TestConfigure(t *testing.T) {
	var got []string
	p, err := New(Config{Observer: &recorder{}, Configure: func(_ context.Context, b []byte) error {
		got = append(got, string(b))
		if string(b) == "bad" {
			return errors.New("unknown key \"bad\"")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ cfg, err string }{
		{"relist_period: 5s", ""},
		{"bad", `invalid NRI plugin configuration: unknown key "bad"`},
		{"", ""},
	} {
		mask, err := p.Configure(context.Background(), tc.cfg, "containerd", "v2.4.2")
		if gotErr := fmt.Sprint(err); mask != 0 || (tc.err == "" && err != nil) || (tc.err != "" && gotErr != tc.err) {
			t.Errorf("Configure(%q) = %v, %v; want 0, %q", tc.cfg, mask, err, tc.err)
		}
	}
	if want := []string{"relist_period: 5s", "bad"}; !slices.Equal(got, want) {
		t.Errorf("configure got %q, want %q", got, want)
	}
}

// TestConfigureWithinRequestTimeout (issue 26): a Configure handler that waits (the daemon's, for its
// core) gets a context that ends configureMargin before the runtime's deadline, or before NRI's default
// request timeout when the runtime set none, so that the plugin answers before the runtime drops it.
func TestConfigureWithinRequestTimeout(t *testing.T) {
	var deadlines []time.Time
	p, err := New(Config{Observer: &recorder{}, Configure: func(ctx context.Context, _ []byte) error {
		dl, _ := ctx.Deadline()
		deadlines = append(deadlines, dl)
		<-ctx.Done() // waits for a core that does not come
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	runtimeDeadline := time.Now().Add(300 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), runtimeDeadline)
	defer cancel()
	if _, err := p.Configure(ctx, "relist-period: 5s", "containerd", "v2.4.2"); err != nil {
		t.Fatal(err)
	}
	if want := runtimeDeadline.Add(-configureMargin); len(deadlines) != 1 || !deadlines[0].Equal(want) {
		t.Errorf("the handler's deadline %v, want %v (the runtime's less %s)", deadlines, want, configureMargin)
	}
	now := time.Unix(1000, 0)
	noDeadline, cancel := configureContext(context.Background(), now)
	defer cancel()
	if dl, _ := noDeadline.Deadline(); !dl.Equal(now.Add(api.DefaultPluginRequestTimeout - configureMargin)) {
		t.Errorf("without a runtime deadline: %v, want NRI's default request timeout less %s from now", dl, configureMargin)
	}
}

func TestNewValidates(t *testing.T) {
	for _, o := range []Config{
		{PluginName: "bad name"},
		{PluginIdx: "1"},
		{MinBackoff: time.Second, MaxBackoff: time.Millisecond},
	} {
		o.Observer = &recorder{}
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) succeeded", o)
		}
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New with a nil observer succeeded")
	}
	p, err := New(Config{Observer: &recorder{}})
	if err != nil {
		t.Fatal(err)
	}
	got := p.cfg
	if got.Metrics != (NopMetrics{}) || got.Clock == nil {
		t.Errorf("default metrics %v, clock set %v; want NopMetrics, true", got.Metrics, got.Clock != nil)
	}
	got.Observer, got.Metrics, got.Clock = nil, nil, nil
	want := Config{PluginName: "pleg-nri", PluginIdx: "10", SocketPath: "/var/run/nri/nri.sock",
		MinBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
}

func TestRunTwice(t *testing.T) {
	h := startPlugin(t, filepath.Join(t.TempDir(), "absent.sock"), nil)
	testutil.Eventually(t, waitFor, "the first Run to start", h.plugin.running.Load)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.plugin.Run(ctx); err == nil {
		t.Error("second Run succeeded")
	}
}

// panicker is an Observer that panics.
type panicker struct{}

func (panicker) Observe(pleg.Observation) { panic("observer bug") }

func TestHookSurvivesObserverPanic(t *testing.T) {
	p, err := New(Config{Observer: panicker{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.RunPodSandbox(context.Background(), &api.PodSandbox{Id: "sb"}); err != nil {
		t.Errorf("RunPodSandbox = %v", err)
	}
	if u, err := p.StopContainer(context.Background(), nil, &api.Container{Id: "c", State: api.ContainerState_CONTAINER_STOPPED}); u != nil || err != nil {
		t.Errorf("StopContainer = %v, %v", u, err)
	}
}

// TestRunPollsMissingSocket: however long the NRI socket stays missing, Run dials it again at least
// every socketPoll (containerd opens it once its CRI state is recovered: the resynchronization follows
// a restarted containerd within that time), while the backoff itself still grows.
func TestRunPollsMissingSocket(t *testing.T) {
	p, err := New(Config{SocketPath: filepath.Join(t.TempDir(), "absent.sock"), Observer: &recorder{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var delays []time.Duration
	p.wait = func(_ context.Context, d time.Duration) {
		delays = append(delays, d)
		if len(delays) == 8 {
			cancel()
		}
	}
	if err := p.Run(ctx); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{100, 200, 250, 250, 250, 250, 250, 250}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if !slices.Equal(delays, want) {
		t.Errorf("delays between dials of a missing socket %v, want %v", delays, want)
	}
}

// TestHold: with Hold (a pre-registered plugin, before its core), the callbacks wait for Release; the
// first configuration accepted is handed on Configured and its answer waits for Release, or for the
// runtime's deadline; a later one is only checked.
func TestHold(t *testing.T) {
	synctest.Test(t, testHold)
}

func testHold(t *testing.T) {
	rec := &recorder{}
	synced := make(chan struct{}, 1)
	p, err := New(Config{Observer: rec, Hold: true, OnSynchronized: func() { synced <- struct{}{} },
		Configure: func(_ context.Context, b []byte) error {
			if string(b) == "bad" {
				return errors.New("bad")
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	answered := make(chan struct{})
	go func() {
		_, _ = p.Configure(context.Background(), "relist-period: 5s", "containerd", "v2.4.2")
		close(answered)
	}()
	if got := <-p.Configured(); string(got.Data) != "relist-period: 5s" || got.Err != nil {
		t.Fatalf("Configured() = %q, %v", got.Data, got.Err)
	}
	synchronized := make(chan struct{})
	go func() {
		_, _ = p.Synchronize(context.Background(), []*api.PodSandbox{{Id: "s1", Uid: "u1", Name: "p", Namespace: "ns"}}, nil)
		close(synchronized)
	}()
	synctest.Wait() // every goroutine of the test is blocked: the callbacks wait
	select {
	case <-answered:
		t.Fatal("the first Configure was answered before Release")
	case <-synchronized:
		t.Fatal("Synchronize went on before Release")
	default:
	}
	if n := len(rec.take()); n != 0 {
		t.Fatalf("%d observations before Release", n)
	}
	p.Release()
	p.Release() // twice is fine
	for _, ch := range []chan struct{}{answered, synchronized} {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("a callback still waits after Release")
		}
	}
	select {
	case <-synced:
	case <-time.After(10 * time.Second):
		t.Fatal("OnSynchronized not called after Release")
	}
	if n := len(rec.take()); n != 1 {
		t.Errorf("%d observations after Release, want 1", n)
	}
	// A later configuration is answered at once and not handed on.
	if _, err := p.Configure(context.Background(), "relist-period: 6s", "containerd", "v2.4.2"); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-p.Configured():
		t.Errorf("a later configuration was handed on: %q", got.Data)
	default:
	}

	// A refused first configuration is handed on with its error, and refused to the runtime in the
	// answer to its Synchronize (the stub tears the connection down on a Configure error before the
	// error reaches the runtime): the daemon exits, the runtime stops the plugin.
	refusing, err := New(Config{Observer: rec, Hold: true, Configure: func(context.Context, []byte) error { return errors.New("bad") }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := refusing.Configure(context.Background(), "bad", "containerd", "v2.4.2"); err != nil {
		t.Errorf("a refused configuration's Configure: %v, want the refusal in Synchronize", err)
	}
	select {
	case got := <-refusing.Configured():
		if string(got.Data) != "bad" || got.Err == nil {
			t.Errorf("Configured() = %q, %v; want the refused configuration and its error", got.Data, got.Err)
		}
	default:
		t.Error("a refused first configuration was not handed on")
	}
	if _, err := refusing.Synchronize(context.Background(), nil, nil); err == nil || err.Error() != "invalid NRI plugin configuration: bad" {
		t.Errorf("Synchronize after a refused configuration: %v, want the refusal", err)
	}
	if !refusing.Refuse(errors.New("exiting"), 10*time.Millisecond) {
		t.Error("Refuse after a refused configuration does not say the runtime got the refusal")
	}

	// The daemon refuses an accepted configuration while its answer is held (it will not serve): the
	// held Configure answers at once, Synchronize with the refusal; after Release, a refusal is never
	// answered.
	refused, err := New(Config{Observer: rec, Hold: true, Configure: func(context.Context, []byte) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	answer := make(chan error, 1)
	go func() {
		_, err := refused.Configure(context.Background(), "relist-period: 5s", "containerd", "v2.4.2")
		answer <- err
	}()
	<-refused.Configured()
	syncAnswer := make(chan error, 1)
	go func() {
		_, err := refused.Synchronize(context.Background(), nil, nil)
		syncAnswer <- err
	}()
	if !refused.Refuse(errors.New("another core serves"), 10*time.Second) {
		t.Error("Refuse: Synchronize did not answer with the refusal")
	}
	if err := <-answer; err != nil {
		t.Errorf("the held Configure answered %v", err)
	}
	if err := <-syncAnswer; err == nil || err.Error() != "another core serves" {
		t.Errorf("Synchronize answered %v, want the refusal", err)
	}
	if p.Refuse(errors.New("late"), 10*time.Millisecond) {
		t.Error("Refuse after Release says it reached the runtime")
	}
	if _, err := p.Synchronize(context.Background(), nil, nil); err != nil {
		t.Errorf("Synchronize after Release and a late refusal: %v", err)
	}

	// No configuration for the plugin ("") is a configuration: the defaults, at once.
	empty, err := New(Config{Observer: rec, Hold: true, Configure: func(context.Context, []byte) error { return errors.New("not called") }})
	if err != nil {
		t.Fatal(err)
	}
	empty.Release()
	if _, err := empty.Configure(context.Background(), "", "containerd", "v2.4.2"); err != nil {
		t.Error(err)
	}
	if got := <-empty.Configured(); len(got.Data) != 0 || got.Err != nil {
		t.Errorf("Configured() = %q, %v; want no data and no error", got.Data, got.Err)
	}

	// Without Release, the first answer waits only until the runtime's deadline.
	held, err := New(Config{Observer: rec, Hold: true, Configure: func(context.Context, []byte) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), configureMargin+100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := held.Configure(ctx, "x: 1", "containerd", "v2.4.2"); err != nil {
		t.Fatal(err)
	}
	// In the bubble the times are exact: the answer comes configureMargin before the runtime's deadline.
	if waited := time.Since(start); waited != 100*time.Millisecond {
		t.Errorf("the held answer came after %s, want 100ms", waited)
	}
}

// TestSessionSynchronized: a connection is synchronized once its Synchronize answered without an error,
// once, and no longer when it ends; a Synchronize that returns after the end, or a refusal, marks
// nothing.
func TestSessionSynchronized(t *testing.T) {
	m := newRecMetrics()
	p, err := New(Config{Observer: &recorder{}, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first := sessionHandlers{p, &connSync{metrics: m}}
	for range 2 {
		if _, err := first.Synchronize(ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	first.synced.end()
	first.synced.end()
	if _, err := first.Synchronize(ctx, nil, nil); err != nil { // outlived its session
		t.Fatal(err)
	}
	if want := []bool{true, false}; !slices.Equal(m.synced, want) {
		t.Errorf("Synchronized states %v, want %v", m.synced, want)
	}

	held, err := New(Config{Observer: &recorder{}, Metrics: m, Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	held.refuse(errors.New("not serving"))
	refused := sessionHandlers{held, &connSync{metrics: m}}
	if _, err := refused.Synchronize(ctx, nil, nil); err == nil {
		t.Fatal("Synchronize did not answer with the refusal")
	}
	refused.synced.end()
	if want := []bool{true, false}; !slices.Equal(m.synced, want) {
		t.Errorf("Synchronized states after a refusal %v, want %v", m.synced, want)
	}
}

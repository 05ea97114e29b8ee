package plugin

// The plugin is an observer: every NRI callback it implements returns no adjustment, no update and no
// error, whatever it is given and whatever its observer does; Configure's error is its refusal of a
// configuration its check refused (TestConfigure). The callbacks are found by reflection
// over the stub's callback interfaces, so that a handler added later is covered without being listed
// here.

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"google.golang.org/protobuf/proto"

	"github.com/pleg-nri/pleg-nri/pleg"
)

// stubInterfaces are every callback interface of the NRI stub.
var stubInterfaces = []reflect.Type{
	reflect.TypeFor[stub.ConfigureInterface](),
	reflect.TypeFor[stub.SynchronizeInterface](),
	reflect.TypeFor[stub.ShutdownInterface](),
	reflect.TypeFor[stub.RunPodInterface](),
	reflect.TypeFor[stub.UpdatePodInterface](),
	reflect.TypeFor[stub.StopPodInterface](),
	reflect.TypeFor[stub.RemovePodInterface](),
	reflect.TypeFor[stub.PostUpdatePodInterface](),
	reflect.TypeFor[stub.CreateContainerInterface](),
	reflect.TypeFor[stub.StartContainerInterface](),
	reflect.TypeFor[stub.UpdateContainerInterface](),
	reflect.TypeFor[stub.StopContainerInterface](),
	reflect.TypeFor[stub.RemoveContainerInterface](),
	reflect.TypeFor[stub.PostCreateContainerInterface](),
	reflect.TypeFor[stub.PostStartContainerInterface](),
	reflect.TypeFor[stub.PostUpdateContainerInterface](),
	reflect.TypeFor[stub.ValidateContainerAdjustmentInterface](),
}

// callback is one NRI callback the plugin implements.
type callback struct {
	name string
	fn   reflect.Method // the method of *Plugin
}

// pluginCallbacks lists the callbacks *Plugin implements, sorted by name.
func pluginCallbacks(t testing.TB) []callback {
	t.Helper()
	pt := reflect.TypeFor[*Plugin]()
	var out []callback
	for _, it := range stubInterfaces {
		if !pt.Implements(it) {
			continue
		}
		for i := range it.NumMethod() {
			m, _ := pt.MethodByName(it.Method(i).Name)
			out = append(out, callback{name: m.Name, fn: m})
		}
	}
	slices.SortFunc(out, func(a, b callback) int {
		if a.name < b.name {
			return -1
		}
		return 1
	})
	return out
}

// callbackArgs holds what the arguments of a callback are made of.
type callbackArgs struct {
	pod    *api.PodSandbox
	ctr    *api.Container
	pods   []*api.PodSandbox
	ctrs   []*api.Container
	res    *api.LinuxResources
	adjust *api.ValidateContainerAdjustmentRequest
	str    string
}

// values builds the argument list of m (after the receiver) from a.
func (a callbackArgs) values(t testing.TB, m reflect.Method) []reflect.Value {
	t.Helper()
	mt := m.Type
	args := []reflect.Value{}
	for i := 1; i < mt.NumIn(); i++ { // 0 is the receiver
		var v any
		switch in := mt.In(i); in {
		case reflect.TypeFor[context.Context]():
			v = context.Background()
		case reflect.TypeFor[*api.PodSandbox]():
			v = a.pod
		case reflect.TypeFor[*api.Container]():
			v = a.ctr
		case reflect.TypeFor[[]*api.PodSandbox]():
			v = a.pods
		case reflect.TypeFor[[]*api.Container]():
			v = a.ctrs
		case reflect.TypeFor[*api.LinuxResources]():
			v = a.res
		case reflect.TypeFor[*api.ValidateContainerAdjustmentRequest]():
			v = a.adjust
		case reflect.TypeFor[string]():
			v = a.str
		default:
			t.Fatalf("%s: no argument of type %s: extend callbackArgs", m.Name, in)
		}
		args = append(args, reflect.ValueOf(v).Convert(mt.In(i)))
	}
	return args
}

// checkNothingReturned fails unless every result of a callback is its zero value: no event mask, no
// adjustment, no update, no error (but Configure's, which refuses a configuration).
func checkNothingReturned(t testing.TB, name string, out []reflect.Value) {
	t.Helper()
	for i, v := range out {
		if name == "Configure" && v.Type() == reflect.TypeFor[error]() {
			continue
		}
		if !v.IsZero() {
			t.Fatalf("%s returned %v as result %d (%s), want nothing", name, v.Interface(), i, v.Type())
		}
	}
}

// callAll calls every callback of p with a and checks nothing is returned.
func callAll(t testing.TB, p *Plugin, cbs []callback, a callbackArgs) {
	t.Helper()
	for _, cb := range cbs {
		out := cb.fn.Func.Call(append([]reflect.Value{reflect.ValueOf(p)}, a.values(t, cb.fn)...))
		checkNothingReturned(t, cb.name, out)
	}
}

// counter is an Observer that counts its calls.
type counter struct{ n int }

func (c *counter) Observe(pleg.Observation) { c.n++ }

func TestEveryCallbackReturnsNothing(t *testing.T) {
	cbs := pluginCallbacks(t)
	var names []string
	for _, cb := range cbs {
		names = append(names, cb.name)
	}
	// What the plugin must handle (design.md section 1); more is covered too, fewer fails.
	for _, want := range []string{"Configure", "Synchronize", "Shutdown", "RunPodSandbox", "StopPodSandbox",
		"RemovePodSandbox", "PostCreateContainer", "PostStartContainer", "StopContainer", "RemoveContainer",
		"PostUpdateContainer"} {
		if !slices.Contains(names, want) {
			t.Errorf("the plugin does not implement NRI's %s", want)
		}
	}
	t.Logf("callbacks: %v", names)

	pod := &api.PodSandbox{Id: "sb1", Name: "web", Uid: "u1", Namespace: "ns", Pid: 10, Ips: []string{"10.0.0.2"},
		Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"c": "d"}}
	ctr := &api.Container{Id: "c1", PodSandboxId: "sb1", Name: "app", State: api.ContainerState_CONTAINER_STOPPED,
		CreatedAt: created, StartedAt: started, FinishedAt: finished, ExitCode: 137, StatusReason: "OOMKilled", Pid: 11}
	for _, tc := range []struct {
		name string
		args callbackArgs
	}{
		{"nil arguments", callbackArgs{}},
		{"empty objects", callbackArgs{pod: &api.PodSandbox{}, ctr: &api.Container{}, pods: []*api.PodSandbox{nil, {}},
			ctrs: []*api.Container{nil, {}}, res: &api.LinuxResources{}, adjust: &api.ValidateContainerAdjustmentRequest{}}},
		{"real objects", callbackArgs{pod: pod, ctr: ctr, pods: []*api.PodSandbox{pod}, ctrs: []*api.Container{ctr},
			res:    &api.LinuxResources{Cpu: &api.LinuxCPU{Shares: api.UInt64(512)}},
			adjust: &api.ValidateContainerAdjustmentRequest{Pod: pod, Container: ctr}, str: "relist-period: 5s"}},
		{"garbage", callbackArgs{
			pod: &api.PodSandbox{Id: "\x00\xff", Pid: 1<<32 - 1},
			ctr: &api.Container{Id: "c\n", PodSandboxId: "other", State: api.ContainerState(99), CreatedAt: -1, StartedAt: -5,
				FinishedAt: 1 << 62, ExitCode: -1, StatusReason: "\xff"},
			pods: []*api.PodSandbox{{Id: ""}}, ctrs: []*api.Container{{State: -3}}, str: "unknown-key: [",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, obs := range []struct {
				name string
				o    Observer
			}{{"counting observer", &counter{}}, {"panicking observer", panicker{}}} {
				configured := 0
				p, err := New(Config{Observer: obs.o, Configure: func(context.Context, []byte) error {
					configured++
					return fmt.Errorf("invalid configuration %d", configured)
				}, OnSynchronized: func() {}})
				if err != nil {
					t.Fatal(err)
				}
				callAll(t, p, cbs, tc.args)
			}
		})
	}
}

// FuzzCallbacks calls one callback with objects built from the input, with an observer that records or
// panics: whatever they hold, nothing is returned.
func FuzzCallbacks(f *testing.F) {
	f.Add(uint8(0), "sb1", "c1", "sb1", int32(api.ContainerState_CONTAINER_RUNNING), created, started, int64(0), int32(0), "", uint32(7), false)
	f.Add(uint8(5), "", "", "", int32(-1), int64(-1), int64(1<<62), int64(-1<<62), int32(-9), "OOMKilled", uint32(0), true)
	f.Add(uint8(9), "sb\x00", "c\xff", "other", int32(99), created, created, created, int32(137), "relist-period: x", uint32(1), false)
	cbs := pluginCallbacks(f)
	f.Fuzz(func(t *testing.T, which uint8, podID, ctrID, ctrPod string, state int32, cAt, sAt, fAt int64, code int32,
		text string, pid uint32, panics bool) {
		pod := &api.PodSandbox{Id: podID, Pid: pid, Name: text, Uid: text}
		ctr := &api.Container{Id: ctrID, PodSandboxId: ctrPod, State: api.ContainerState(state), CreatedAt: cAt,
			StartedAt: sAt, FinishedAt: fAt, ExitCode: code, StatusReason: text, StatusMessage: text, Pid: pid}
		a := callbackArgs{pod: pod, ctr: ctr, pods: []*api.PodSandbox{pod, nil}, ctrs: []*api.Container{ctr, nil},
			res: &api.LinuxResources{}, adjust: &api.ValidateContainerAdjustmentRequest{Pod: pod, Container: ctr}, str: text}
		if which%7 == 0 {
			a = callbackArgs{str: text} // nil objects
		}
		var o Observer = &recorder{}
		if panics {
			o = panicker{}
		}
		p, err := New(Config{Observer: o, Configure: func(context.Context, []byte) error { return fmt.Errorf("bad: %q", text) }})
		if err != nil {
			t.Fatal(err)
		}
		cb := cbs[int(which)%len(cbs)]
		out := cb.fn.Func.Call(append([]reflect.Value{reflect.ValueOf(p)}, a.values(t, cb.fn)...))
		checkNothingReturned(t, cb.name, out)
	})
}

// TestNothingReturnedOverNRI drives every request of NRI's runtime side (the adaptation containerd
// embeds) through a connected plugin whose observer panics, and compares each answer with the answer
// of the same runtime without any plugin: equal, no error, and the plugin stays connected.
func TestNothingReturnedOverNRI(t *testing.T) {
	rt := newFakeRuntime(t)
	rt.Start()
	bare := newFakeRuntime(t)
	bare.Start()
	h := startPlugin(t, rt.Outer, func(p *Plugin) { p.cfg.Observer = panicker{} })
	h.waitState(true)
	h.waitSynced()

	ctx := context.Background()
	pod := &api.PodSandbox{Id: "sb1", Name: "web", Uid: "u1", Namespace: "ns", Pid: 100}
	ctr := &api.Container{Id: "c1", PodSandboxId: "sb1", Name: "app", State: api.ContainerState_CONTAINER_RUNNING,
		CreatedAt: created, StartedAt: started, Pid: 101}
	res := &api.LinuxResources{Cpu: &api.LinuxCPU{Shares: api.UInt64(256)}}
	b := rt.NRI().BlockPluginSync()
	defer b.Unblock()
	for _, tc := range []struct {
		name string
		do   func(r *fakeRuntime) (proto.Message, error)
	}{
		{"RunPodSandbox", func(r *fakeRuntime) (proto.Message, error) {
			return nil, r.NRI().RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod})
		}},
		{"UpdatePodSandbox", func(r *fakeRuntime) (proto.Message, error) {
			return r.NRI().UpdatePodSandbox(ctx, &api.UpdatePodSandboxRequest{Pod: pod, OverheadLinuxResources: res, LinuxResources: res})
		}},
		{"PostUpdatePodSandbox", func(r *fakeRuntime) (proto.Message, error) {
			return nil, r.NRI().PostUpdatePodSandbox(ctx, &api.PostUpdatePodSandboxRequest{Pod: pod})
		}},
		{"CreateContainer", func(r *fakeRuntime) (proto.Message, error) {
			return r.NRI().CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: proto.Clone(ctr).(*api.Container)})
		}},
		{"PostCreateContainer", func(r *fakeRuntime) (proto.Message, error) {
			return nil, r.NRI().PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: pod, Container: ctr})
		}},
		{"StartContainer", func(r *fakeRuntime) (proto.Message, error) {
			return nil, r.NRI().StartContainer(ctx, &api.StartContainerRequest{Pod: pod, Container: ctr})
		}},
		{"PostStartContainer", func(r *fakeRuntime) (proto.Message, error) {
			return nil, r.NRI().PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: pod, Container: ctr})
		}},
		{"UpdateContainer", func(r *fakeRuntime) (proto.Message, error) {
			return r.NRI().UpdateContainer(ctx, &api.UpdateContainerRequest{Pod: pod, Container: ctr, LinuxResources: res})
		}},
		{"PostUpdateContainer", func(r *fakeRuntime) (proto.Message, error) {
			return nil, r.NRI().PostUpdateContainer(ctx, &api.PostUpdateContainerRequest{Pod: pod, Container: ctr})
		}},
		{"StopContainer", func(r *fakeRuntime) (proto.Message, error) {
			c := proto.Clone(ctr).(*api.Container)
			c.State, c.FinishedAt, c.ExitCode = api.ContainerState_CONTAINER_STOPPED, finished, 1
			return r.NRI().StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: c})
		}},
		{"RemoveContainer", func(r *fakeRuntime) (proto.Message, error) {
			return nil, r.NRI().RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: ctr})
		}},
		{"StopPodSandbox", func(r *fakeRuntime) (proto.Message, error) {
			return nil, r.NRI().StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod})
		}},
		{"RemovePodSandbox", func(r *fakeRuntime) (proto.Message, error) {
			return nil, r.NRI().RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod})
		}},
	} {
		got, err := tc.do(rt)
		if err != nil {
			t.Errorf("%s: the runtime got error %v", tc.name, err)
		}
		want, werr := tc.do(bare)
		if werr != nil {
			t.Fatalf("%s without plugins: %v", tc.name, werr)
		}
		if !proto.Equal(got, want) {
			t.Errorf("%s: the runtime got %v, without the plugin %v", tc.name, got, want)
		}
	}
	select {
	case up := <-h.state:
		t.Errorf("the plugin's connection changed (up=%v) while it was handling requests", up)
	case <-time.After(100 * time.Millisecond):
	}
}

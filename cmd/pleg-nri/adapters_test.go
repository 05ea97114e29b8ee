package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/containerd/log"
	"github.com/containerd/nri/pkg/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/eventbridge/front"
	"github.com/pleg-nri/pleg-nri/internal/promutil"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/pleg"
	"github.com/pleg-nri/pleg-nri/plugin"
)

// oneSandbox is containerd's CRI with one ready sandbox, s1, and no container.
type oneSandbox struct{}

func (oneSandbox) PodSandboxStatus(_ context.Context, id string) (*runtimeapi.PodSandboxStatus, error) {
	return &runtimeapi.PodSandboxStatus{Id: id, State: runtimeapi.PodSandboxState_SANDBOX_READY, CreatedAt: 1,
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: "u1"}}, nil
}

func (oneSandbox) ContainerStatus(context.Context, string) (*runtimeapi.ContainerStatus, error) {
	return nil, context.Canceled
}

func (oneSandbox) ListPodSandbox(context.Context) ([]*runtimeapi.PodSandbox, error) {
	return []*runtimeapi.PodSandbox{{Id: "s1", State: runtimeapi.PodSandboxState_SANDBOX_READY, CreatedAt: 1}}, nil
}

func (oneSandbox) ListContainers(context.Context) ([]*runtimeapi.Container, error) { return nil, nil }

// runCore runs a core on oneSandbox until the test ends; before it runs, subscribe subscribes to it:
// its startup reconciliation finds s1 and emits its events, which a subscription made after them
// would never see (no startup replay is configured), and an observation of s1 after it changes nothing.
func runCore(t *testing.T, subscribe func(*pleg.PLEG)) (context.Context, *pleg.PLEG) {
	t.Helper()
	core, err := pleg.New(pleg.Config{Status: oneSandbox{}, Lister: oneSandbox{}, RelistPeriod: time.Hour, VerifyDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	subscribe(core)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	done := make(chan error, 1)
	go func() { done <- core.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ctx, core
}

// TestEventSourceAdapter: the core's subscriptions, as the core's event socket reads them (Next and the
// shared encoding of NextEncoded), and the observer adapter the plugin and the task events feed.
func TestEventSourceAdapter(t *testing.T) {
	var first, second eventStream
	ctx, core := runCore(t, func(core *pleg.PLEG) {
		src := eventSource{core}
		first, second = src.Subscribe().(eventStream), src.Subscribe().(eventStream)
	})
	defer first.Close()
	defer second.Close()
	pleg.ObserverFunc(core.Observe).Observe(pleg.Observation{Source: pleg.SourceNRI, Kind: pleg.KindSandbox, ID: "s1", SandboxID: "s1",
		Phase: pleg.PhaseRunning})
	ev, _, err := first.Next(ctx)
	if err != nil || ev.ContainerId != "s1" {
		t.Fatalf("Next: %v, %v", ev, err)
	}
	b, _, err := second.NextEncoded(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var decoded runtimeapi.ContainerEventResponse
	if err := proto.Unmarshal(b, &decoded); err != nil || !proto.Equal(&decoded, ev) {
		t.Errorf("NextEncoded decodes to %v (%v), want %v", &decoded, err, ev)
	}
}

// TestCoreLinkMetrics: the core's socket reports its sends to the core's send latency.
func TestCoreLinkMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := coreLinkMetrics{core: pleg.NewPrometheusMetrics(reg)}
	m.EventSent(time.Millisecond)
	var b strings.Builder
	if err := promutil.Write(&b, reg); err != nil {
		t.Fatal(err)
	}
	if want := "pleg_nri_event_send_latency_seconds_count 1"; !strings.Contains(b.String(), want+"\n") {
		t.Errorf("the metrics lack %s", want)
	}
}

// TestNewPlugin: the daemon's plugin checks NRI's configurations (a later change of a key that needs a
// restart is only logged), and hands its observations and resynchronizations to the core.
func TestNewPlugin(t *testing.T) {
	var sub *pleg.Subscription
	ctx, core := runCore(t, func(core *pleg.PLEG) { sub = core.Subscribe() })
	defer sub.Close()
	nri, err := newPlugin(config.Default(), true, func() *pleg.PLEG { return core }, plugin.NopMetrics{})
	if err != nil {
		t.Fatal(err)
	}
	// What the plugin logs, to see that the later change is logged.
	var logged testutil.SyncBuffer
	logger := logrus.New()
	logger.SetOutput(&logged)
	ctx = log.WithLogger(ctx, logrus.NewEntry(logger))
	for _, data := range []string{"relist-period: 7s\n", "relist-period: 8s\n", "relist_period: 8s\n"} {
		answered := make(chan struct{})
		go func() {
			_, _ = nri.Configure(ctx, data, "containerd", "v2.4.2")
			close(answered)
		}()
		nri.Release() // the first answer waits for the core
		<-answered
	}
	if got := <-nri.Configured(); string(got.Data) != "relist-period: 7s\n" || got.Err != nil {
		t.Errorf("Configured() = %q, %v; want the first configuration", got.Data, got.Err)
	}
	if out := logged.String(); !strings.Contains(out, "changed keys that need a restart") || !strings.Contains(out, "relist-period") {
		t.Errorf("the later change of relist-period was not logged: %q", out)
	}
	if _, err := nri.Synchronize(ctx, []*api.PodSandbox{{Id: "s1", Uid: "u1", Name: "web", Namespace: "default"}}, nil); err != nil {
		t.Fatal(err)
	}
	ev, err := sub.Next(ctx)
	if err != nil || ev.Response.ContainerId != "s1" {
		t.Errorf("the core's first event: %v, %v; want s1's", ev.Response, err)
	}
}

// TestHooksReachTheCore: the task events' reconnection asks for a relist, and a front gone asks the
// core to replay to the subscribers that come back through the next front.
func TestHooksReachTheCore(t *testing.T) {
	relists := 0
	events := taskHooks{upstreams: promutil.NewUpstreams(prometheus.NewRegistry(), "events"), ready: &readiness{}, relist: func() { relists++ }}
	events.OnReconnect()
	events.OnReconnect()
	if relists != 2 {
		t.Errorf("%d relists asked after 2 reconnections, want 2", relists)
	}
	_, core := runCore(t, func(*pleg.PLEG) {})
	fronts := frontHooks{front.NewSupervisorMetrics(prometheus.NewRegistry()), &readiness{}, core}
	fronts.FrontGone() // must not block or panic with the core running
	fronts.FrontUp(true)
	if !fronts.ready.front.Load() {
		t.Error("a front up did not reach readiness")
	}
}

package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-nri/pleg-nri/eventbridge/front"
	"github.com/pleg-nri/pleg-nri/internal/promutil"
	"github.com/pleg-nri/pleg-nri/pleg"
	"github.com/pleg-nri/pleg-nri/plugin"
)

// notSynced is /readyz's answer while the NRI plugin is registered but has not answered the runtime's
// Synchronize.
const notSynced = "NRI plugin not synchronized with the runtime yet (the runtime holds pod starts until it is)"

// TestReadiness feeds readiness through the hooks the daemon hands the plugin, the event subscription
// the core and the front supervisor: /readyz names the first thing missing until all three are there, and the metrics see
// the same hooks.
func TestReadiness(t *testing.T) {
	reg := prometheus.NewRegistry()
	upstreams, ready := promutil.NewUpstreams(reg, "nri", "events", "cri"), &readiness{}
	nri := nriHooks{plugin.NewPrometheusMetrics(reg, upstreams), ready}
	events := taskHooks{upstreams: upstreams, ready: ready, relist: func() {}}
	core := coreHooks{pleg.NewPrometheusMetrics(reg), ready}
	fronts := frontHooks{front.NewSupervisorMetrics(reg), ready, nil}
	want := wantReady(t, ready)

	want("no front serves the CRI endpoint")
	fronts.FrontUp(true)
	want("NRI plugin not registered")
	nri.ConnectionState(true)
	want(notSynced)
	nri.Synchronized(true)
	want("containerd events not subscribed")
	events.OnConnectionState(true)
	want("no relist has completed yet")
	core.RelistCompleted(time.Millisecond, errors.New("containerd is away"))
	want("no relist has completed yet")
	core.RelistCompleted(time.Millisecond, nil)
	want("")
	events.OnConnectionState(false)
	want("containerd events not subscribed")
	nri.ConnectionState(false)
	want("NRI plugin not registered")
	fronts.FrontUp(false)
	want("no front serves the CRI endpoint")

	var b strings.Builder
	if err := promutil.Write(&b, reg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`pleg_nri_upstream_connected{upstream="events"} 0`, `pleg_nri_upstream_connected{upstream="nri"} 0`, `pleg_nri_nri_synchronized 1`,
		`pleg_nri_relist_duration_seconds_count{result="ok"} 1`, `pleg_nri_relist_duration_seconds_count{result="error"} 1`, `pleg_nri_front_up 0`} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Errorf("the metrics lack %s", want)
		}
	}
}

// newReadyExceptNRI returns readiness with everything but the NRI plugin there, and the plugin's hooks.
func newReadyExceptNRI(t *testing.T) (*readiness, nriHooks) {
	t.Helper()
	reg := prometheus.NewRegistry()
	ready := &readiness{}
	ready.front.Store(true)
	ready.events.Store(true)
	ready.relisted.Store(true)
	return ready, nriHooks{plugin.NewPrometheusMetrics(reg, promutil.NewUpstreams(reg, "nri")), ready}
}

// TestReadinessWaitsForNRISync: /readyz is not ready between the plugin's registration and its answer
// to the runtime's Synchronize (containerd holds the node's pod starts until it has that answer), nor
// after the connection went down, until the next connection's Synchronize; the answer may come before
// the registration is reported.
func TestReadinessWaitsForNRISync(t *testing.T) {
	ready, nri := newReadyExceptNRI(t)
	want := wantReady(t, ready)

	// The first connection, then the runtime restarts: the connection goes down, and the next one is
	// not synchronized until its own Synchronize, though the previous one was.
	for range 2 {
		want("NRI plugin not registered")
		nri.ConnectionState(true)
		want(notSynced)
		nri.Synchronized(true)
		want("")
		nri.ConnectionState(false)
	}
	want("NRI plugin not registered")

	// Down (above), without the plugin's Synchronized(false) first: still not synchronized after.
	nri.ConnectionState(true)
	want(notSynced)

	// The answer before the registration is reported (nothing orders them): ready once registered.
	nri.ConnectionState(false)
	nri.Synchronized(false)
	nri.Synchronized(true)
	want("NRI plugin not registered")
	nri.ConnectionState(true)
	want("")
}

// wantReady returns a check that ready says msg ("": ready).
func wantReady(t *testing.T, ready *readiness) func(msg string) {
	return func(msg string) {
		t.Helper()
		err := ready.check()
		if msg == "" && err != nil || msg != "" && (err == nil || err.Error() != msg) {
			t.Fatalf("check() = %v, want %q", err, msg)
		}
	}
}

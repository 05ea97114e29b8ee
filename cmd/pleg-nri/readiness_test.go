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
	want := func(msg string) {
		t.Helper()
		err := ready.check()
		if msg == "" && err != nil || msg != "" && (err == nil || err.Error() != msg) {
			t.Fatalf("check() = %v, want %q", err, msg)
		}
	}

	want("no front serves the CRI endpoint")
	fronts.FrontUp(true)
	want("NRI plugin not registered")
	nri.ConnectionState(true)
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
	for _, want := range []string{`pleg_nri_upstream_connected{upstream="events"} 0`, `pleg_nri_upstream_connected{upstream="nri"} 0`,
		`pleg_nri_relist_duration_seconds_count{result="ok"} 1`, `pleg_nri_relist_duration_seconds_count{result="error"} 1`, `pleg_nri_front_up 0`} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Errorf("the metrics lack %s", want)
		}
	}
}

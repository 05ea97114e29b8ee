package main

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestReadiness feeds readiness through the hooks the daemon hands the plugin, the event subscription
// and the core: /readyz names the first thing missing until all three are there, and the metrics see
// the same hooks.
func TestReadiness(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, ready := newMetrics(reg), &readiness{}
	nri := nriHooks{m, ready}
	events := taskHooks{m: m, ready: ready, relist: func() {}}
	core := coreHooks{newOOMMetrics(m, reg), ready}
	want := func(msg string) {
		t.Helper()
		err := ready.check()
		if msg == "" && err != nil || msg != "" && (err == nil || err.Error() != msg) {
			t.Fatalf("check() = %v, want %q", err, msg)
		}
	}

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

	var up dto.Metric
	if err := m.upstream.WithLabelValues("events").Write(&up); err != nil || up.GetGauge().GetValue() != 0 {
		t.Errorf("pleg_nri_upstream_connected{upstream=\"events\"} = %v (%v), want 0", up.GetGauge().GetValue(), err)
	}
}

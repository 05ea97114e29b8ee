package plugin

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-nri/pleg-nri/internal/promutil"
)

// TestPrometheusMetrics: the callbacks' metrics, the connection's state and reconnects under "nri"
// (counted by the plugin, not from its states), and whether it answered Synchronize.
func TestPrometheusMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewPrometheusMetrics(reg, promutil.NewUpstreams(reg, "nri"))
	m.HookDuration(CallbackStopContainer, time.Microsecond)
	m.Observations(CallbackSynchronize, 3)
	m.ConnectionState(true)
	m.ConnectionState(false)
	m.ConnectionState(true)
	m.Reconnected()
	m.Synchronized(true)
	m.Synchronized(false)
	m.Synchronized(true)
	var b strings.Builder
	if err := promutil.Write(&b, reg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`pleg_nri_hook_duration_seconds_count{callback="` + CallbackStopContainer.String() + `"} 1`,
		`pleg_nri_hook_observations_total{callback="` + CallbackSynchronize.String() + `"} 3`,
		`pleg_nri_upstream_connected{upstream="nri"} 1`,
		`pleg_nri_upstream_reconnects_total{upstream="nri"} 1`,
		`pleg_nri_nri_synchronized 1`,
	} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Errorf("the metrics lack %s:\n%s", want, b.String())
		}
	}
}

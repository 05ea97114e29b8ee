package plugin

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-nri/pleg-nri/internal/promutil"
)

// upstreamName is the plugin's connection in pleg_nri_upstream_connected.
const upstreamName = "nri"

// PrometheusMetrics are the plugin's metrics in Prometheus.
type PrometheusMetrics struct {
	hookDuration *prometheus.HistogramVec
	hookObs      *prometheus.CounterVec
	synchronized prometheus.Gauge
	upstreams    *promutil.Upstreams
}

var _ Metrics = (*PrometheusMetrics)(nil)

// NewPrometheusMetrics registers the plugin's metrics on reg; its connection's state goes to
// upstreams, as "nri".
func NewPrometheusMetrics(reg prometheus.Registerer, upstreams *promutil.Upstreams) *PrometheusMetrics {
	m := &PrometheusMetrics{
		hookDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: promutil.Namespace, Name: "hook_duration_seconds",
			Help:    "Time the NRI plugin took to handle a callback.",
			Buckets: []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2}}, []string{"callback"}),
		hookObs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: promutil.Namespace, Name: "hook_observations_total",
			Help: "Observations made from NRI callbacks."}, []string{"callback"}),
		synchronized: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: promutil.Namespace, Name: "nri_synchronized",
			Help: "1 once the NRI plugin has answered the runtime's Synchronize on its current connection (the runtime holds pod and container starts until then), else 0."}),
		upstreams: upstreams,
	}
	reg.MustRegister(m.hookDuration, m.hookObs, m.synchronized)
	return m
}

// HookDuration is Metrics' hook.
func (m *PrometheusMetrics) HookDuration(cb Callback, d time.Duration) {
	m.hookDuration.WithLabelValues(cb.String()).Observe(d.Seconds())
}

// Observations is Metrics' hook.
func (m *PrometheusMetrics) Observations(cb Callback, n int) {
	m.hookObs.WithLabelValues(cb.String()).Add(float64(n))
}

// ConnectionState is Metrics' hook: the plugin counts its reconnects itself (Reconnected).
func (m *PrometheusMetrics) ConnectionState(up bool) { m.upstreams.Set(upstreamName, up, true) }

// Reconnected is Metrics' hook.
func (m *PrometheusMetrics) Reconnected() { m.upstreams.Reconnected(upstreamName) }

// Synchronized is Metrics' hook.
func (m *PrometheusMetrics) Synchronized(done bool) {
	if done {
		m.synchronized.Set(1)
	} else {
		m.synchronized.Set(0)
	}
}

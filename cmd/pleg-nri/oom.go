package main

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-nri/pleg-nri/internal/promutil"
	"github.com/pleg-nri/pleg-nri/pleg"
)

// oomMetrics adds the OOM check's histogram (pleg.OOMCheckMetrics) to the daemon's metrics.
type oomMetrics struct {
	*metrics
	calls *prometheus.HistogramVec
}

var _ pleg.OOMCheckMetrics = oomMetrics{}

func newOOMMetrics(m *metrics, reg prometheus.Registerer) oomMetrics {
	o := oomMetrics{metrics: m, calls: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: promutil.Namespace,
		Name: "oom_check_duration_seconds", Buckets: promutil.LatencyBuckets,
		Help: "OOM checks (containerd task metrics) of exits with status 137 before their STOPPED, by result."}, []string{"result"})}
	reg.MustRegister(o.calls)
	return o
}

func (o oomMetrics) OOMCheckCall(result string, d time.Duration) {
	o.calls.WithLabelValues(result).Observe(d.Seconds())
}

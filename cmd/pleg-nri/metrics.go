package main

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/pleg"
)

// The daemon's metrics are its packages' (pleg.PrometheusMetrics, plugin.PrometheusMetrics, the
// upstreams' in promutil.Upstreams), registered on one registry; the front keeps the kubelet endpoint's
// (kubelet.PrometheusMetrics) in its process, and the core's /metrics serves both (front.Gatherer).

// coreLinkMetrics are the metrics of the core's socket (corelink.Core), whose client is the front: the
// send latency (the core's). The kubelet's streams are the front's.
type coreLinkMetrics struct {
	kubelet.NopMetrics
	core *pleg.PrometheusMetrics
	// refused counts the connections the core's socket refused (kubelet.OnRefusedPeer); nil: none.
	refused prometheus.Counter
}

var _ kubelet.Metrics = coreLinkMetrics{}

func (p coreLinkMetrics) EventSent(latency time.Duration) { p.core.EventSent(latency) }

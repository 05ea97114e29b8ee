package main

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/internal/promutil"
	"github.com/pleg-nri/pleg-nri/pleg"
)

// The daemon's metrics are its packages' (pleg.PrometheusMetrics, plugin.PrometheusMetrics, the
// upstreams' in promutil.Upstreams), registered on one registry; the front keeps the kubelet endpoint's
// (kubelet.PrometheusMetrics) in its process, and the core's /metrics serves both (front.Gatherer).

// coreProxyMetrics are the metrics of the core's event socket, whose client is the front: the send
// latency (the core's) and the runtime connection ("cri", for /readyz). Forwarded calls and the
// kubelet's streams are the front's.
type coreProxyMetrics struct {
	kubelet.NopMetrics
	core      *pleg.PrometheusMetrics
	upstreams *promutil.Upstreams
	// refused counts the connections the core's socket refused (kubelet.OnRefusedPeer); nil: none.
	refused prometheus.Counter
}

var _ kubelet.Metrics = coreProxyMetrics{}

func (p coreProxyMetrics) EventSent(latency time.Duration) { p.core.EventSent(latency) }

func (p coreProxyMetrics) UpstreamConnectionState(up bool) { p.upstreams.Set("cri", up, false) }

package kubelet

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/pleg-nri/pleg-nri/internal/promutil"
)

// PrometheusMetrics are the metrics of the kubelet's CRI endpoint in Prometheus, kept by the front, which serves it.
// The front has no metrics server: the core's /metrics asks the front for them on its control socket
// (front.Gatherer), so that one scrape shows both, under the names they had before the front; the Go
// and process metrics of each carry a process label (core, front).
type PrometheusMetrics struct {
	forwarded     *prometheus.HistogramVec
	streams       prometheus.Gauge
	streamsClosed *prometheus.CounterVec
	refused       *prometheus.CounterVec
	overlaidReads *prometheus.CounterVec
	resubscribed  prometheus.Counter
	coreGone      prometheus.Counter
	// upstreams and upstream are where the runtime connection's state goes.
	upstreams *promutil.Upstreams
	upstream  string
}

// NewPrometheusMetrics registers the endpoint's metrics on reg; the runtime connection's state goes to
// upstreams, named upstream.
func NewPrometheusMetrics(reg prometheus.Registerer, upstreams *promutil.Upstreams, upstream string) *PrometheusMetrics {
	const ns = promutil.Namespace
	m := &PrometheusMetrics{
		overlaidReads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "overlaid_reads_total",
			Help: "Status reads answered with the stopped status already sent in an event, because containerd's answer still showed the object running (read-freshness: overlay), by method."}, []string{"method"}),
		forwarded: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "forwarded_call_duration_seconds",
			Help: "CRI calls forwarded to containerd, by method and code.", Buckets: promutil.LatencyBuckets}, []string{"method", "code"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "event_streams",
			Help: "Open GetContainerEvents streams."}),
		streamsClosed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "event_streams_closed_total",
			Help: "GetContainerEvents streams ended, by code."}, []string{"code"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "event_streams_refused_total",
			Help: "GetContainerEvents streams ended at once with RESOURCE_EXHAUSTED because a cap was reached, by cap (connection, total)."}, []string{"limit"}),
		resubscribed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "front_resubscriptions_total",
			Help: "Subscriptions of the front to the core's events made again after one ended (a restart of the core)."}),
		coreGone: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "event_streams_core_gone_total",
			Help: "GetContainerEvents streams the front ended (UNAVAILABLE, also counted in event_streams_closed_total) because the core had not come back within core-grace."}),
		upstreams: upstreams,
		upstream:  upstream,
	}
	reg.MustRegister(m.overlaidReads, m.forwarded, m.streams, m.streamsClosed, m.refused, m.resubscribed, m.coreGone)
	// The series a dashboard or an alert reads exist from the start (at 0), so that an increase shows
	// from 0 and a panel has data on a node where nothing happened yet: each read method's overlaid
	// reads, and the codes a stream most often ends with.
	for _, method := range []string{ListPodSandboxMethod, ListContainersMethod, PodSandboxStatusMethod, ContainerStatusMethod} {
		m.overlaidReads.WithLabelValues(promutil.MethodLabel(method))
	}
	for _, code := range []codes.Code{codes.Canceled, codes.Unavailable, codes.ResourceExhausted} {
		m.streamsClosed.WithLabelValues(code.String())
	}
	for _, limit := range []string{StreamLimitConnection, StreamLimitTotal} {
		m.refused.WithLabelValues(limit)
	}
	return m
}

var (
	_ Metrics          = (*PrometheusMetrics)(nil)
	_ FreshnessMetrics = (*PrometheusMetrics)(nil)

	_ StreamLimitMetrics = (*PrometheusMetrics)(nil)
)

func (m *PrometheusMetrics) ForwardedCall(method string, code codes.Code, d time.Duration) {
	m.forwarded.WithLabelValues(promutil.MethodLabel(method), code.String()).Observe(d.Seconds())
}

func (m *PrometheusMetrics) EventStreamOpened() { m.streams.Inc() }

func (m *PrometheusMetrics) EventStreamClosed(code codes.Code) {
	m.streams.Dec()
	m.streamsClosed.WithLabelValues(code.String()).Inc()
}

// EventStreamRefused is StreamLimitMetrics' hook.
func (m *PrometheusMetrics) EventStreamRefused(limit string) { m.refused.WithLabelValues(limit).Inc() }

// EventSent does nothing: the relayed events carry no source time (the core measures its sends).
func (m *PrometheusMetrics) EventSent(time.Duration) {}

func (m *PrometheusMetrics) RuntimeConnectionState(up bool) { m.upstreams.Set(m.upstream, up, false) }

// OverlaidRead is FreshnessMetrics' hook.
func (m *PrometheusMetrics) OverlaidRead(method string) {
	m.overlaidReads.WithLabelValues(promutil.MethodLabel(method)).Inc()
}

// Resubscribed counts a subscription of the front's Relay made again after one ended (RelayConfig.Resubscribed).
func (m *PrometheusMetrics) Resubscribed() { m.resubscribed.Inc() }

// CoreGone counts a client's stream the front's Relay ended because the core had not come back within
// its grace (RelayConfig.CoreGone).
func (m *PrometheusMetrics) CoreGone() { m.coreGone.Inc() }

// The sockets of the refused-connections metric (its socket label).
const (
	SocketCRI     = "cri"
	SocketControl = "control"
	SocketCore    = "core"
)

// NewRefusedPeersMetric registers on reg the count of connections a socket refused (see OnRefusedPeer),
// by socket: the front's (cri, control) and the core's (core) are one metric on the core's /metrics.
func NewRefusedPeersMetric(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: promutil.Namespace, Name: "refused_connections_total",
		Help: "Connections to pleg-nri's unix sockets closed at once because the peer was neither root nor pleg-nri's user, by socket (cri, control, core)."},
		[]string{"socket"})
	reg.MustRegister(c)
	return c
}

package front

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/codes"

	"github.com/pleg-nri/pleg-nri/endpoint"
	"github.com/pleg-nri/pleg-nri/internal/promutil"
)

// Metrics are the metrics of the kubelet's CRI endpoint, kept by the front, which serves it.
// The front has no metrics server: the core's /metrics asks the front for them on its control socket
// (Gatherer), so that one scrape shows both, under the names they had before the front; the Go
// and process metrics of each carry a process label (core, front).
type Metrics struct {
	forwarded     *prometheus.HistogramVec
	streams       prometheus.Gauge
	streamsClosed *prometheus.CounterVec
	staleReads    *prometheus.HistogramVec
	overlaidReads *prometheus.CounterVec
	refreshes     *prometheus.CounterVec
	resubscribed  prometheus.Counter
	// runtimeUp is pleg_nri_upstream_connected{upstream="front_cri"}.
	runtimeUp prometheus.Gauge
}

// NewMetrics registers the endpoint's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns = promutil.Namespace
	upstream := promutil.NewUpstreamGauge()
	m := &Metrics{
		staleReads: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "stale_read_hold_seconds",
			Help:    "Status reads whose first answer from containerd was older than the event stream, by method and result (caught_up, or gave_up: answered with containerd's last answer), and how long they were held.",
			Buckets: promutil.LatencyBuckets}, []string{"method", "result"}),
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "refresh_events_total",
			Help: "Refresh events (read-freshness: hold): after a held read gave up with containerd's older answer, a STOPPED re-sent with containerd's statuses once it caught up (sent), or none because it never did (not_caught_up)."}, []string{"result"}),
		overlaidReads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "overlaid_reads_total",
			Help: "Status reads answered with the stopped status already sent in an event, because containerd's answer still showed the object running (read-freshness: overlay), by method."}, []string{"method"}),
		forwarded: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "forwarded_call_duration_seconds",
			Help: "CRI calls forwarded to containerd, by method and code.", Buckets: promutil.LatencyBuckets}, []string{"method", "code"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "event_streams",
			Help: "Open GetContainerEvents streams."}),
		streamsClosed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "event_streams_closed_total",
			Help: "GetContainerEvents streams ended, by code."}, []string{"code"}),
		resubscribed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "front_resubscriptions_total",
			Help: "Subscriptions of the front to the core's events made again after one ended (a restart of the core)."}),
		runtimeUp: upstream.WithLabelValues("front_cri"),
	}
	reg.MustRegister(m.staleReads, m.overlaidReads, m.refreshes, m.forwarded, m.streams, m.streamsClosed, m.resubscribed, upstream)
	return m
}

var (
	_ endpoint.Metrics          = (*Metrics)(nil)
	_ endpoint.FreshnessMetrics = (*Metrics)(nil)
	_ endpoint.RefreshMetrics   = (*Metrics)(nil)
)

func (m *Metrics) ForwardedCall(method string, code codes.Code, d time.Duration) {
	m.forwarded.WithLabelValues(promutil.MethodLabel(method), code.String()).Observe(d.Seconds())
}

func (m *Metrics) EventStreamOpened() { m.streams.Inc() }

func (m *Metrics) EventStreamClosed(code codes.Code) {
	m.streams.Dec()
	m.streamsClosed.WithLabelValues(code.String()).Inc()
}

// EventSent does nothing: the relayed events carry no source time (the core measures its sends).
func (m *Metrics) EventSent(time.Duration) {}

func (m *Metrics) UpstreamConnectionState(up bool) { promutil.SetGauge(m.runtimeUp, up) }

// StaleRead is endpoint.FreshnessMetrics' hook.
func (m *Metrics) StaleRead(method string, held time.Duration, caughtUp bool) {
	result := "gave_up"
	if caughtUp {
		result = "caught_up"
	}
	m.staleReads.WithLabelValues(promutil.MethodLabel(method), result).Observe(held.Seconds())
}

// OverlaidRead is endpoint.FreshnessMetrics' hook.
func (m *Metrics) OverlaidRead(method string) {
	m.overlaidReads.WithLabelValues(promutil.MethodLabel(method)).Inc()
}

// RefreshSent is endpoint.RefreshMetrics' hook.
func (m *Metrics) RefreshSent(caughtUp bool) {
	result := "not_caught_up"
	if caughtUp {
		result = "sent"
	}
	m.refreshes.WithLabelValues(result).Inc()
}

// Gatherer gathers the front's metrics from its control socket, for the core's /metrics. No front
// answering is no error (and no metrics): the core's own metrics are served anyway.
type Gatherer struct {
	// RunDir is the front's run directory.
	RunDir string
}

func (g Gatherer) Gather() ([]*dto.MetricFamily, error) {
	c, err := dialControl(filepath.Join(g.RunDir, ControlSocketName))
	if err != nil {
		return nil, nil
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(controlTimeout))
	if _, err := c.Write([]byte(`{"op":"metrics"}` + "\n")); err != nil {
		return nil, fmt.Errorf("front metrics: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(c, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("front metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("front metrics: %w", err)
	}
	names := make([]string, 0, len(fams))
	for n := range fams {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]*dto.MetricFamily, 0, len(names))
	for _, n := range names {
		if strings.HasPrefix(n, "pleg_nri_") || strings.HasPrefix(n, "go_") || strings.HasPrefix(n, "process_") {
			out = append(out, fams[n])
		}
	}
	return out, nil
}

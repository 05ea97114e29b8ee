package main

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
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/pleg-nri/pleg-nri/endpoint"
)

// endpointMetrics are the metrics of the kubelet's CRI endpoint, kept by the front, which serves it.
// The front has no metrics server: the core's /metrics asks the front for them on its control socket
// (frontGatherer), so that one scrape shows both, under the names they had before the front; the Go
// and process metrics of each carry a process label (core, front).
type endpointMetrics struct {
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

func newEndpointMetrics(reg prometheus.Registerer) *endpointMetrics {
	const ns = metricsNamespace
	upstream := newUpstreamGauge()
	m := &endpointMetrics{
		staleReads: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "stale_read_hold_seconds",
			Help:    "Status reads whose first answer from containerd was older than the event stream, by method and result (caught_up, or gave_up: answered with containerd's last answer), and how long they were held.",
			Buckets: latencyBuckets}, []string{"method", "result"}),
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "refresh_events_total",
			Help: "Refresh events (read-freshness: hold): after a held read gave up with containerd's older answer, a STOPPED re-sent with containerd's statuses once it caught up (sent), or none because it never did (not_caught_up)."}, []string{"result"}),
		overlaidReads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "overlaid_reads_total",
			Help: "Status reads answered with the stopped status already sent in an event, because containerd's answer still showed the object running (read-freshness: overlay), by method."}, []string{"method"}),
		forwarded: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "forwarded_call_duration_seconds",
			Help: "CRI calls forwarded to containerd, by method and code.", Buckets: latencyBuckets}, []string{"method", "code"}),
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
	_ endpoint.Metrics          = (*endpointMetrics)(nil)
	_ endpoint.FreshnessMetrics = (*endpointMetrics)(nil)
	_ endpoint.RefreshMetrics   = (*endpointMetrics)(nil)
)

func (m *endpointMetrics) ForwardedCall(method string, code codes.Code, d time.Duration) {
	m.forwarded.WithLabelValues(methodLabel(method), code.String()).Observe(d.Seconds())
}

func (m *endpointMetrics) EventStreamOpened() { m.streams.Inc() }

func (m *endpointMetrics) EventStreamClosed(code codes.Code) {
	m.streams.Dec()
	m.streamsClosed.WithLabelValues(code.String()).Inc()
}

// EventSent does nothing: the relayed events carry no source time (the core measures its sends).
func (m *endpointMetrics) EventSent(time.Duration) {}

func (m *endpointMetrics) UpstreamConnectionState(up bool) { setGauge(m.runtimeUp, up) }

// StaleRead is endpoint.FreshnessMetrics' hook.
func (m *endpointMetrics) StaleRead(method string, held time.Duration, caughtUp bool) {
	result := "gave_up"
	if caughtUp {
		result = "caught_up"
	}
	m.staleReads.WithLabelValues(methodLabel(method), result).Observe(held.Seconds())
}

// OverlaidRead is endpoint.FreshnessMetrics' hook.
func (m *endpointMetrics) OverlaidRead(method string) {
	m.overlaidReads.WithLabelValues(methodLabel(method)).Inc()
}

// RefreshSent is endpoint.RefreshMetrics' hook.
func (m *endpointMetrics) RefreshSent(caughtUp bool) {
	result := "not_caught_up"
	if caughtUp {
		result = "sent"
	}
	m.refreshes.WithLabelValues(result).Inc()
}

// writeMetrics writes what g gathers in the Prometheus text format.
func writeMetrics(w io.Writer, g prometheus.Gatherer) error {
	mfs, err := g.Gather()
	if err != nil {
		return err
	}
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return err
		}
	}
	return nil
}

// frontGatherer gathers the front's metrics from its control socket, for the core's /metrics. No front
// answering is no error (and no metrics): the core's own metrics are served anyway.
type frontGatherer struct{ runDir string }

func (g frontGatherer) Gather() ([]*dto.MetricFamily, error) {
	c, err := dialControl(filepath.Join(g.runDir, frontSocketName))
	if err != nil {
		return nil, nil
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(frontControlTimeout))
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

// methodLabel returns method when this build knows it (a method of a service in the protobuf
// registry: every CRI method) and "unknown" otherwise, so a client inventing method names cannot grow
// the metric without bound.
func methodLabel(method string) string {
	svc, name, ok := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	if !ok {
		return "unknown"
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return "unknown"
	}
	if sd, ok := d.(protoreflect.ServiceDescriptor); !ok || sd.Methods().ByName(protoreflect.Name(name)) == nil {
		return "unknown"
	}
	return method
}

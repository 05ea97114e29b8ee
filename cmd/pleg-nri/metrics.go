package main

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/endpoint"
	"github.com/pleg-nri/pleg-nri/internal/promutil"
	"github.com/pleg-nri/pleg-nri/pleg"
	"github.com/pleg-nri/pleg-nri/plugin"
)

// metrics implements the measurement hooks of pleg/, plugin/, containerd/ and endpoint/ over Prometheus. Every
// method is cheap and never blocks: they run on NRI callbacks and on the event path.
type metrics struct {
	observations   *prometheus.CounterVec
	suppressed     *prometheus.CounterVec
	emitted        *prometheus.CounterVec
	corrected      *prometheus.CounterVec
	dropped        *prometheus.CounterVec
	emitLatency    *prometheus.HistogramVec
	sendLatency    prometheus.Histogram
	statusCalls    *prometheus.HistogramVec
	statusMismatch *prometheus.CounterVec
	subscribers    prometheus.Gauge
	queueDepth     *prometheus.GaugeVec
	coalesced      prometheus.Counter
	evicted        prometheus.Counter
	relist         *prometheus.HistogramVec
	repairs        *prometheus.CounterVec
	hookDuration   *prometheus.HistogramVec
	hookObs        *prometheus.CounterVec
	reconnects     *prometheus.CounterVec
	upstream       *prometheus.GaugeVec
	ckptRestore    *prometheus.CounterVec
	ckptRestored   prometheus.Gauge
	ckptWrites     *prometheus.CounterVec
	ckptWriteTime  prometheus.Histogram
	ckptBytes      prometheus.Gauge
	ckptObjects    prometheus.Gauge
	replayDropped  prometheus.Counter

	// nri, events and cri are the upstream connections' states (setUpstream).
	nri, events, cri upstreamState
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns = promutil.Namespace
	m := &metrics{
		observations: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "observations_total",
			Help: "Observations received, by input and object kind."}, []string{"source", "kind"}),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "observations_suppressed_total",
			Help: "Observations that changed nothing (duplicates, stale), by input and reason."}, []string{"source", "reason"}),
		emitted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "events_emitted_total",
			Help: "CRI container events emitted, by type, object kind and the input that caused them."}, []string{"type", "kind", "source"}),
		corrected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "events_corrected_total",
			Help: "Corrected STOPPED events (a late OOMKilled), by kind and input."}, []string{"kind", "source"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "objects_dropped_total",
			Help: "Objects forgotten without any event, by kind and reason."}, []string{"kind", "reason"}),
		emitLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "event_emit_latency_seconds",
			Help: "Time from the input's observation to the event's emission, by event type and source.", Buckets: promutil.LatencyBuckets}, []string{"type", "source"}),
		sendLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "event_send_latency_seconds",
			Help: "Time from the input's observation to the event's send to a subscriber.", Buckets: promutil.LatencyBuckets}),
		statusCalls: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "status_call_duration_seconds",
			Help: "CRI status calls made to containerd, by kind, purpose and result.", Buckets: promutil.LatencyBuckets}, []string{"kind", "verify", "result"}),
		statusMismatch: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "status_mismatches_total",
			Help: "Verification answers that differed from the status already emitted."}, []string{"kind"}),
		subscribers: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "subscribers",
			Help: "Event subscribers connected."}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "subscriber_queue_depth",
			Help: "Events queued for each subscriber."}, []string{"subscriber"}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "events_coalesced_total",
			Help: "Queued events replaced by a newer event of the same pod in a full subscriber queue."}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "subscribers_evicted_total",
			Help: "Subscribers disconnected with RESOURCE_EXHAUSTED for not keeping up."}),
		relist: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "relist_duration_seconds",
			Help: "Relists, by result.", Buckets: promutil.LatencyBuckets}, []string{"result"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "relist_repairs_total",
			Help: "Events emitted because a relist found what the event inputs missed."}, []string{"kind", "type"}),
		hookDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "hook_duration_seconds",
			Help:    "Time the NRI plugin took to handle a callback.",
			Buckets: []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2}}, []string{"callback"}),
		hookObs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "hook_observations_total",
			Help: "Observations made from NRI callbacks."}, []string{"callback"}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "upstream_reconnects_total",
			Help: "Reconnections after a lost upstream connection."}, []string{"upstream"}),
		upstream: promutil.NewUpstreamGauge(),
		ckptRestore: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "checkpoint_restores_total",
			Help: "Checkpoints read at startup, by result (restored, absent, unusable)."}, []string{"result"}),
		ckptRestored: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "checkpoint_restored_objects",
			Help: "Sandboxes and containers restored from the checkpoint at startup."}),
		ckptWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "checkpoint_writes_total",
			Help: "Checkpoint writes, by result."}, []string{"result"}),
		ckptWriteTime: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "checkpoint_write_duration_seconds",
			Help: "Time to encode and durably write the checkpoint.", Buckets: promutil.LatencyBuckets}),
		ckptBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "checkpoint_bytes",
			Help: "Size of the last checkpoint written."}),
		ckptObjects: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "checkpoint_objects",
			Help: "Sandboxes and containers in the last checkpoint written."}),
		replayDropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "startup_replay_dropped_total",
			Help: "Startup replay buffers dropped because they overflowed."}),
	}
	reg.MustRegister(m.observations, m.suppressed, m.emitted, m.corrected, m.dropped, m.emitLatency, m.sendLatency,
		m.statusCalls, m.statusMismatch, m.subscribers, m.queueDepth, m.coalesced, m.evicted, m.relist, m.repairs,
		m.hookDuration, m.hookObs, m.reconnects, m.upstream,
		m.ckptRestore, m.ckptRestored, m.ckptWrites, m.ckptWriteTime, m.ckptBytes, m.ckptObjects, m.replayDropped)
	for _, u := range []string{"nri", "events", "cri"} {
		m.upstream.WithLabelValues(u).Set(0)
	}
	return m
}

func eventType(t runtimeapi.ContainerEventType) string {
	switch t {
	case runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT:
		return "created"
	case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
		return "started"
	case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
		return "stopped"
	case runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
		return "deleted"
	}
	return t.String()
}

// pleg.Metrics

func (m *metrics) ObservationReceived(src pleg.Source, kind pleg.Kind) {
	m.observations.WithLabelValues(src.String(), kind.String()).Inc()
}

func (m *metrics) ObservationSuppressed(src pleg.Source, reason string) {
	m.suppressed.WithLabelValues(src.String(), reason).Inc()
}

func (m *metrics) EventEmitted(t runtimeapi.ContainerEventType, kind pleg.Kind, src pleg.Source, latency time.Duration) {
	m.emitted.WithLabelValues(eventType(t), kind.String(), src.String()).Inc()
	m.emitLatency.WithLabelValues(eventType(t), src.String()).Observe(latency.Seconds())
}

func (m *metrics) EventCorrected(kind pleg.Kind, src pleg.Source) {
	m.corrected.WithLabelValues(kind.String(), src.String()).Inc()
}

func (m *metrics) ObjectDropped(kind pleg.Kind, reason string) {
	m.dropped.WithLabelValues(kind.String(), reason).Inc()
}

func (m *metrics) StatusCall(kind pleg.Kind, verify bool, result string, d time.Duration) {
	m.statusCalls.WithLabelValues(kind.String(), strconv.FormatBool(verify), result).Observe(d.Seconds())
}

func (m *metrics) StatusMismatch(kind pleg.Kind) {
	m.statusMismatch.WithLabelValues(kind.String()).Inc()
}

func (m *metrics) Subscribers(n int) { m.subscribers.Set(float64(n)) }

func (m *metrics) SubscriberQueueDepth(id uint64, depth int) {
	m.queueDepth.WithLabelValues(strconv.FormatUint(id, 10)).Set(float64(depth))
}

func (m *metrics) SubscriberRemoved(id uint64) {
	m.queueDepth.DeleteLabelValues(strconv.FormatUint(id, 10))
}

func (m *metrics) EventsCoalesced(n int) { m.coalesced.Add(float64(n)) }

func (m *metrics) SubscriberEvicted(uint64) { m.evicted.Inc() }

func (m *metrics) RelistCompleted(d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.relist.WithLabelValues(result).Observe(d.Seconds())
}

func (m *metrics) RelistRepair(kind pleg.Kind, t runtimeapi.ContainerEventType) {
	m.repairs.WithLabelValues(kind.String(), eventType(t)).Inc()
}

func (m *metrics) CheckpointLoaded(objects int, result string) {
	m.ckptRestore.WithLabelValues(result).Inc()
	m.ckptRestored.Set(float64(objects))
}

func (m *metrics) CheckpointWritten(bytes, objects int, d time.Duration, err error) {
	if err != nil {
		m.ckptWrites.WithLabelValues("error").Inc()
		return
	}
	m.ckptWrites.WithLabelValues("ok").Inc()
	m.ckptWriteTime.Observe(d.Seconds())
	m.ckptBytes.Set(float64(bytes))
	m.ckptObjects.Set(float64(objects))
}

func (m *metrics) StartupReplayDropped() { m.replayDropped.Inc() }

// plugin.Metrics

func (m *metrics) HookDuration(cb plugin.Callback, d time.Duration) {
	m.hookDuration.WithLabelValues(cb.String()).Observe(d.Seconds())
}

func (m *metrics) Observations(cb plugin.Callback, n int) {
	m.hookObs.WithLabelValues(cb.String()).Add(float64(n))
}

func (m *metrics) ConnectionState(up bool) { m.setUpstream("nri", &m.nri, up) }

func (m *metrics) Reconnected() { m.reconnects.WithLabelValues("nri").Inc() }

// coreProxyMetrics adapts metrics to endpoint.Metrics for the core's event socket, whose client is
// the front: the send latency (source to the core's socket) and the runtime connection (for /readyz).
// Forwarded calls and the kubelet's streams are the front's (endpointMetrics).
type coreProxyMetrics struct {
	*metrics
	endpoint.NopMetrics
}

func (p coreProxyMetrics) EventSent(latency time.Duration) {
	p.sendLatency.Observe(latency.Seconds())
}

func (p coreProxyMetrics) UpstreamConnectionState(up bool) { p.metrics.UpstreamConnectionState(up) }

func (m *metrics) UpstreamConnectionState(up bool) { m.setUpstream("cri", &m.cri, up) }

// upstreamState is one upstream connection's state.
type upstreamState struct {
	// up is the current state; seen is set once it has been up, so only later connections count as
	// reconnects.
	up, seen atomic.Bool
}

// setUpstream records an upstream connection going up or down. NRI reconnects are counted by the
// plugin itself (Reconnected).
func (m *metrics) setUpstream(name string, st *upstreamState, up bool) {
	if up && !st.up.Load() && st.seen.Swap(true) && name != "nri" {
		m.reconnects.WithLabelValues(name).Inc()
	}
	st.up.Store(up)
	promutil.SetGauge(m.upstream.WithLabelValues(name), up)
}

// newUpstreamGauge is pleg_nri_upstream_connected, which the core (nri, events, cri) and the front
// (front_cri) both keep: one scrape merges the two, so both declare it alike.
var (
	_ pleg.Metrics     = (*metrics)(nil)
	_ plugin.Metrics   = (*metrics)(nil)
	_ endpoint.Metrics = coreProxyMetrics{}
)

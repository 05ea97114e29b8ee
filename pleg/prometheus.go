package pleg

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/promutil"
)

// PrometheusMetrics are the core's metrics in Prometheus: its Metrics and OOMCheckMetrics, and the
// latency of each event's send (EventSent, measured where the core's event socket sends it). Every
// method is cheap and never blocks: they run on NRI callbacks and on the event path.
type PrometheusMetrics struct {
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
	evicted        *prometheus.CounterVec
	relist         *prometheus.HistogramVec
	repairs        *prometheus.CounterVec
	repairsLate    *prometheus.CounterVec
	ckptRestore    *prometheus.CounterVec
	ckptRestored   prometheus.Gauge
	ckptWrites     *prometheus.CounterVec
	ckptWriteTime  prometheus.Histogram
	ckptBytes      prometheus.Gauge
	ckptObjects    prometheus.Gauge
	replayDropped  prometheus.Counter
	oomChecks      *prometheus.HistogramVec
}

var (
	_ Metrics         = (*PrometheusMetrics)(nil)
	_ OOMCheckMetrics = (*PrometheusMetrics)(nil)
)

// NewPrometheusMetrics registers the core's metrics on reg.
func NewPrometheusMetrics(reg prometheus.Registerer) *PrometheusMetrics {
	const ns = promutil.Namespace
	m := &PrometheusMetrics{
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
		evicted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "subscribers_evicted_total",
			Help: "Subscribers disconnected with RESOURCE_EXHAUSTED for not keeping up, by reason (queue_full, stalled)."}, []string{"reason"}),
		relist: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "relist_duration_seconds",
			Help: "Relists, by result.", Buckets: promutil.LatencyBuckets}, []string{"result"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "relist_repairs_total",
			Help: "Events emitted because a relist found what the event inputs missed."}, []string{"kind", "type"}),
		repairsLate: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "relist_repairs_late_input_total",
			Help: "Relist repairs whose transition an event input (NRI, a task event) reported afterwards: the input was late, not missing."}, []string{"kind", "type"}),
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
		oomChecks: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "oom_check_duration_seconds", Buckets: promutil.LatencyBuckets,
			Help: "OOM checks (containerd task metrics) of exits with status 137 before their STOPPED, by result."}, []string{"result"}),
	}
	reg.MustRegister(m.observations, m.suppressed, m.emitted, m.corrected, m.dropped, m.emitLatency, m.sendLatency,
		m.statusCalls, m.statusMismatch, m.subscribers, m.queueDepth, m.coalesced, m.evicted, m.relist, m.repairs, m.repairsLate,
		m.ckptRestore, m.ckptRestored, m.ckptWrites, m.ckptWriteTime, m.ckptBytes, m.ckptObjects, m.replayDropped, m.oomChecks)
	// Repairs exist from the start (at 0): a dashboard shows 0 on a node that never needed one, and the
	// alert on their increase sees the first one.
	for _, kind := range []Kind{KindSandbox, KindContainer} {
		for _, t := range []runtimeapi.ContainerEventType{runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT,
			runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
			runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT} {
			m.repairs.WithLabelValues(kind.String(), eventType(t))
		}
	}
	// So do evictions, for the same reasons (the alert on their increase).
	for _, reason := range []string{EvictedQueueFull, EvictedStalled} {
		m.evicted.WithLabelValues(reason)
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

func (m *PrometheusMetrics) ObservationReceived(src Source, kind Kind) {
	m.observations.WithLabelValues(src.String(), kind.String()).Inc()
}

func (m *PrometheusMetrics) ObservationSuppressed(src Source, reason string) {
	m.suppressed.WithLabelValues(src.String(), reason).Inc()
}

func (m *PrometheusMetrics) EventEmitted(t runtimeapi.ContainerEventType, kind Kind, src Source, latency time.Duration) {
	m.emitted.WithLabelValues(eventType(t), kind.String(), src.String()).Inc()
	m.emitLatency.WithLabelValues(eventType(t), src.String()).Observe(latency.Seconds())
}

func (m *PrometheusMetrics) EventCorrected(kind Kind, src Source) {
	m.corrected.WithLabelValues(kind.String(), src.String()).Inc()
}

func (m *PrometheusMetrics) ObjectDropped(kind Kind, reason string) {
	m.dropped.WithLabelValues(kind.String(), reason).Inc()
}

func (m *PrometheusMetrics) StatusCall(kind Kind, verify bool, result string, d time.Duration) {
	m.statusCalls.WithLabelValues(kind.String(), strconv.FormatBool(verify), result).Observe(d.Seconds())
}

func (m *PrometheusMetrics) StatusMismatch(kind Kind) {
	m.statusMismatch.WithLabelValues(kind.String()).Inc()
}

func (m *PrometheusMetrics) Subscribers(n int) { m.subscribers.Set(float64(n)) }

func (m *PrometheusMetrics) SubscriberQueueDepth(id uint64, depth int) {
	m.queueDepth.WithLabelValues(strconv.FormatUint(id, 10)).Set(float64(depth))
}

func (m *PrometheusMetrics) SubscriberRemoved(id uint64) {
	m.queueDepth.DeleteLabelValues(strconv.FormatUint(id, 10))
}

func (m *PrometheusMetrics) EventsCoalesced(n int) { m.coalesced.Add(float64(n)) }

func (m *PrometheusMetrics) SubscriberEvicted(_ uint64, reason string) {
	m.evicted.WithLabelValues(reason).Inc()
}

func (m *PrometheusMetrics) RelistCompleted(d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.relist.WithLabelValues(result).Observe(d.Seconds())
}

func (m *PrometheusMetrics) RelistRepair(kind Kind, t runtimeapi.ContainerEventType) {
	m.repairs.WithLabelValues(kind.String(), eventType(t)).Inc()
}

func (m *PrometheusMetrics) RelistRepairLate(kind Kind, t runtimeapi.ContainerEventType) {
	m.repairsLate.WithLabelValues(kind.String(), eventType(t)).Inc()
}

func (m *PrometheusMetrics) CheckpointLoaded(objects int, result string) {
	m.ckptRestore.WithLabelValues(result).Inc()
	m.ckptRestored.Set(float64(objects))
}

func (m *PrometheusMetrics) CheckpointWritten(bytes, objects int, d time.Duration, err error) {
	if err != nil {
		m.ckptWrites.WithLabelValues("error").Inc()
		return
	}
	m.ckptWrites.WithLabelValues("ok").Inc()
	m.ckptWriteTime.Observe(d.Seconds())
	m.ckptBytes.Set(float64(bytes))
	m.ckptObjects.Set(float64(objects))
}

func (m *PrometheusMetrics) StartupReplayDropped() { m.replayDropped.Inc() }

// OOMCheckCall is OOMCheckMetrics' hook.
func (m *PrometheusMetrics) OOMCheckCall(result string, d time.Duration) {
	m.oomChecks.WithLabelValues(result).Observe(d.Seconds())
}

// EventSent records the time from an event's input to its send to a subscriber.
func (m *PrometheusMetrics) EventSent(latency time.Duration) {
	m.sendLatency.Observe(latency.Seconds())
}

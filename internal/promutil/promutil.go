// Package promutil holds what the Prometheus metrics of pleg-nri's packages share: the namespace, the
// buckets, the upstream gauge, the process collectors, a bounded method label and the text encoding.
package promutil

import (
	"io"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Namespace prefixes every metric of pleg-nri's, the core's and the front's.
const Namespace = "pleg_nri"

// LatencyBuckets are the buckets of every latency histogram but the NRI callbacks'.
var LatencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// newUpstreamGauge returns pleg_nri_upstream_connected, by upstream (for Upstreams). The core and the front register
// one each, in their own processes; one scrape of the core shows both.
func newUpstreamGauge() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "upstream_connected",
		Help: "1 while the upstream connection is up: the core's to containerd's NRI (nri), task events (events) and CRI (cri); the front's to containerd's CRI, for the kubelet's forwarded calls (front_cri)."},
		[]string{"upstream"})
}

// Upstreams keeps pleg_nri_upstream_connected and pleg_nri_upstream_reconnects_total of one process,
// for every package that holds an upstream connection: each sets its own by name. It is safe for
// concurrent use.
type Upstreams struct {
	connected  *prometheus.GaugeVec
	reconnects *prometheus.CounterVec
	// mu guards seen and up.
	mu sync.Mutex
	// seen holds the upstreams that have been up once (only later connections are reconnects); up their
	// current state.
	seen, up map[string]bool
}

// NewUpstreams registers the upstream metrics on reg, with the named upstreams down.
func NewUpstreams(reg prometheus.Registerer, names ...string) *Upstreams {
	u := &Upstreams{connected: newUpstreamGauge(),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "upstream_reconnects_total",
			Help: "Reconnections after a lost upstream connection."}, []string{"upstream"}),
		seen: map[string]bool{}, up: map[string]bool{}}
	reg.MustRegister(u.connected, u.reconnects)
	for _, n := range names {
		u.connected.WithLabelValues(n).Set(0)
		u.reconnects.WithLabelValues(n)
	}
	return u
}

// Set records the upstream name going up or down; a connection up again after one was lost counts as a
// reconnect, unless counted says the caller counts its reconnects itself (Reconnected).
func (u *Upstreams) Set(name string, up, counted bool) {
	u.mu.Lock()
	if up && !u.up[name] && u.seen[name] && !counted {
		u.reconnects.WithLabelValues(name).Inc()
	}
	u.seen[name] = u.seen[name] || up
	u.up[name] = up
	u.mu.Unlock()
	setGauge(u.connected.WithLabelValues(name), up)
}

// Reconnected counts a reconnect of the upstream name, for a caller that knows better than its states.
func (u *Upstreams) Reconnected(name string) { u.reconnects.WithLabelValues(name).Inc() }

// RegisterProcessCollectors registers the Go runtime's and the process's metrics, labelled with the
// process (core or front): one scrape shows both processes'.
func RegisterProcessCollectors(reg prometheus.Registerer, process string) {
	prometheus.WrapRegistererWith(prometheus.Labels{"process": process}, reg).MustRegister(
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

// setGauge sets a gauge that is 1 while up and 0 otherwise.
func setGauge(g prometheus.Gauge, up bool) {
	if up {
		g.Set(1)
	} else {
		g.Set(0)
	}
}

// MethodLabel returns method when this build knows it (a method of a service in the protobuf
// registry: every CRI method) and "unknown" otherwise, so a client inventing method names cannot grow
// a metric without bound.
func MethodLabel(method string) string {
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

// Write writes what g gathers in the Prometheus text format.
func Write(w io.Writer, g prometheus.Gatherer) error {
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

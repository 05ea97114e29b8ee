// Package promutil holds what the Prometheus metrics of pleg-nri's packages share: the namespace, the
// buckets, the upstream gauge, the process collectors, a bounded method label and the text encoding.
package promutil

import (
	"io"
	"strings"

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

// NewUpstreamGauge returns pleg_nri_upstream_connected, by upstream. The core and the front register
// one each, in their own processes; one scrape of the core shows both.
func NewUpstreamGauge() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "upstream_connected",
		Help: "1 while the upstream connection is up: the core's to containerd's NRI (nri), task events (events) and CRI (cri); the front's to containerd's CRI, for the kubelet's forwarded calls (front_cri)."},
		[]string{"upstream"})
}

// RegisterProcessCollectors registers the Go runtime's and the process's metrics, labelled with the
// process (core or front): one scrape shows both processes'.
func RegisterProcessCollectors(reg prometheus.Registerer, process string) {
	prometheus.WrapRegistererWith(prometheus.Labels{"process": process}, reg).MustRegister(
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

// SetGauge sets a gauge that is 1 while up and 0 otherwise.
func SetGauge(g prometheus.Gauge, up bool) {
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

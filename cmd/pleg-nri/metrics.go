package main

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-nri/pleg-nri/eventbridge/front"
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

// buildInfo is pleg_nri_build_info: 1 for each process, labelled with its version. The core's is this
// process's; the front's is asked on its control socket at each scrape (a front is kept across
// upgrades of the core, so the two differ after one), and absent while no front answers.
type buildInfo struct {
	desc   *prometheus.Desc
	runDir string
}

// registerBuildInfo registers pleg_nri_build_info of the core and of the front of runDir on reg.
func registerBuildInfo(reg prometheus.Registerer, runDir string) {
	reg.MustRegister(buildInfo{runDir: runDir, desc: prometheus.NewDesc("pleg_nri_build_info",
		"1 for each pleg-nri process (core, front) that runs, with its version", []string{"process", "version"}, nil)})
}

func (b buildInfo) Describe(ch chan<- *prometheus.Desc) { ch <- b.desc }

func (b buildInfo) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(b.desc, prometheus.GaugeValue, 1, "core", version)
	if info, err := front.Query(b.runDir, "info"); err == nil {
		ch <- prometheus.MustNewConstMetric(b.desc, prometheus.GaugeValue, 1, "front", info.Version)
	}
}

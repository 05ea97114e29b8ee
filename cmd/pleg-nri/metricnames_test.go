package main

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/runningcore"
	"github.com/pleg-nri/pleg-nri/eventbridge/front"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/internal/promutil"
	"github.com/pleg-nri/pleg-nri/pleg"
	"github.com/pleg-nri/pleg-nri/plugin"
)

// recordingRegisterer keeps every collector registered on it.
type recordingRegisterer struct{ collectors []prometheus.Collector }

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}

func (r *recordingRegisterer) Unregister(prometheus.Collector) bool { return false }

// exposedNames returns every sample name the daemon's /metrics can show: the metrics its packages
// register (whether or not they have samples yet), the front's (the kubelet's endpoint, which the
// core's /metrics serves with its own), with a histogram's _bucket, _sum and _count, and the Go and
// process collectors' names.
func exposedNames(t *testing.T) map[string]bool {
	t.Helper()
	var reg recordingRegisterer
	upstreams := promutil.NewUpstreams(&reg, "nri", "events", "cri")
	pleg.NewPrometheusMetrics(&reg)
	plugin.NewPrometheusMetrics(&reg, upstreams)
	kubelet.NewPrometheusMetrics(&reg, upstreams, "front_cri")
	front.NewSupervisorMetrics(&reg)
	kubelet.NewRefusedPeersMetric(&reg)
	runningcore.RegisterBuildInfo(&reg, "/nonexistent", version)
	names := map[string]bool{}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, c := range reg.collectors {
		_, histogram := c.(prometheus.Histogram)
		if _, ok := c.(*prometheus.HistogramVec); ok {
			histogram = true
		}
		ch := make(chan *prometheus.Desc, 8)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no name in %s", d)
			}
			names[m[1]] = true
			if histogram {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					names[m[1]+s] = true
				}
			}
		}
	}
	procs := prometheus.NewRegistry()
	promutil.RegisterProcessCollectors(procs, "core")
	mfs, err := procs.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
		if mf.GetType() == dto.MetricType_HISTOGRAM || mf.GetType() == dto.MetricType_SUMMARY {
			names[mf.GetName()+"_sum"], names[mf.GetName()+"_count"], names[mf.GetName()+"_bucket"] = true, true, true
		}
	}
	for _, known := range []string{"pleg_nri_event_send_latency_seconds_bucket", "pleg_nri_hook_duration_seconds_count",
		"pleg_nri_forwarded_call_duration_seconds_bucket", "pleg_nri_upstream_connected", "process_resident_memory_bytes"} {
		if !names[known] {
			t.Fatalf("the names found miss %s: %v", known, names)
		}
	}
	return names
}

// metricRef finds the metric names a PromQL expression uses (pleg-nri's, the Go and process
// collectors', and the kubelet's).
var metricRef = regexp.MustCompile(`\b(pleg_nri_[a-z0-9_]+|process_[a-z0-9_]+|go_[a-z0-9_]+|kubelet_[a-z0-9_]+)\b`)

// checkExprs fails the test for each metric an expression names that the daemon does not expose.
// kubelet_ names are the kubelet's (test/deploy checks them against the kubelet's source).
func checkExprs(t *testing.T, where string, exprs []string, names map[string]bool) map[string]bool {
	t.Helper()
	used := map[string]bool{}
	if len(exprs) == 0 {
		t.Fatalf("%s: no expressions found", where)
	}
	for _, e := range exprs {
		for _, n := range metricRef.FindAllString(e, -1) {
			used[n] = true
			if !strings.HasPrefix(n, "kubelet_") && !names[n] {
				t.Errorf("%s: %q names %s, which pleg-nri's /metrics does not have", where, e, n)
			}
		}
	}
	return used
}

// TestRulesAndDashboardMetricsExist: every metric the Prometheus rules and the Grafana dashboard
// query exists in the daemon's registry.
func TestRulesAndDashboardMetricsExist(t *testing.T) {
	names := exposedNames(t)

	data, err := os.ReadFile("../../deploy/prometheus/pleg-nri-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	checkExprs(t, "pleg-nri-rules.yaml", exprs, names)

	data, err = os.ReadFile("../../deploy/grafana/pleg-nri-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	exprs = nil
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	used := checkExprs(t, "pleg-nri-dashboard.json", exprs, names)
	// The dashboard shows the metrics the alerts are about.
	for _, n := range []string{"pleg_nri_events_emitted_total", "pleg_nri_event_send_latency_seconds_bucket", "pleg_nri_upstream_connected",
		"pleg_nri_subscribers_evicted_total", "pleg_nri_relist_repairs_total", "pleg_nri_hook_duration_seconds_bucket"} {
		if !used[n] {
			t.Errorf("the dashboard does not show %s", n)
		}
	}
}

// TestMetricNamesFindsUnknown: the check catches a metric that does not exist.
func TestMetricNamesFindsUnknown(t *testing.T) {
	names := exposedNames(t)
	var missing []string
	for _, e := range []string{"rate(pleg_nri_events_emited_total[5m])", "pleg_nri_subscribers"} {
		for _, n := range metricRef.FindAllString(e, -1) {
			if !names[n] {
				missing = append(missing, n)
			}
		}
	}
	sort.Strings(missing)
	if strings.Join(missing, ",") != "pleg_nri_events_emited_total" {
		t.Errorf("missing = %v, want only the misspelled one", missing)
	}
}

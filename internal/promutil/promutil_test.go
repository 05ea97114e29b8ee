package promutil

import (
	"bytes"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	_ "k8s.io/cri-api/pkg/apis/runtime/v1" // registers the CRI's services
)

func TestMethodLabel(t *testing.T) {
	for method, want := range map[string]string{
		"/runtime.v1.RuntimeService/Version":            "/runtime.v1.RuntimeService/Version",
		"/runtime.v1.ImageService/PullImage":            "/runtime.v1.ImageService/PullImage",
		"/runtime.v1.RuntimeService/NoSuchMethod":       "unknown",
		"/made.up.Service/Anything":                     "unknown",
		"garbage":                                       "unknown",
		"/runtime.v1.RuntimeService/GetContainerEvents": "/runtime.v1.RuntimeService/GetContainerEvents",
	} {
		if got := MethodLabel(method); got != want {
			t.Errorf("MethodLabel(%q) = %q, want %q", method, got, want)
		}
	}
}

func TestWriteAndGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	up := newUpstreamGauge()
	reg.MustRegister(up)
	setGauge(up.WithLabelValues("cri"), true)
	setGauge(up.WithLabelValues("nri"), false)
	RegisterProcessCollectors(reg, "test")
	var b bytes.Buffer
	if err := Write(&b, reg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`pleg_nri_upstream_connected{upstream="cri"} 1`, `pleg_nri_upstream_connected{upstream="nri"} 0`,
		`go_goroutines{process="test"}`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the text format lacks %q", want)
		}
	}
}

// TestUpstreams: a connection up again after one was lost is a reconnect, unless its owner counts its
// reconnects itself; the named upstreams start down.
func TestUpstreams(t *testing.T) {
	reg := prometheus.NewRegistry()
	u := NewUpstreams(reg, "cri", "nri", "idle")
	for _, up := range []bool{true, false, true, true, false, true} {
		u.Set("cri", up, false)
		u.Set("nri", up, true)
	}
	u.Reconnected("nri")
	var b bytes.Buffer
	if err := Write(&b, reg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`pleg_nri_upstream_connected{upstream="cri"} 1`, `pleg_nri_upstream_connected{upstream="idle"} 0`,
		`pleg_nri_upstream_reconnects_total{upstream="cri"} 2`, `pleg_nri_upstream_reconnects_total{upstream="nri"} 1`} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Errorf("the metrics lack %s:\n%s", want, b.String())
		}
	}
}

// TestSeriesFromTheStart: the series dashboards and alerts read exist, at 0, as soon as the metrics are
// registered, before anything happened (a panel has data; an alert on an increase sees the first one).
func TestSeriesFromTheStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewUpstreams(reg, "nri", "events")
	var b bytes.Buffer
	if err := Write(&b, reg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`pleg_nri_upstream_reconnects_total{upstream="nri"} 0`, `pleg_nri_upstream_reconnects_total{upstream="events"} 0`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %s in:\n%s", want, b.String())
		}
	}
}

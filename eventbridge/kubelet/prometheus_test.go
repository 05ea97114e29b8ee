package kubelet

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/pleg-nri/pleg-nri/internal/promutil"
)

// TestPrometheusMetrics: each hook shows in the metrics the operations guide names.
func TestPrometheusMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewPrometheusMetrics(reg, promutil.NewUpstreams(reg, "front_cri"), "front_cri")
	m.ForwardedCall("/runtime.v1.RuntimeService/Version", codes.OK, time.Millisecond)
	m.ForwardedCall("/made.up/Method", codes.Unimplemented, time.Millisecond)
	m.EventStreamOpened()
	m.EventStreamOpened()
	m.EventStreamClosed(codes.Canceled)
	m.EventStreamRefused(StreamLimitConnection)
	m.EventSent(time.Millisecond)
	m.RuntimeConnectionState(true)
	m.RuntimeConnectionState(false)
	m.RuntimeConnectionState(true)
	m.OverlaidRead("/runtime.v1.RuntimeService/ContainerStatus")
	m.Resubscribed()
	m.CoreGone()
	var b bytes.Buffer
	if err := promutil.Write(&b, reg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`pleg_nri_forwarded_call_duration_seconds_count{code="OK",method="/runtime.v1.RuntimeService/Version"} 1`,
		`pleg_nri_forwarded_call_duration_seconds_count{code="Unimplemented",method="unknown"} 1`,
		`pleg_nri_event_streams 1`,
		`pleg_nri_event_streams_closed_total{code="Canceled"} 1`,
		`pleg_nri_event_streams_refused_total{limit="connection"} 1`,
		`pleg_nri_upstream_connected{upstream="front_cri"} 1`,
		`pleg_nri_upstream_reconnects_total{upstream="front_cri"} 1`,
		`pleg_nri_overlaid_reads_total{method="/runtime.v1.RuntimeService/ContainerStatus"} 1`,
		`pleg_nri_front_resubscriptions_total 1`,
		`pleg_nri_event_streams_core_gone_total 1`,
	} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Errorf("the metrics lack %s:\n%s", want, b.String())
		}
	}
}

// TestPrometheusSeriesFromTheStart: overlaid reads and stream ends by their usual codes exist at 0 once
// the metrics are registered, so that the dashboard's panels have data and an alert on their increase
// sees the first one.
func TestPrometheusSeriesFromTheStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewPrometheusMetrics(reg, promutil.NewUpstreams(reg, "cri"), "cri")
	var b bytes.Buffer
	if err := promutil.Write(&b, reg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`pleg_nri_overlaid_reads_total{method="/runtime.v1.RuntimeService/ContainerStatus"} 0`,
		`pleg_nri_event_streams_closed_total{code="Unavailable"} 0`,
		`pleg_nri_event_streams_closed_total{code="ResourceExhausted"} 0`,
		`pleg_nri_event_streams_core_gone_total 0`,
		`pleg_nri_event_streams_refused_total{limit="total"} 0`,
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %s", want)
		}
	}
}

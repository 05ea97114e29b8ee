package pleg

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/promutil"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// TestPrometheusMetrics: each hook shows in the metric the operations guide names, with its labels.
func TestPrometheusMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewPrometheusMetrics(reg)
	m.ObservationReceived(SourceNRI, KindContainer)
	m.ObservationSuppressed(SourceTaskEvent, SuppressDuplicate)
	m.EventEmitted(runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, KindContainer, SourceTaskEvent, time.Millisecond)
	m.EventCorrected(KindContainer, SourceStatus)
	m.ObjectDropped(KindSandbox, DropSandboxGone)
	m.StatusCall(KindContainer, true, StatusResultOK, time.Millisecond)
	m.StatusMismatch(KindContainer)
	m.Subscribers(2)
	m.SubscriberQueueDepth(7, 3)
	m.SubscriberQueueDepth(8, 1)
	m.SubscriberRemoved(8)
	m.EventsCoalesced(4)
	m.SubscriberEvicted(7, EvictedStalled)
	m.RelistCompleted(time.Millisecond, nil)
	m.RelistCompleted(time.Millisecond, errors.New("down"))
	m.RelistRepair(KindContainer, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT)
	m.CheckpointLoaded(12, CheckpointRestored)
	m.CheckpointWritten(100, 12, time.Millisecond, nil)
	m.CheckpointWritten(0, 0, 0, errors.New("disk full"))
	m.StartupReplayDropped()
	m.OOMCheckCall("oom", time.Millisecond)
	m.EventSent(time.Millisecond)
	var b strings.Builder
	if err := promutil.Write(&b, reg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`pleg_nri_observations_total{kind="container",source="nri"} 1`,
		`pleg_nri_observations_suppressed_total{reason="duplicate",source="task_event"} 1`,
		`pleg_nri_events_emitted_total{kind="container",source="task_event",type="stopped"} 1`,
		`pleg_nri_event_emit_latency_seconds_count{source="task_event",type="stopped"} 1`,
		`pleg_nri_events_corrected_total{kind="container",source="status"} 1`,
		`pleg_nri_objects_dropped_total{kind="sandbox",reason="sandbox_gone"} 1`,
		`pleg_nri_status_call_duration_seconds_count{kind="container",result="ok",verify="true"} 1`,
		`pleg_nri_status_mismatches_total{kind="container"} 1`,
		`pleg_nri_subscribers 2`,
		`pleg_nri_subscriber_queue_depth{subscriber="7"} 3`,
		`pleg_nri_events_coalesced_total 4`,
		`pleg_nri_subscribers_evicted_total{reason="stalled"} 1`,
		`pleg_nri_relist_duration_seconds_count{result="ok"} 1`,
		`pleg_nri_relist_duration_seconds_count{result="error"} 1`,
		`pleg_nri_relist_repairs_total{kind="container",type="deleted"} 1`,
		`pleg_nri_checkpoint_restores_total{result="restored"} 1`,
		`pleg_nri_checkpoint_restored_objects 12`,
		`pleg_nri_checkpoint_writes_total{result="ok"} 1`,
		`pleg_nri_checkpoint_writes_total{result="error"} 1`,
		`pleg_nri_checkpoint_bytes 100`,
		`pleg_nri_checkpoint_objects 12`,
		`pleg_nri_startup_replay_dropped_total 1`,
		`pleg_nri_oom_check_duration_seconds_count{result="oom"} 1`,
		`pleg_nri_event_send_latency_seconds_count 1`,
	} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Errorf("the metrics lack %s", want)
		}
	}
	if strings.Contains(b.String(), `subscriber="8"`) {
		t.Error("a removed subscriber's queue depth is still exposed")
	}
}

// TestQueueDepthFromTheSubscription: a subscriber's queue depth is exposed, at 0, as soon as it
// subscribes (before any event, and after a replay that queued nothing), and goes with it.
func TestQueueDepthFromTheSubscription(t *testing.T) {
	for _, replay := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		f := newFanout(4, NewPrometheusMetrics(reg))
		if replay {
			f.startReplay(testutil.NewClock().Now, 1<<62)
		}
		s := f.subscribe()
		var b strings.Builder
		if err := promutil.Write(&b, reg); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("pleg_nri_subscriber_queue_depth{subscriber=\"%d\"} 0\n", s.id); !strings.Contains(b.String(), want) {
			t.Errorf("replay %v: the metrics lack %s", replay, want)
		}
		f.remove(s)
		b.Reset()
		if err := promutil.Write(&b, reg); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(b.String(), "pleg_nri_subscriber_queue_depth{") {
			t.Errorf("replay %v: a removed subscriber's queue depth is still exposed", replay)
		}
	}
}

// TestRepairsFromTheStart: every kind and type of relist repair, and every reason of an eviction,
// exists at 0 once registered.
func TestRepairsFromTheStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewPrometheusMetrics(reg)
	var b strings.Builder
	if err := promutil.Write(&b, reg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`pleg_nri_relist_repairs_total{kind="sandbox",type="created"} 0`,
		`pleg_nri_relist_repairs_total{kind="container",type="stopped"} 0`,
		`pleg_nri_subscribers_evicted_total{reason="queue_full"} 0`, `pleg_nri_subscribers_evicted_total{reason="stalled"} 0`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %s", want)
		}
	}
}

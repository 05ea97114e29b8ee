package pleg

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// typedEvent is an event of type t of pod uid about container id.
func typedEvent(uid, id string, t runtimeapi.ContainerEventType) Event {
	ev := podEvent(uid, id)
	ev.Response.ContainerEventType = t
	return ev
}

// TestCoalesceKeepsStartedAndStopped (issue 11, item 4): a full queue coalesces a pod's events, but a
// CREATED or DELETED never replaces a STARTED or STOPPED the subscriber has not read (the kubelet acts
// on those two, writes nothing for a CREATED and deletes its cache entry on a sandbox DELETED), and a
// STARTED never replaces a STOPPED (kubelet 1.37 acts on STOPPED only). A CREATED is replaced by any
// newer event of its pod; a STARTED or STOPPED by a newer one of the same or a later kind.
func TestCoalesceKeepsStartedAndStopped(t *testing.T) {
	type ev struct {
		pod, id string
		t       runtimeapi.ContainerEventType
	}
	for _, tc := range []struct {
		name    string
		limit   int
		publish []ev
		want    []string
		evicted int
	}{
		{"DELETED after STOPPED", 2, []ev{{"a", "stop", evStopped}, {"a", "c2", evCreated}, {"a", "del", evDeleted}}, []string{"stop", "del"}, 0},
		{"CREATED after STARTED", 2, []ev{{"a", "start", evStarted}, {"b", "b1", evStarted}, {"a", "new", evCreated}}, nil, 1},
		{"STARTED after STOPPED", 2, []ev{{"a", "stop", evStopped}, {"b", "b1", evStarted}, {"a", "start", evStarted}}, nil, 1},
		{"STOPPED after STARTED and CREATED", 3, []ev{{"a", "c", evCreated}, {"a", "s", evStarted}, {"b", "b1", evStopped}, {"a", "x", evStopped}}, []string{"b1", "x"}, 0},
		{"STOPPED after STOPPED", 2, []ev{{"a", "x1", evStopped}, {"a", "x2", evStopped}, {"a", "x3", evStopped}}, []string{"x3"}, 0},
		{"DELETED after DELETED", 2, []ev{{"a", "d1", evDeleted}, {"a", "d2", evDeleted}, {"a", "d3", evDeleted}}, []string{"d3"}, 0},
		{"STARTED after DELETED", 2, []ev{{"a", "d1", evDeleted}, {"a", "c1", evCreated}, {"a", "s1", evStarted}}, []string{"s1"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, replay := range []bool{false, true} {
				m := newCountingMetrics()
				f := newFanout(tc.limit, m)
				var s *Subscription
				if replay {
					f.startReplay(testutil.NewClock().Now, 1<<62)
				} else {
					s = f.subscribe()
				}
				for _, e := range tc.publish {
					f.publish(context.Background(), typedEvent(e.pod, e.id, e.t))
				}
				if replay {
					if !f.replay.open.Load() {
						if tc.evicted == 0 {
							t.Errorf("replay: dropped, want %v", tc.want)
						}
						continue
					}
					s = f.subscribe()
				}
				got := ids(pending(s))
				if tc.evicted > 0 && !replay {
					got = nil
				}
				if d := cmp.Diff(tc.want, got); d != "" {
					t.Errorf("replay=%v: queue (-want +got):\n%s", replay, d)
				}
				if !replay && m.evicted != tc.evicted {
					t.Errorf("evicted %d, want %d", m.evicted, tc.evicted)
				}
				s.Close()
			}
		})
	}
}

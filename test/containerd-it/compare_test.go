package containerdit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// sideBySide is one scenario's setup: pleg-nri running, containerd's own stream and pleg-nri's
// recorded at once, and a CRI client (through pleg-nri's endpoint, as the kubelet would use it).
type sideBySide struct {
	t      *testing.T
	p      *plegNRI
	theirs *eventRecorder
	ours   *eventRecorder
	c      *cri
	// pods are the uids of the pods the scenario made: only their events are compared.
	pods map[string]bool
}

func newSideBySide(t *testing.T) *sideBySide {
	t.Helper()
	logOnFailure(t)
	p := startPlegNRI(t)
	s := &sideBySide{t: t, p: p, pods: map[string]bool{}}
	s.theirs = recordEvents(t, env.Address)
	s.ours = recordEvents(t, p.Socket)
	s.c = newCRI(t, p.Socket)
	return s
}

// runPod runs a pod through pleg-nri's endpoint and remembers it for the comparison.
func (s *sideBySide) runPod(name string) (string, *runtimeapi.PodSandboxConfig) {
	id, cfg := s.c.runPod(name)
	s.pods[cfg.Metadata.Uid] = true
	return id, cfg
}

// eventKey is what the multiset comparison counts.
type eventKey struct {
	ID   string
	Type runtimeapi.ContainerEventType
}

func (k eventKey) String() string { return fmt.Sprintf("%s:%s", short(k.ID), k.Type) }

// mine filters a recording to the scenario's pods.
func (s *sideBySide) mine(evs []*runtimeapi.ContainerEventResponse) []*runtimeapi.ContainerEventResponse {
	var out []*runtimeapi.ContainerEventResponse
	for _, ev := range evs {
		if s.pods[ev.PodSandboxStatus.GetMetadata().GetUid()] {
			out = append(out, ev)
		}
	}
	return out
}

func multiset(evs []*runtimeapi.ContainerEventResponse) map[eventKey]int {
	m := map[eventKey]int{}
	for _, ev := range evs {
		m[eventKey{ev.ContainerId, ev.ContainerEventType}]++
	}
	return m
}

// waitBoth waits until both streams hold every key of want at least once.
func (s *sideBySide) waitBoth(want ...eventKey) {
	s.t.Helper()
	for _, r := range []*eventRecorder{s.theirs, s.ours} {
		for _, k := range want {
			r.wait(s.t, k.ID, k.Type)
		}
	}
}

// extra names an event pleg-nri may send beyond containerd's stream, and why.
type extra struct {
	key    eventKey
	reason string
}

// compare asserts the claims over the scenario's events, after a short settle time:
//  1. the multiset of (type, id) is equal between containerd's stream and pleg-nri's, but for the
//     named extras;
//  2. every pleg-nri event has a sandbox status with metadata, and a status for every container of the
//     sandbox that exists at that point;
//  3. created_at is in nanoseconds and strictly increasing per pod (assertPerPodMonotonic).
func (s *sideBySide) compare(extras ...extra) {
	s.t.Helper()
	time.Sleep(500 * time.Millisecond)
	theirs, ours := s.mine(s.theirs.Events()), s.mine(s.ours.Events())
	want := multiset(theirs)
	for _, e := range extras {
		want[e.key]++
		s.t.Logf("allowed extra pleg-nri event %s: %s", e.key, e.reason)
	}
	if diff := cmp.Diff(want, multiset(ours)); diff != "" {
		s.t.Errorf("(type, id) multiset differs (-containerd+extras +pleg-nri):\n%s\ncontainerd: %s\npleg-nri:   %s",
			diff, describeEvents(theirs), describeEvents(ours))
	}
	assertCoverage(s.t, ours)
	assertPerPodMonotonic(s.t, ours)
	if err := s.ours.Err(); err != nil {
		s.t.Errorf("pleg-nri's stream ended: %v", err)
	}
	s.t.Logf("%d events compared: containerd %s", len(ours), describeEvents(theirs))
}

// assertCoverage checks claim 2: each event carries a sandbox status with metadata and the status of
// every container of its pod created (per the stream) and not yet deleted.
func assertCoverage(t *testing.T, evs []*runtimeapi.ContainerEventResponse) {
	t.Helper()
	live := map[string]map[string]bool{} // pod uid -> container ids
	sandboxes := map[string]bool{}
	for _, ev := range evs {
		ps := ev.PodSandboxStatus
		if ps == nil || ps.Metadata == nil || ps.Metadata.Uid == "" || ps.Metadata.Name == "" {
			t.Errorf("event %s:%s has no sandbox status metadata: %v", short(ev.ContainerId), ev.ContainerEventType, ps)
			continue
		}
		uid := ps.Metadata.Uid
		if live[uid] == nil {
			live[uid] = map[string]bool{}
		}
		if ev.ContainerId == ps.Id {
			sandboxes[ps.Id] = true
		} else {
			switch ev.ContainerEventType {
			case evCreated:
				live[uid][ev.ContainerId] = true
			case evDeleted:
				delete(live[uid], ev.ContainerId)
			}
		}
		have := map[string]bool{}
		for _, cs := range ev.ContainersStatuses {
			have[cs.Id] = true
			if cs.Metadata == nil || cs.Metadata.Name == "" {
				t.Errorf("event %s:%s: status of %s has no metadata", short(ev.ContainerId), ev.ContainerEventType, short(cs.Id))
			}
		}
		for id := range live[uid] {
			if !have[id] {
				t.Errorf("event %s:%s does not carry the status of live container %s (has %d statuses)",
					short(ev.ContainerId), ev.ContainerEventType, short(id), len(ev.ContainersStatuses))
			}
		}
		if ev.ContainerEventType == evDeleted && have[ev.ContainerId] {
			t.Errorf("DELETED event of %s still lists it", short(ev.ContainerId))
		}
	}
}

// lastStatus returns the status of container id in the last event of evs that lists it.
func lastStatus(evs []*runtimeapi.ContainerEventResponse, id string) *runtimeapi.ContainerStatus {
	for i := len(evs) - 1; i >= 0; i-- {
		if st := statusOf(evs[i], id); st != nil {
			return st
		}
	}
	return nil
}

// containerStatusFields is what claim 4 compares: containerd's ContainerStatus answer against
// pleg-nri's last status, on the fields the kubelet uses.
func containerStatusFields(st *runtimeapi.ContainerStatus) map[string]any {
	if st == nil {
		return nil
	}
	return map[string]any{
		"state": st.State.String(), "exit_code": st.ExitCode, "reason": st.Reason, "message": st.Message,
		"created_at": st.CreatedAt, "started_at": st.StartedAt, "finished_at": st.FinishedAt,
		"image": st.GetImage().GetImage(), "image_ref": st.ImageRef, "image_id": st.ImageId,
		"labels": st.Labels, "annotations": st.Annotations, "log_path": st.LogPath,
		"name": st.GetMetadata().GetName(), "attempt": st.GetMetadata().GetAttempt(),
		"mounts": len(st.Mounts), "resources": st.Resources, "user": st.User,
	}
}

// assertStatusesMatch checks claim 4 for containers that still exist: pleg-nri's last status of each
// equals containerd's ContainerStatus answer field by field. It waits (up to 10 s, re-reading both) for
// them to agree: a status can only be compared once both have seen the same transition, and containerd's
// final answer for an exit can differ from the exit's fast facts (a container killed while containerd
// was down: 255/Unknown), which pleg-nri's verification then corrects (issue 11).
func (s *sideBySide) assertStatusesMatch(ids ...string) {
	s.t.Helper()
	direct := newCRI(s.t, env.Address)
	for _, id := range ids {
		var want, got *runtimeapi.ContainerStatus
		_ = harness.WaitFor(context.Background(), 10*time.Second, "pleg-nri status of "+short(id), func() (bool, error) {
			want = direct.status(id)
			got = lastStatus(s.mine(s.ours.Events()), id)
			return got != nil && cmp.Equal(containerStatusFields(want), containerStatusFields(got), protocmp.Transform()), nil
		})
		if diff := cmp.Diff(containerStatusFields(want), containerStatusFields(got), protocmp.Transform()); diff != "" {
			s.t.Errorf("pleg-nri's last status of %s differs from containerd's ContainerStatus (-containerd +pleg-nri):\n%s", short(id), diff)
		}
	}
}

// assertSandboxMatches compares pleg-nri's last sandbox status of a pod with containerd's: with its
// PodSandboxStatus answer while the pod is ready, and with the sandbox status in containerd's own last
// event for the pod once it stopped (containerd clears the IP when it closes the network namespace,
// after its STOPPED event: a later status answer is from another moment, not more exact).
func (s *sideBySide) assertSandboxMatches(podID string) {
	s.t.Helper()
	last := func(evs []*runtimeapi.ContainerEventResponse) *runtimeapi.PodSandboxStatus {
		for i := len(evs) - 1; i >= 0; i-- {
			if evs[i].PodSandboxStatus.GetId() == podID {
				return evs[i].PodSandboxStatus
			}
		}
		return nil
	}
	got := last(s.mine(s.ours.Events()))
	want, what := newCRI(s.t, env.Address).podStatus(podID), "its PodSandboxStatus answer"
	if want.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		want, what = last(s.mine(s.theirs.Events())), "the sandbox status of its own last event"
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		s.t.Errorf("pleg-nri's last sandbox status of %s differs from containerd's %s (-containerd +pleg-nri):\n%s", short(podID), what, diff)
	}
}

// keys builds eventKeys for one id.
func keys(id string, types ...runtimeapi.ContainerEventType) []eventKey {
	var out []eventKey
	for _, typ := range types {
		out = append(out, eventKey{id, typ})
	}
	return out
}

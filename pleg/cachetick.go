package pleg

// The cache tick (Config.CacheTick). A kubelet 1.35 or 1.36 with EventedPLEG writes every event's pod
// status into its pod cache, stamped with the event's created_at, and each pod worker waits at the start
// of a sync for a status of its pod newer than the end of its previous sync (cache.GetNewerThan). Its
// evented PLEG makes the whole cache newer every 5 s; GenericPLEG's relist does every second. A sync
// that nothing of the pod's containers changed after (the API's echo of the kubelet's own status write,
// a deletion, a resync) therefore waits up to 5 s for that tick, on any event source: that is why
// upstream's `should not hang in termination if terminated during initialization` takes 8-10 s on 1.36
// with EventedPLEG against 4 s with GenericPLEG (k/k #124704, #139493; docs/internals.md).
//
// With the tick, every CacheTick each pod's statuses as they stand (containerd's, as in every event) are
// sent again in an event of type CREATED about its sandbox, with a created_at after every other event of
// the pod. Such a kubelet writes it into its cache and makes nothing of it (a CREATED produces no pod
// lifecycle event, kubelet pkg/kubelet/pleg/evented.go), so its pod workers wait at most CacheTick. A
// kubelet 1.37 only counts it in its event latency metric. The tick is not a transition: it is never
// replayed, never recorded in the checkpoint, and counted under its own source, "tick".

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// cacheTick sends the tick of every pod whose events are all out: a pod with an event pending, or
// whose statuses are being fetched, gets that event instead, which is newer. Only the newest sandbox of
// a pod (uid) ticks: the kubelet keys its cache by the pod's uid, and a tick of an older sandbox would
// put that sandbox's view in place of the newer one's.
func (s *state) cacheTick(ctx context.Context) {
	if s.fan.count() == 0 || s.fan.stopping.Load() {
		return
	}
	newest := make(map[string]*pod, len(s.pods))
	for _, p := range s.pods {
		sb := p.sandbox
		if p.dropped || sb.dropped || sb.emitted < PhaseCreated || sb.emitted >= PhaseRemoved {
			continue
		}
		uid := sb.sbAnswer.GetMetadata().GetUid()
		if uid == "" {
			uid = p.id // no uid to share
		}
		if q := newest[uid]; q == nil || sandboxOrder(p, q) > 0 {
			newest[uid] = p
		}
	}
	for _, p := range newest {
		sb := p.sandbox
		if len(p.queue) > 0 || !s.ready(sb) {
			continue
		}
		_, ev := s.event(sb, runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT, cause{src: SourceTick})
		ev.notReplayed = true
		s.metrics.EventEmitted(runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT, KindSandbox, SourceTick, 0)
		s.fan.publish(ctx, ev)
	}
}

// sandboxOrder orders two sandboxes of a pod by creation time, then id.
func sandboxOrder(a, b *pod) int {
	return containerOrder(a.sandbox.sbAnswer.GetCreatedAt(), b.sandbox.sbAnswer.GetCreatedAt(), a.id, b.id)
}

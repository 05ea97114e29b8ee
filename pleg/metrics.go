package pleg

import (
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Reasons an observation is suppressed (Metrics.ObservationSuppressed).
const (
	// SuppressDuplicate: the observation repeats the phase the object is already in (the same transition
	// seen by another input). Facts it adds (an exit code, an OOM) are still applied.
	SuppressDuplicate = "duplicate"
	// SuppressStale: the observation is of an earlier phase than the one already known.
	SuppressStale = "stale"
	// SuppressDeleted: the observation is about an object already deleted (tombstoned).
	SuppressDeleted = "deleted"
	// SuppressKindMismatch: the observation says sandbox for a container id or the reverse.
	SuppressKindMismatch = "kind_mismatch"
	// SuppressHeldExpired: the observation was about an unknown id, held, and no object with that id
	// appeared within the hold TTL (typically an exec process exit the input did not filter).
	SuppressHeldExpired = "held_expired"
	// SuppressHeldOverflow: the observation was about an unknown id and the hold buffer was full.
	SuppressHeldOverflow = "held_overflow"
	// SuppressStaleStatus: a status answer older than the one already cached (its state is behind).
	SuppressStaleStatus = "stale_status"
)

// Reasons an object is dropped without any event (Metrics.ObjectDropped).
const (
	// DropRemovedBeforeStatus: the object was removed before the CRI ever answered its status: it never
	// became visible to the CRI, so containerd emitted nothing for it either.
	DropRemovedBeforeStatus = "removed_before_status"
	// DropStatusNotFound: the CRI answered NotFound for the object's status for the whole retry window.
	// The object is forgotten (not tombstoned); a later relist that lists it brings it back.
	DropStatusNotFound = "status_not_found"
	// DropSandboxGone: a container dropped because its sandbox was dropped.
	DropSandboxGone = "sandbox_gone"
)

// Results of reading the checkpoint at startup (Metrics.CheckpointLoaded).
const (
	// CheckpointRestored: the checkpoint was read and its objects are the baseline of the state.
	CheckpointRestored = "restored"
	// CheckpointAbsent: there was no checkpoint (first start): every object found is new.
	CheckpointAbsent = "absent"
	// CheckpointUnusable: the checkpoint was corrupt, of another format version, or of another runtime:
	// it was set aside and pleg-nri started as without one.
	CheckpointUnusable = "unusable"
)

// Results of a status call (Metrics.StatusCall).
const (
	StatusResultOK       = "ok"
	StatusResultNotFound = "not_found"
	StatusResultTimeout  = "timeout"
	StatusResultError    = "error"
)

// Metrics receives every count and measurement the package makes. Implementations must be safe for
// concurrent use and cheap: several methods are called on the Observe and emission paths. NopMetrics
// implements it with no-ops.
type Metrics interface {
	// ObservationReceived counts every Observe call, by input and kind.
	ObservationReceived(src Source, kind Kind)
	// ObservationSuppressed counts an observation (or a part of it) that changed nothing, by input and
	// reason (one of the Suppress* constants).
	ObservationSuppressed(src Source, reason string)
	// EventEmitted counts an event handed to the fan-out, by type, object kind and the input that caused
	// it; latency is from that input's SourceTime to the emission.
	EventEmitted(t runtimeapi.ContainerEventType, kind Kind, src Source, latency time.Duration)
	// EventCorrected counts a corrected STOPPED event: the container's status changed, after its STOPPED
	// event, in a field the kubelet reads from an exited container (an OOM learnt late, or containerd's
	// final exit code, reason, message or times differing from the fast inputs'). src is the input that
	// brought the change. It is also counted by EventEmitted.
	EventCorrected(kind Kind, src Source)
	// ObjectDropped counts an object forgotten without any event, by kind and reason (Drop* constants).
	ObjectDropped(kind Kind, reason string)
	// StatusCall measures one CRI status call: kind, result (StatusResult* constants) and duration.
	// verify is set for the delayed verification call after a STARTED/STOPPED built from fast facts.
	StatusCall(kind Kind, verify bool, result string, d time.Duration)
	// StatusMismatch counts a verification answer that differed from the status already emitted (the
	// cache is updated; a difference in a field the kubelet reads from an exited container also gives a
	// corrected STOPPED).
	StatusMismatch(kind Kind)
	// Subscribers reports the number of subscribers after a change.
	Subscribers(n int)
	// SubscriberQueueDepth reports a subscriber's queue depth after a push or a pop.
	SubscriberQueueDepth(id uint64, depth int)
	// SubscriberRemoved says a subscriber is gone (closed or evicted): drop its per-subscriber series.
	SubscriberRemoved(id uint64)
	// EventsCoalesced counts queued events replaced by a newer event of the same pod in a full queue.
	EventsCoalesced(n int)
	// SubscriberEvicted counts a subscriber ended with RESOURCE_EXHAUSTED, and why (EvictedQueueFull,
	// EvictedStalled).
	SubscriberEvicted(id uint64, reason string)
	// RelistCompleted measures one relist; err is nil on success.
	RelistCompleted(d time.Duration, err error)
	// RelistRepair counts an event emitted because a relist found what the events missed.
	RelistRepair(kind Kind, t runtimeapi.ContainerEventType)
	// RelistRepairLate counts a relist repair (RelistRepair) whose transition an event input (NRI, a
	// task event) reported afterwards: the input was late, not missing (a busy node or containerd), and
	// the relist only sent the event first.
	RelistRepairLate(kind Kind, t runtimeapi.ContainerEventType)
	// CheckpointLoaded reports the checkpoint read at startup: the objects restored from it and the
	// result (one of the Checkpoint* constants).
	CheckpointLoaded(objects int, result string)
	// CheckpointWritten measures one checkpoint write: its size, the objects in it, how long encoding and
	// writing took, and its error (nil on success).
	CheckpointWritten(bytes, objects int, d time.Duration, err error)
	// StartupReplayDropped counts the startup replay buffer overflowing: it is dropped, and subscribers
	// that subscribe later get only the events emitted from then on.
	StartupReplayDropped()
}

// OOMCheckMetrics is what a Metrics may also implement to measure the OOM checks (Config.OOM).
type OOMCheckMetrics interface {
	// OOMCheckCall measures one OOM check: result (StatusResult* constants) and duration.
	OOMCheckCall(result string, d time.Duration)
}

// NopMetrics is a Metrics that does nothing.
type NopMetrics struct{}

var _ Metrics = NopMetrics{}

func (NopMetrics) ObservationReceived(Source, Kind)                                        {}
func (NopMetrics) ObservationSuppressed(Source, string)                                    {}
func (NopMetrics) EventEmitted(runtimeapi.ContainerEventType, Kind, Source, time.Duration) {}
func (NopMetrics) EventCorrected(Kind, Source)                                             {}
func (NopMetrics) ObjectDropped(Kind, string)                                              {}
func (NopMetrics) StatusCall(Kind, bool, string, time.Duration)                            {}
func (NopMetrics) StatusMismatch(Kind)                                                     {}
func (NopMetrics) Subscribers(int)                                                         {}
func (NopMetrics) SubscriberQueueDepth(uint64, int)                                        {}
func (NopMetrics) SubscriberRemoved(uint64)                                                {}
func (NopMetrics) EventsCoalesced(int)                                                     {}
func (NopMetrics) SubscriberEvicted(uint64, string)                                        {}
func (NopMetrics) RelistCompleted(time.Duration, error)                                    {}
func (NopMetrics) RelistRepair(Kind, runtimeapi.ContainerEventType)                        {}
func (NopMetrics) RelistRepairLate(Kind, runtimeapi.ContainerEventType)                    {}
func (NopMetrics) CheckpointLoaded(int, string)                                            {}
func (NopMetrics) CheckpointWritten(int, int, time.Duration, error)                        {}
func (NopMetrics) StartupReplayDropped()                                                   {}

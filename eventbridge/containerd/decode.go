package containerd

import (
	"errors"
	"fmt"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/typeurl/v2"

	"github.com/pleg-nri/pleg-nri/pleg"
)

// Task event topics pleg-nri turns into observations. Every other /tasks/ topic (create, delete,
// exec-added, exec-started, paused, resumed, checkpointed) is ignored: NRI and the relist carry those
// transitions.
const (
	TopicTaskExit  = "/tasks/exit"
	TopicTaskOOM   = "/tasks/oom"
	TopicTaskStart = "/tasks/start"
)

// verdict says what decodeEnvelope made of an envelope, for the counters of TaskEvents.
type verdict uint8

const (
	// verdictObserved: the envelope became an observation.
	verdictObserved verdict = iota
	// verdictIgnoredTopic: a topic pleg-nri does not use.
	verdictIgnoredTopic
	// verdictExecExit: the exit of an exec process, which is not a container exit.
	verdictExecExit
	// verdictError: the envelope could not be decoded.
	verdictError
)

// errNoPayload is returned for an envelope of a known topic without an event.
var errNoPayload = errors.New("envelope has no event payload")

// DecodeEnvelope turns one containerd event envelope into an observation for the core.
//
// It returns ok=false with a nil error for envelopes that carry nothing for the core: topics other
// than /tasks/exit, /tasks/oom and /tasks/start, and the exits of exec processes (TaskExit.ID differs
// from TaskExit.ContainerID). It returns an error when the payload of a known topic cannot be decoded
// or names no container.
//
// The observation's Kind is pleg.KindUnknown: a task may belong to a sandbox (its pause process) or to
// a container, and only the core knows which.
func DecodeEnvelope(env *events.Envelope) (pleg.Observation, bool, error) {
	obs, v, err := decodeEnvelope(env)
	return obs, v == verdictObserved, err
}

func decodeEnvelope(env *events.Envelope) (pleg.Observation, verdict, error) {
	if env == nil {
		return pleg.Observation{}, verdictError, errors.New("nil envelope")
	}
	switch env.Topic {
	case TopicTaskExit, TopicTaskOOM, TopicTaskStart:
	default:
		return pleg.Observation{}, verdictIgnoredTopic, nil
	}
	if env.Event == nil {
		return pleg.Observation{}, verdictError, fmt.Errorf("failed to decode %s event: %w", env.Topic, errNoPayload)
	}

	obs := pleg.Observation{
		Source:     pleg.SourceTaskEvent,
		Kind:       pleg.KindUnknown,
		SourceTime: env.Timestamp,
	}
	switch env.Topic {
	case TopicTaskExit:
		var e apievents.TaskExit
		if err := decodeTaskEvent(env, &e); err != nil {
			return pleg.Observation{}, verdictError, err
		}
		// An empty ID is what old shims sent for the init process; anything else that differs from the
		// container id is an exec process.
		if e.ID != "" && e.ID != e.ContainerID {
			return pleg.Observation{}, verdictExecExit, nil
		}
		obs.ID = e.ContainerID
		obs.Phase = pleg.PhaseExited
		// containerd's CRI does the same conversion: exit statuses above MaxInt32 do not occur in practice.
		obs.ExitCode = int32(e.ExitStatus)
		obs.HasExitCode = true
		if e.ExitedAt != nil {
			obs.FinishedAt = e.ExitedAt.AsTime()
		}
	case TopicTaskOOM:
		var e apievents.TaskOOM
		if err := decodeTaskEvent(env, &e); err != nil {
			return pleg.Observation{}, verdictError, err
		}
		obs.ID = e.ContainerID
		obs.Phase = pleg.PhaseNone
		obs.OOMKilled = true
	case TopicTaskStart:
		var e apievents.TaskStart
		if err := decodeTaskEvent(env, &e); err != nil {
			return pleg.Observation{}, verdictError, err
		}
		obs.ID = e.ContainerID
		obs.Phase = pleg.PhaseRunning
		// TaskStart carries no time of its own; the envelope's timestamp is when containerd published
		// it, right after the process started.
		obs.StartedAt = env.Timestamp
	}
	return obs, verdictObserved, nil
}

// decodeTaskEvent decodes the payload of env (of a known topic, with a payload) into e and checks that it
// names a container.
func decodeTaskEvent(env *events.Envelope, e interface{ GetContainerID() string }) error {
	if err := typeurl.UnmarshalTo(env.Event, e); err != nil {
		return fmt.Errorf("failed to decode %s event: %w", env.Topic, err)
	}
	if e.GetContainerID() == "" {
		return fmt.Errorf("failed to decode %s event: no container id", env.Topic)
	}
	return nil
}

// envelopeTime is a helper for logs: the envelope's timestamp or "unknown".
func envelopeTime(env *events.Envelope) string {
	if env == nil || env.Timestamp.IsZero() {
		return "unknown"
	}
	return env.Timestamp.Format(time.RFC3339Nano)
}

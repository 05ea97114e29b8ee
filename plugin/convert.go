// NRI callbacks to observations.
//
// What containerd 2.4 (internal/cri/server, internal/cri/nri, internal/nri) has done when it calls each NRI
// callback, and the observation the plugin makes of it. Source is pleg.SourceNRI, except for Synchronize
// (pleg.SourceNRISync); SourceTime is the callback's arrival.
//
//	callback            containerd, at the time of the call                        observation
//	------------------  ---------------------------------------------------------  -------------------------------
//	Synchronize         every sandbox not in unknown state (ready or not) and       sandbox: Running if pid > 0,
//	                    every created or running container (ListPodSandboxes,       else None (NotReady sandboxes
//	                    ListContainers in cri/nri/nri_api_linux.go)                 have pid 0); container: by state
//	RunPodSandbox       pause task started, network set up, sandbox NOT yet in      sandbox Running
//	                    the CRI store and not yet Ready (sandbox_run.go)
//	StopPodSandbox      every container stopped, pause task killed and its exit    sandbox Exited
//	                    waited for (sandbox_stop.go stopPodSandbox ->
//	                    podsandbox Controller.Stop -> stopSandboxContainer:
//	                    Kill + podSandbox.Wait); once per sandbox (internal/nri
//	                    needsStopping)
//	RemovePodSandbox    containers removed, sandbox shut down, CRI DELETED sent,   sandbox Removed
//	                    just before the store delete (sandbox_remove.go); also
//	                    the rollback of a failed RunPodSandbox
//	CreateContainer     not subscribed: called from inside client.NewContainer,    -
//	                    before the container exists in containerd or the CRI
//	                    store; the creation can still fail (UndoCreateContainer
//	                    then sends StopContainer + RemoveContainer)
//	PostCreateContainer in the CRI store, CRI CREATED sent (container_create.go)  container Created
//	StartContainer      not subscribed: the task is created but task.Start has     -
//	                    not run (container_start.go); nothing new to observe
//	PostStartContainer  task started, StartedAt set, CRI STARTED sent              container Running
//	                    (container_start.go)
//	StopContainer       three paths, once per container (internal/nri              container Exited when the
//	                    needsStopping): (1) the process exited by itself:           process has exited: state
//	                    events.go handleContainerExit -> task.Delete(                STOPPED, or state UNKNOWN
//	                    WithContainerExit) -> NotifyContainerExit, async, state      with FinishedAt set; with
//	                    STOPPED, FinishedAt/ExitCode of the exit event; (2) a CRI    FinishedAt, ExitCode and
//	                    StopContainer: container_stop.go calls NRI only after        Reason/Message when present.
//	                    stopContainer has waited for container.Stopped(), i.e.       Otherwise (state CREATED:
//	                    after the exit was handled; the CRI state is then EXITED,    never started, or a failed
//	                    which GetStatus leaves as UNKNOWN with FinishedAt/ExitCode   start/create) nothing.
//	                    set; a never-started container is reported CREATED;
//	                    (3) a failed start (container_start.go defer) or create
//	                    (UndoCreateContainer): CREATED or UNKNOWN, no FinishedAt
//	RemoveContainer     before the containerd delete and the store delete          container Removed
//	                    (container_remove.go); the process has exited
//	UpdateContainer     not subscribed: the update is not applied yet and can      -
//	                    still fail
//	PostUpdateContainer UpdateContainerResources applied: the spec, the task and    container, no phase,
//	                    the CRI store's status (its resources) are updated          StatusChanged: its CRI
//	                    (container_update_resources.go); no CRI event               status is asked again
//	UpdatePodSandbox,   not subscribed: pod-level resources are not in the CRI      -
//	PostUpdatePodSandbox sandbox status
//
// Container state in Synchronize: CREATED -> Created, RUNNING and PAUSED -> Running, STOPPED -> Exited, UNKNOWN
// -> Exited when FinishedAt is set, else None. containerd 2.4.2 fills Container.CreatedAt/StartedAt/FinishedAt/
// ExitCode but not StatusReason/StatusMessage (internal/nri/container.go commonContainerToNRI): OOMKilled is
// taken from StatusReason when a runtime sets it, and otherwise comes from containerd's /tasks/oom.

package plugin

import (
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/pleg-nri/pleg-nri/pleg"
)

// Callback names an NRI request the plugin handles; its String is the metric label.
type Callback uint8

const (
	// CallbackSynchronize is Synchronize, on every (re)connect.
	CallbackSynchronize Callback = iota
	// CallbackRunPodSandbox is RunPodSandbox.
	CallbackRunPodSandbox
	// CallbackStopPodSandbox is StopPodSandbox.
	CallbackStopPodSandbox
	// CallbackRemovePodSandbox is RemovePodSandbox.
	CallbackRemovePodSandbox
	// CallbackPostCreateContainer is PostCreateContainer.
	CallbackPostCreateContainer
	// CallbackPostStartContainer is PostStartContainer.
	CallbackPostStartContainer
	// CallbackStopContainer is StopContainer.
	CallbackStopContainer
	// CallbackRemoveContainer is RemoveContainer.
	CallbackRemoveContainer
	// CallbackPostUpdateContainer is PostUpdateContainer.
	CallbackPostUpdateContainer

	numCallbacks
)

// String returns the callback's NRI name.
func (c Callback) String() string {
	switch c {
	case CallbackSynchronize:
		return "Synchronize"
	case CallbackRunPodSandbox:
		return "RunPodSandbox"
	case CallbackStopPodSandbox:
		return "StopPodSandbox"
	case CallbackRemovePodSandbox:
		return "RemovePodSandbox"
	case CallbackPostCreateContainer:
		return "PostCreateContainer"
	case CallbackPostStartContainer:
		return "PostStartContainer"
	case CallbackStopContainer:
		return "StopContainer"
	case CallbackRemoveContainer:
		return "RemoveContainer"
	case CallbackPostUpdateContainer:
		return "PostUpdateContainer"
	}
	return "unknown"
}

// Callbacks lists every callback, for metric registration.
func Callbacks() []Callback {
	out := make([]Callback, 0, numCallbacks)
	for c := Callback(0); c < numCallbacks; c++ {
		out = append(out, c)
	}
	return out
}

// oomKilledReason is the CRI reason of a container killed by the OOM killer.
const oomKilledReason = "OOMKilled"

// ConvertPodSandbox turns a sandbox seen by callback cb at time at into an observation. It returns false when
// there is nothing to observe: no sandbox, no id, or a container callback.
func ConvertPodSandbox(cb Callback, pod *api.PodSandbox, at time.Time) (pleg.Observation, bool) {
	id := pod.GetId()
	if id == "" {
		return pleg.Observation{}, false
	}
	o := pleg.Observation{
		Source:     pleg.SourceNRI,
		Kind:       pleg.KindSandbox,
		ID:         id,
		SandboxID:  id,
		SourceTime: at,
	}
	switch cb {
	case CallbackSynchronize:
		o.Source = pleg.SourceNRISync
		// NOTE: PodSandbox has no state. containerd lists NotReady sandboxes too, with pid 0
		// (handleSandboxExit clears it); a pid says the pause process is there.
		if pod.GetPid() > 0 {
			o.Phase = pleg.PhaseRunning
		}
	case CallbackRunPodSandbox:
		o.Phase = pleg.PhaseRunning
	case CallbackStopPodSandbox:
		o.Phase = pleg.PhaseExited
	case CallbackRemovePodSandbox:
		o.Phase = pleg.PhaseRemoved
	default:
		return pleg.Observation{}, false
	}
	return o, true
}

// ConvertContainer turns a container seen by callback cb at time at into an observation; pod is the container's
// sandbox as the callback gave it (may be nil). It returns false when there is nothing to observe: no container,
// no id, a sandbox callback, or a StopContainer of a container whose process has not run.
func ConvertContainer(cb Callback, pod *api.PodSandbox, ctr *api.Container, at time.Time) (pleg.Observation, bool) {
	id := ctr.GetId()
	if id == "" {
		return pleg.Observation{}, false
	}
	sandboxID := ctr.GetPodSandboxId()
	if sandboxID == "" {
		sandboxID = pod.GetId()
	}
	o := pleg.Observation{
		Source:      pleg.SourceNRI,
		Kind:        pleg.KindContainer,
		ID:          id,
		SandboxID:   sandboxID,
		CreatedAt:   nanoTime(ctr.GetCreatedAt()),
		StartedAt:   nanoTime(ctr.GetStartedAt()),
		CgroupsPath: ctr.GetLinux().GetCgroupsPath(),
		SourceTime:  at,
	}
	switch cb {
	case CallbackSynchronize:
		o.Source = pleg.SourceNRISync
		o.Phase = containerPhase(ctr)
	case CallbackPostCreateContainer:
		o.Phase = pleg.PhaseCreated
	case CallbackPostStartContainer:
		o.Phase = pleg.PhaseRunning
	case CallbackStopContainer:
		if !hasExited(ctr) {
			return pleg.Observation{}, false
		}
		o.Phase = pleg.PhaseExited
	case CallbackRemoveContainer:
		o.Phase = pleg.PhaseRemoved
	case CallbackPostUpdateContainer:
		o.StatusChanged = true
	default:
		return pleg.Observation{}, false
	}
	if o.Phase == pleg.PhaseExited {
		setExit(&o, ctr)
	}
	return o, true
}

// containerPhase is the phase of a container's NRI state, as Synchronize reports it.
func containerPhase(ctr *api.Container) pleg.Phase {
	switch ctr.GetState() {
	case api.ContainerState_CONTAINER_CREATED:
		return pleg.PhaseCreated
	case api.ContainerState_CONTAINER_RUNNING, api.ContainerState_CONTAINER_PAUSED:
		return pleg.PhaseRunning
	}
	if hasExited(ctr) {
		return pleg.PhaseExited
	}
	return pleg.PhaseNone
}

// hasExited says whether the container's process has exited: containerd reports STOPPED on an exit event,
// and UNKNOWN with FinishedAt for a container whose CRI state is EXITED (cri/nri GetStatus has no case
// mapping CONTAINER_EXITED).
func hasExited(ctr *api.Container) bool {
	switch ctr.GetState() {
	case api.ContainerState_CONTAINER_STOPPED:
		return true
	case api.ContainerState_CONTAINER_UNKNOWN:
		return ctr.GetFinishedAt() > 0
	}
	return false
}

// setExit copies the exit facts of an exited container into o. The exit code counts as known only when the
// runtime filled FinishedAt (containerd < 2.3 fills neither).
func setExit(o *pleg.Observation, ctr *api.Container) {
	if fin := ctr.GetFinishedAt(); fin > 0 {
		o.FinishedAt = nanoTime(fin)
		o.ExitCode = ctr.GetExitCode()
		o.HasExitCode = true
	}
	o.Reason = ctr.GetStatusReason()
	o.Message = ctr.GetStatusMessage()
	o.OOMKilled = o.Reason == oomKilledReason
}

// nanoTime converts an NRI timestamp (Unix nanoseconds, 0 when unknown) to a time.
func nanoTime(ns int64) time.Time {
	if ns <= 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

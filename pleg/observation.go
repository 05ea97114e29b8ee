// Package pleg holds pleg-nri's core: the state of every sandbox and container, the generation of CRI
// container events from observations, the pod status carried by each event, the relist reconciler
// and the fan-out to subscribers.
//
// The package has no containerd client and no gRPC server inside: inputs (the NRI plugin, containerd's
// task events, the CRI relist) are normalized by their own packages into Observations, and the CRI
// status calls go through the StatusSource and Lister interfaces.
package pleg

import (
	"context"
	"fmt"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Source says which input made an observation.
type Source uint8

const (
	// SourceNRI is an NRI lifecycle callback (RunPodSandbox, CreateContainer, StopContainer, ...).
	SourceNRI Source = iota
	// SourceNRISync is NRI's Synchronize, delivered on every (re)connect of the plugin.
	SourceNRISync
	// SourceTaskEvent is a containerd task event (/tasks/exit, /tasks/oom, /tasks/start, ...).
	SourceTaskEvent
	// SourceRelist is the relist reconciler (CRI ListPodSandbox + ListContainers).
	SourceRelist
	// SourceStatus is a CRI PodSandboxStatus or ContainerStatus answer.
	SourceStatus
	// SourceStartup is the startup reconciliation: the first relist after pleg-nri starts, diffed
	// against the state restored from the checkpoint. What it finds happened while pleg-nri was not
	// running, so it is not counted as a relist repair (a repair means the event inputs missed
	// something while pleg-nri was watching).
	SourceStartup
	// SourceRefresh is a refresh asked for by the CRI endpoint (PLEG.RefreshStopped): a STOPPED sent
	// again after a stop the endpoint's client made, once its calls about the pod went quiet.
	SourceRefresh
	// SourceTick is the cache tick (Config.CacheTick): a pod's statuses as they stand, in a CREATED
	// about its sandbox, sent again every tick.
	SourceTick
)

// String returns the source's name as used in logs and metric labels.
func (s Source) String() string {
	switch s {
	case SourceNRI:
		return "nri"
	case SourceNRISync:
		return "nri_sync"
	case SourceTaskEvent:
		return "task_event"
	case SourceRelist:
		return "relist"
	case SourceStatus:
		return "status"
	case SourceStartup:
		return "startup"
	case SourceRefresh:
		return "refresh"
	case SourceTick:
		return "tick"
	}
	return fmt.Sprintf("source(%d)", uint8(s))
}

// Kind says what an observed object is.
type Kind uint8

const (
	// KindUnknown is an object identified only by id (a task event): the state resolves it.
	KindUnknown Kind = iota
	// KindSandbox is a pod sandbox; its id is the sandbox id.
	KindSandbox
	// KindContainer is a container of a sandbox.
	KindContainer
)

// String returns the kind's name as used in logs and metric labels.
func (k Kind) String() string {
	switch k {
	case KindSandbox:
		return "sandbox"
	case KindContainer:
		return "container"
	}
	return "unknown"
}

// Phase is the lifecycle phase an input saw an object in. Phases only move forward:
// Created -> Running -> Exited -> Removed, and an observation of an earlier phase than the one already
// known is stale.
type Phase uint8

const (
	// PhaseNone says the observation carries no phase, only facts (an OOM, a status answer).
	PhaseNone Phase = iota
	// PhaseCreated: the object exists and its process has not started.
	PhaseCreated
	// PhaseRunning: the process started (for a sandbox: the sandbox is ready).
	PhaseRunning
	// PhaseExited: the process exited, by itself or stopped (for a sandbox: not ready).
	PhaseExited
	// PhaseRemoved: the object is gone from the runtime.
	PhaseRemoved
)

// String returns the phase's name.
func (p Phase) String() string {
	switch p {
	case PhaseNone:
		return "none"
	case PhaseCreated:
		return "created"
	case PhaseRunning:
		return "running"
	case PhaseExited:
		return "exited"
	case PhaseRemoved:
		return "removed"
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// Observer receives the observations an input makes (the NRI plugin, containerd's task events); *PLEG
// satisfies it. Observe must not block: each input calls it from the goroutine that reads its source.
type Observer interface {
	Observe(Observation)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Observation)

// Observe calls f(o).
func (f ObserverFunc) Observe(o Observation) { f(o) }

// Observation is one fact about one sandbox or container, as an input saw it. Fields an input does not
// know are left zero.
type Observation struct {
	// Source is the input that made the observation.
	Source Source
	// Kind is what the object is; KindUnknown when the input only knows the id (task events).
	Kind Kind
	// ID is the container id, or the sandbox id for a sandbox.
	ID string
	// SandboxID is the sandbox a container belongs to (equal to ID for a sandbox); may be empty when the
	// input does not know it.
	SandboxID string
	// Phase is the lifecycle phase the input saw, or PhaseNone.
	Phase Phase

	// CreatedAt, StartedAt and FinishedAt are the process times the input knows (zero: unknown).
	CreatedAt, StartedAt, FinishedAt time.Time
	// ExitCode is the exit status, meaningful only when HasExitCode is set.
	ExitCode    int32
	HasExitCode bool
	// OOMKilled is set when the input says the object's process was killed by the OOM killer
	// (/tasks/oom, or an NRI reason of OOMKilled).
	OOMKilled bool
	// Reason and Message are the exit reason and message, when the input knows them.
	Reason, Message string

	// SandboxStatus and ContainerStatus, when set, are full CRI statuses (from a status call or a
	// status source) that replace what the state holds for the object. They are never modified after
	// they are handed over.
	SandboxStatus   *runtimeapi.PodSandboxStatus
	ContainerStatus *runtimeapi.ContainerStatus

	// CgroupsPath is a container's cgroup as its runtime spec names it (cgroupfs path, or systemd's
	// slice:prefix:name), when the input knows it (NRI): the OOM check reads its OOM kill count there.
	CgroupsPath string

	// StatusChanged says the object's CRI status changed in a way no phase tells (NRI's
	// PostUpdateContainer: containerd stored new resources): the state asks containerd for it again, and
	// the pod's later events wait for that answer.
	StatusChanged bool

	// SourceTime is when the input saw the fact (the task event's timestamp, the NRI callback's arrival);
	// the latency metric measures from it to the send.
	SourceTime time.Time
}

// String renders the observation for debug logs.
func (o Observation) String() string {
	return fmt.Sprintf("%s %s %s phase=%s", o.Source, o.Kind, o.ID, o.Phase)
}

// StatusSource answers CRI status calls. The daemon implements it over containerd's CRI; tests with a
// fake. Both methods return an error satisfying errdefs.IsNotFound (or a gRPC NotFound status) when the
// object does not exist.
type StatusSource interface {
	PodSandboxStatus(ctx context.Context, id string) (*runtimeapi.PodSandboxStatus, error)
	ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error)
}

// OOMChecker tells whether a container's cgroup recorded an OOM kill (memory.oom_control's oom_kill on
// cgroup v1, memory.events' oom_kill on cgroup v2), which containerd's CRI reads, through the task's
// metrics, for an exit with status 137 before it reports the exit (handleContainerExit). cgroupsPath is
// the container's cgroup as its spec names it, empty when unknown. The error satisfies
// errdefs.IsNotFound when neither the cgroup nor the task is there any more.
type OOMChecker interface {
	OOMKilled(ctx context.Context, id, cgroupsPath string) (bool, error)
}

// OOMCgroupReader is what an OOMChecker may also implement: the answer read from the container's cgroup
// alone (a file read of tens of microseconds, nothing that can block), which the state machine makes
// inline rather than queue a call and wait for its answer. ok is false when the cgroup cannot be read:
// the call is queued then.
type OOMCgroupReader interface {
	CgroupOOMKilled(cgroupsPath string) (killed, ok bool)
}

// Lister lists every sandbox and container the runtime knows, for the relist reconciler.
type Lister interface {
	ListPodSandbox(ctx context.Context) ([]*runtimeapi.PodSandbox, error)
	ListContainers(ctx context.Context) ([]*runtimeapi.Container, error)
}

// Clock is the time source of the state machine (time.Now, or a test's fake): the one clock style of
// pleg-nri's packages (plugin.Config.Clock, the endpoint's and the task events' clocks are the same).
type Clock func() time.Time

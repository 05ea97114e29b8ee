package pleg

// The statuses events carry: the facts the fast inputs tell, and how they are applied on top of the
// last CRI status answer (containerEffective, sandboxEffective), as containerd's CRI would answer.

import (
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Exit reasons, as containerd's CRI plugin spells them (internal/cri/server/container_status.go and
// events.go).
const (
	reasonOOMKilled = "OOMKilled"
	reasonCompleted = "Completed"
	reasonError     = "Error"
	// reasonUnknown and exitCodeUnknown are what containerd reports for an exit it could not observe
	// (a container that exited while containerd was down); used for a container that vanished while
	// running before any input reported its exit.
	reasonUnknown   = "Unknown"
	exitCodeUnknown = 255
	// oomExitCode is the exit status of a process killed by SIGKILL, which the OOM killer sends: the one
	// exit status containerd checks the cgroup's OOM kill count for.
	oomExitCode = 137
)

// facts are what the fast inputs (NRI, task events, relist) told about a container's process, applied
// on top of the last CRI status answer so an event never waits on a status call.
type facts struct {
	startedAt int64 // ns; 0: unknown
	// startExact says startedAt is containerd's own start time (from NRI, which copies the CRI status,
	// or from a status answer). containerd stamps StartedAt itself after task.Start returns, so the
	// /tasks/start event's timestamp is only an approximation that an event must not carry.
	startExact bool
	finishedAt int64 // ns; 0: unknown
	exitCode   int32
	hasExit    bool // exitCode (and finishedAt) are known
	oom        bool // the process was OOM-killed
	reason     string
	message    string
}

// merge adds what ob knows to f. The first exit wins, as in containerd's handleContainerExit (it sets
// the exit code and time only while FinishedAt is still 0).
func (f *facts) merge(ob Observation) {
	switch {
	case !ob.StartedAt.IsZero() && ob.Source != SourceTaskEvent && !f.startExact:
		f.startedAt = ob.StartedAt.UnixNano()
		f.startExact = true
	case f.startedAt == 0 && !ob.StartedAt.IsZero():
		f.startedAt = ob.StartedAt.UnixNano()
	}
	if ob.Phase == PhaseRunning && f.startedAt == 0 && !ob.SourceTime.IsZero() {
		f.startedAt = ob.SourceTime.UnixNano()
	}
	if !f.hasExit && ob.HasExitCode {
		f.hasExit = true
		f.exitCode = ob.ExitCode
		switch {
		case !ob.FinishedAt.IsZero():
			f.finishedAt = ob.FinishedAt.UnixNano()
		case !ob.SourceTime.IsZero():
			f.finishedAt = ob.SourceTime.UnixNano()
		}
	}
	if f.finishedAt == 0 && !ob.FinishedAt.IsZero() {
		f.finishedAt = ob.FinishedAt.UnixNano()
	}
	if ob.OOMKilled || ob.Reason == reasonOOMKilled {
		f.oom = true
	}
	if f.reason == "" && ob.Reason != "" {
		f.reason = ob.Reason
	}
	if f.message == "" && ob.Message != "" {
		f.message = ob.Message
	}
}

// containerStateRank orders container states for "never move backwards"; UNKNOWN ranks lowest.
func containerStateRank(s runtimeapi.ContainerState) int {
	switch s {
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		return 1
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		return 2
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		return 3
	}
	return 0
}

// containerStatePhase is the phase a container state implies (PhaseNone for UNKNOWN).
func containerStatePhase(s runtimeapi.ContainerState) Phase {
	switch s {
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		return PhaseCreated
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		return PhaseRunning
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		return PhaseExited
	}
	return PhaseNone
}

// sandboxStatePhase is the phase a sandbox state implies: READY is running (containerd emits CREATED and
// STARTED together), NOTREADY is exited.
func sandboxStatePhase(s runtimeapi.PodSandboxState) Phase {
	if s == runtimeapi.PodSandboxState_SANDBOX_READY {
		return PhaseRunning
	}
	return PhaseExited
}

// exitReason is containerd's rule for the reason of an exited container: OOMKilled when the OOM is
// known, else the reason already recorded, else Completed for exit 0 and Error otherwise.
func exitReason(oom bool, recorded string, exitCode int32) string {
	switch {
	case oom:
		return reasonOOMKilled
	case recorded != "":
		return recorded
	case exitCode == 0:
		return reasonCompleted
	}
	return reasonError
}

// containerEffective returns the status containerd's CRI answers for a container whose last answer is
// base, once phase and the fast facts are applied, and whether it is complete enough for an event of
// that phase. base is never modified: a change makes a copy. wantExit says the phase implies the process
// exited (Exited, or Removed after it started). synth allows building an exit without an exit code (the
// container vanished, or its status never caught up): exit code 255, reason Unknown, finished at
// synthAt, like containerd for an exit it did not observe. synthAt is also the start time of a running
// container no input gave a start time for.
func containerEffective(base *runtimeapi.ContainerStatus, phase Phase, wantExit bool, f facts, synth bool, synthAt int64) (*runtimeapi.ContainerStatus, bool) {
	if base == nil {
		return nil, false
	}
	out := base
	mut := func() *runtimeapi.ContainerStatus {
		if out == base {
			out = proto.Clone(base).(*runtimeapi.ContainerStatus)
		}
		return out
	}
	complete := true
	switch {
	case wantExit && base.State != runtimeapi.ContainerState_CONTAINER_EXITED:
		if !f.hasExit && !synth {
			complete = false
			break
		}
		if base.StartedAt == 0 && !f.startExact && !synth {
			// Only containerd's own start time may go out: wait for NRI's or a status answer.
			complete = false
			break
		}
		c := mut()
		c.State = runtimeapi.ContainerState_CONTAINER_EXITED
		if c.StartedAt == 0 {
			c.StartedAt = f.startedAt
		}
		if f.hasExit {
			c.ExitCode = f.exitCode
			c.FinishedAt = f.finishedAt
			c.Reason = exitReason(f.oom, firstNonEmpty(base.Reason, f.reason), f.exitCode)
		} else {
			c.ExitCode = exitCodeUnknown
			c.FinishedAt = f.finishedAt
			c.Reason = exitReason(f.oom, firstNonEmpty(base.Reason, f.reason, reasonUnknown), exitCodeUnknown)
		}
		if c.FinishedAt == 0 {
			c.FinishedAt = synthAt
		}
		if f.message != "" {
			c.Message = f.message
		}
	case phase == PhaseRunning && base.State == runtimeapi.ContainerState_CONTAINER_CREATED:
		if !f.startExact && !synth {
			// Only containerd's own start time may go out: wait for NRI's PostStartContainer or a
			// status answer (ensureFetch asks for one).
			complete = false
			break
		}
		c := mut()
		c.State = runtimeapi.ContainerState_CONTAINER_RUNNING
		c.StartedAt = f.startedAt
		if c.StartedAt == 0 {
			c.StartedAt = synthAt // no input knew the start time: the verification call brings it
		}
	}
	// containerd's TaskOOM handler sets Reason in every state, running included.
	if f.oom && out.Reason != reasonOOMKilled {
		mut().Reason = reasonOOMKilled
	}
	return out, complete
}

// sandboxEffective returns the sandbox status once phase is applied: an exited sandbox is NOTREADY
// (containerd's handleSandboxExit changes nothing else the status shows; the IPs go only later, when
// StopPodSandbox closes the network namespace: a status answer after it has none). A removed sandbox has
// no IPs: containerd's RemovePodSandbox refuses a sandbox whose network namespace is not closed yet, and
// its DELETED events carry the status without them.
func sandboxEffective(base *runtimeapi.PodSandboxStatus, phase Phase) *runtimeapi.PodSandboxStatus {
	if base == nil || phase < PhaseExited {
		return base
	}
	removed := phase == PhaseRemoved && hasIPs(base)
	if base.State == runtimeapi.PodSandboxState_SANDBOX_NOTREADY && !removed {
		return base
	}
	c := proto.Clone(base).(*runtimeapi.PodSandboxStatus)
	c.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	if removed {
		c.Network = &runtimeapi.PodSandboxNetworkStatus{}
	}
	return c
}

// hasIPs says whether a sandbox status has an IP.
func hasIPs(st *runtimeapi.PodSandboxStatus) bool {
	return st.GetNetwork().GetIp() != "" || len(st.GetNetwork().GetAdditionalIps()) > 0
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

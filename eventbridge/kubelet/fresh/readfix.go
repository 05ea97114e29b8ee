package fresh

import (
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
)

// running says whether a container state is older than an exit.
func running(st runtimeapi.ContainerState) bool {
	return st == runtimeapi.ContainerState_CONTAINER_RUNNING || st == runtimeapi.ContainerState_CONTAINER_CREATED
}

// readFix is, for one status-reading method, what the endpoint does with the runtime's answer
// (encoded) while some object is tracked as stopped ahead of it: overlay returns the answer with those
// objects shown as the stream reported them (nil when there is nothing to change), and forgets the
// objects whose stop the answer shows.
type readFix struct {
	overlay func(t *stoppedTracker, req, answer []byte) []byte
}

var readFixes = map[string]*readFix{
	kubelet.ContainerStatusMethod: {
		overlay: func(t *stoppedTracker, _, b []byte) []byte {
			var r runtimeapi.ContainerStatusResponse
			if proto.Unmarshal(b, &r) != nil || !t.overlayContainerStatus(r.GetStatus()) {
				return nil
			}
			return marshalOrNil(&r)
		},
	},
	kubelet.PodSandboxStatusMethod: {
		overlay: func(t *stoppedTracker, _, b []byte) []byte {
			var r runtimeapi.PodSandboxStatusResponse
			if proto.Unmarshal(b, &r) != nil {
				return nil
			}
			changed := false
			if st := r.GetStatus(); st != nil && t.staleSandbox(st.GetId(), st.GetState()) {
				st.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
				changed = true
			}
			for _, c := range r.GetContainersStatuses() {
				changed = t.overlayContainerStatus(c) || changed
			}
			if !changed {
				return nil
			}
			return marshalOrNil(&r)
		},
	},
	kubelet.ListContainersMethod: {
		overlay: func(t *stoppedTracker, req, b []byte) []byte {
			var r runtimeapi.ListContainersResponse
			if proto.Unmarshal(b, &r) != nil {
				return nil
			}
			changed := false
			for _, c := range r.GetContainers() {
				if t.staleContainer(c.GetId(), c.GetState()) {
					c.State = runtimeapi.ContainerState_CONTAINER_EXITED
					changed = true
				}
			}
			if !changed {
				return nil
			}
			// A state filter (the kubelet asks for RUNNING ones only when it lists running pods) no
			// longer matches the containers shown exited.
			var q runtimeapi.ListContainersRequest
			if proto.Unmarshal(req, &q) == nil && q.GetFilter().GetState() != nil {
				r.Containers = inState(r.Containers, q.GetFilter().GetState().GetState())
			}
			return marshalOrNil(&r)
		},
	},
	kubelet.ListPodSandboxMethod: {
		overlay: func(t *stoppedTracker, req, b []byte) []byte {
			var r runtimeapi.ListPodSandboxResponse
			if proto.Unmarshal(b, &r) != nil {
				return nil
			}
			changed := false
			for _, s := range r.GetItems() {
				if t.staleSandbox(s.GetId(), s.GetState()) {
					s.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
					changed = true
				}
			}
			if !changed {
				return nil
			}
			var q runtimeapi.ListPodSandboxRequest
			if proto.Unmarshal(req, &q) == nil && q.GetFilter().GetState() != nil {
				r.Items = inState(r.Items, q.GetFilter().GetState().GetState())
			}
			return marshalOrNil(&r)
		},
	},
}

// stateful is what readFixes read of an object in an answer: a ContainerStatus or a Container (S is
// runtimeapi.ContainerState), a PodSandbox (runtimeapi.PodSandboxState).
type stateful[S comparable] interface {
	GetId() string
	GetState() S
}

// inState returns, in place, the objects in state want: a list request's state filter, applied again to
// an answer whose states were overlaid.
func inState[T stateful[S], S comparable](objects []T, want S) []T {
	kept := objects[:0]
	for _, o := range objects {
		if o.GetState() == want {
			kept = append(kept, o)
		}
	}
	return kept
}

// marshalOrNil encodes m; nil when it cannot (the answer is then not rewritten).
func marshalOrNil(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil
	}
	return b
}

// staleContainer says whether the runtime shows running a container the stream reported stopped; an
// answer that shows it exited forgets it.
func (t *stoppedTracker) staleContainer(id string, st runtimeapi.ContainerState) bool {
	if id == "" || !t.any() {
		return false
	}
	if !running(st) {
		if st == runtimeapi.ContainerState_CONTAINER_EXITED {
			t.forget(id)
		}
		return false
	}
	return t.container(id) != nil
}

// staleSandbox is staleContainer for a sandbox.
func (t *stoppedTracker) staleSandbox(id string, st runtimeapi.PodSandboxState) bool {
	if id == "" || !t.any() {
		return false
	}
	if st != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.forget(id)
		return false
	}
	return t.sandbox(id)
}

// overlayContainerStatus shows st (the runtime's answer) as the STOPPED sent for it when the runtime
// still shows it running; it reports whether it changed st.
func (t *stoppedTracker) overlayContainerStatus(st *runtimeapi.ContainerStatus) bool {
	if st == nil || !t.staleContainer(st.GetId(), st.GetState()) {
		return false
	}
	sent := t.container(st.GetId())
	if sent == nil {
		return false
	}
	st.State = runtimeapi.ContainerState_CONTAINER_EXITED
	st.ExitCode = sent.GetExitCode()
	st.FinishedAt = sent.GetFinishedAt()
	st.Reason = sent.GetReason()
	st.Message = sent.GetMessage()
	if st.StartedAt == 0 {
		st.StartedAt = sent.GetStartedAt()
	}
	return true
}

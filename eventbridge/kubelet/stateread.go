package kubelet

import (
	"context"
	"fmt"
	"strings"
	"sync"
)

// ReadSource says where the endpoint answers the kubelet's reads ListPodSandbox, ListContainers,
// PodSandboxStatus and ContainerStatus (see ProxyConfig.ReadSource).
type ReadSource string

const (
	// ReadSourceRuntime forwards every read to the runtime, as every other call.
	ReadSourceRuntime ReadSource = "runtime"
	// ReadSourceState answers a read from pleg-nri's state when the state says it is current for what
	// is asked (ProxyConfig.State), and forwards it otherwise.
	ReadSourceState ReadSource = "state"
	// ReadSourceCheck answers every read with the runtime's answer, and compares it with the state's
	// where the state is current: each difference is counted and the first ones are logged.
	ReadSourceCheck ReadSource = "check"
)

// DefaultReadSource is the read source of a config that names none. The benchmark that decides
// whether the state becomes the default is still to run (docs/internals.md).
const DefaultReadSource = ReadSourceRuntime

// ParseReadSource checks a read source's name; "" is DefaultReadSource.
func ParseReadSource(s string) (ReadSource, error) {
	switch m := ReadSource(s); m {
	case "":
		return DefaultReadSource, nil
	case ReadSourceRuntime, ReadSourceState, ReadSourceCheck:
		return m, nil
	}
	return "", fmt.Errorf("unknown read source %q: want %q, %q or %q", s, ReadSourceRuntime, ReadSourceState, ReadSourceCheck)
}

// EncodedStateReader answers the kubelet's reads from pleg-nri's state, on encoded messages: method is
// the read's full CRI method name and req its encoded request; ok false says "ask the runtime" (the
// state is not known to be current for what is asked). An answer given must be the runtime's own
// (field for field; a list's entries in any order). The front's is its corelink.Relay, which asks the
// core.
type EncodedStateReader interface {
	ReadState(ctx context.Context, method string, req []byte) (answer []byte, ok bool)
}

// stateReads are the reads the endpoint can answer from the state.
var stateReadMethods = map[string]bool{ListPodSandboxMethod: true, ListContainersMethod: true, PodSandboxStatusMethod: true, ContainerStatusMethod: true}

// mutations tracks the calls forwarded through the endpoint that may change what a read answers, from
// before they reach the runtime until its answer: containerd can show their effect before it calls the
// NRI hook that tells pleg-nri (a StartContainer's running state comes before its PostStartContainer,
// a removed container is still listed after its RemoveContainer hook), so the reads they may change
// are forwarded meanwhile. Once the runtime answered, each of its NRI hooks has been delivered.
type mutations struct {
	// mu guards everything below.
	mu sync.Mutex
	// n counts the mutating calls in flight; wide those that may change any object's status (a pod's
	// stop or removal, an image pulled or removed, a method the endpoint does not know); ids the
	// objects named by the others.
	n, wide int
	ids     map[string]int
	// begun counts the mutating calls begun, for the check mode's "nothing changed meanwhile".
	begun uint64
}

// readOnly are the methods that change nothing a read answers.
var readOnly = map[string]bool{}

func init() {
	for _, m := range []string{"Version", "Status", "RuntimeConfig", "ContainerStatus", "PodSandboxStatus", "ListContainers",
		"ListPodSandbox", "ContainerStats", "ListContainerStats", "PodSandboxStats", "ListPodSandboxStats",
		"ListMetricDescriptors", "ListPodSandboxMetrics", "ExecSync", "Exec", "Attach", "PortForward",
		"ReopenContainerLog", "GetContainerEvents"} {
		readOnly[RuntimeServicePrefix+m] = true
	}
	for _, m := range []string{"ListImages", "ImageStatus", "ImageFsInfo"} {
		readOnly[ImageServicePrefix+m] = true
	}
}

// oneObject are the mutating methods that change only the object their request names first (field 1).
var oneObject = map[string]bool{
	StartContainerMethod:           true,
	StopContainerMethod:            true,
	RemoveContainerMethod:          true,
	UpdateContainerResourcesMethod: true,
}

// mutating says whether a call of method may change what a read answers.
func mutating(method string) bool {
	return !readOnly[method] && !strings.HasPrefix(method, "/plegnri.")
}

// begin records a mutating call of method naming id (its request's first field; "" for a wide call);
// end, called once the runtime answered, forgets it.
func (m *mutations) begin(method, id string) (end func()) {
	wide := !oneObject[method] || id == ""
	m.mu.Lock()
	m.n++
	m.begun++
	if wide {
		m.wide++
	} else {
		if m.ids == nil {
			m.ids = map[string]int{}
		}
		m.ids[id]++
	}
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.n--
		if wide {
			m.wide--
		} else if m.ids[id]--; m.ids[id] == 0 {
			delete(m.ids, id)
		}
	}
}

// blocks says whether a call in flight may change the answer of a read of method whose request names
// id first (the status reads); begun is the count of mutating calls begun so far.
func (m *mutations) blocks(method, id string) (blocked bool, begun uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch method {
	case ContainerStatusMethod, PodSandboxStatusMethod:
		return m.wide > 0 || m.ids[id] > 0, m.begun
	}
	return m.n > 0, m.begun
}

// quietSince says whether no mutating call began since begun and none is in flight.
func (m *mutations) quietSince(begun uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.begun == begun && m.n == 0
}

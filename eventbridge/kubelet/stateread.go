package kubelet

import (
	"github.com/pleg-nri/pleg-nri/internal/grpcraw"

	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
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

// The reads the endpoint can answer from the state.
const (
	ListPodSandboxMethod   = "/runtime.v1.RuntimeService/ListPodSandbox"
	ListContainersMethod   = "/runtime.v1.RuntimeService/ListContainers"
	PodSandboxStatusMethod = "/runtime.v1.RuntimeService/PodSandboxStatus"
	ContainerStatusMethod  = "/runtime.v1.RuntimeService/ContainerStatus"
)

// StateReader answers the kubelet's reads from pleg-nri's state (pleg.PLEG implements it). Each method
// returns ok false when the state is not known to be current for what is asked: the endpoint then asks
// the runtime. An answer given must be the runtime's own (field for field; a list's entries in any
// order), and the reader must not keep or modify it.
type StateReader interface {
	ListPodSandbox(ctx context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, bool)
	ListContainers(ctx context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, bool)
	PodSandboxStatus(ctx context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, bool)
	ContainerStatus(ctx context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, bool)
}

// EncodedStateReader is a StateReader on encoded messages: method is the read's full CRI method name
// and req its encoded request; ok false says "ask the runtime". The front's is its Relay, which asks
// the core (StateMethodPrefix); EncodeStateReader makes one of a StateReader.
type EncodedStateReader interface {
	ReadState(ctx context.Context, method string, req []byte) (answer []byte, ok bool)
}

// StateMethodPrefix names the core's own methods (on its event socket only, not part of the CRI) that
// answer a read from the state: StateMethodPrefix + "ListContainers" takes and gives the CRI's messages
// of ListContainers, or fails with FAILED_PRECONDITION when the state is not current.
const StateMethodPrefix = "/plegnri.v1.State/"

// stateMethods decodes, per read, a request and asks a StateReader.
var stateMethods = map[string]func(ctx context.Context, s StateReader, req []byte) (proto.Message, bool){
	ListPodSandboxMethod: func(ctx context.Context, s StateReader, req []byte) (proto.Message, bool) {
		var r runtimeapi.ListPodSandboxRequest
		if proto.Unmarshal(req, &r) != nil {
			return nil, false
		}
		return s.ListPodSandbox(ctx, &r)
	},
	ListContainersMethod: func(ctx context.Context, s StateReader, req []byte) (proto.Message, bool) {
		var r runtimeapi.ListContainersRequest
		if proto.Unmarshal(req, &r) != nil {
			return nil, false
		}
		return s.ListContainers(ctx, &r)
	},
	PodSandboxStatusMethod: func(ctx context.Context, s StateReader, req []byte) (proto.Message, bool) {
		var r runtimeapi.PodSandboxStatusRequest
		if proto.Unmarshal(req, &r) != nil {
			return nil, false
		}
		return s.PodSandboxStatus(ctx, &r)
	},
	ContainerStatusMethod: func(ctx context.Context, s StateReader, req []byte) (proto.Message, bool) {
		var r runtimeapi.ContainerStatusRequest
		if proto.Unmarshal(req, &r) != nil {
			return nil, false
		}
		return s.ContainerStatus(ctx, &r)
	},
}

// EncodeStateReader returns s as an EncodedStateReader. Its answers are encoded deterministically (maps
// in key order), so that two answers of the same state are the same bytes.
func EncodeStateReader(s StateReader) EncodedStateReader { return encodedState{s} }

type encodedState struct{ s StateReader }

func (e encodedState) ReadState(ctx context.Context, method string, req []byte) ([]byte, bool) {
	read := stateMethods[method]
	if read == nil {
		return nil, false
	}
	m, ok := read(ctx, e.s, req)
	if !ok {
		return nil, false
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	return b, err == nil
}

// ReadState asks the core behind the relay to answer a read from its state (StateMethodPrefix); any
// failure (the core restarting, its state not current) is "ask the runtime".
func (r *Relay) ReadState(ctx context.Context, method string, req []byte) ([]byte, bool) {
	if stateMethods[method] == nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, stateReadTimeout)
	defer cancel()
	var out grpcraw.Frame
	defer out.Free()
	if err := r.conn.Invoke(ctx, StateMethodPrefix+method[strings.LastIndexByte(method, '/')+1:], &grpcraw.Frame{Data: req}, &out,
		grpc.ForceCodecV2(grpcraw.Codec{})); err != nil {
		return nil, false
	}
	return out.Bytes(), true
}

// stateReadTimeout bounds the front's question to the core: a core that does not answer at once
// (stuck, or going away) leaves the read to the runtime.
const stateReadTimeout = 500 * time.Millisecond

// serveStateMethod answers a StateMethodPrefix method (the core's socket) from p.serveState.
func (p *Proxy) serveStateMethod(ss grpc.ServerStream, method string) error {
	var req grpcraw.Frame
	if err := ss.RecvMsg(&req); err != nil {
		return err
	}
	b := req.Keep()
	cri := "/runtime.v1.RuntimeService/" + strings.TrimPrefix(method, StateMethodPrefix)
	if stateMethods[cri] == nil {
		return status.Errorf(codes.Unimplemented, "unknown state method %s", method)
	}
	answer, ok := p.serveState.ReadState(ss.Context(), cri, b)
	if !ok {
		return status.Error(codes.FailedPrecondition, "the state is not current for this read: ask the runtime")
	}
	return ss.SendMsg(&grpcraw.Frame{Data: answer})
}

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
		readOnly["/runtime.v1.RuntimeService/"+m] = true
	}
	for _, m := range []string{"ListImages", "ImageStatus", "ImageFsInfo"} {
		readOnly["/runtime.v1.ImageService/"+m] = true
	}
}

// oneObject are the mutating methods that change only the object their request names first (field 1).
var oneObject = map[string]bool{
	"/runtime.v1.RuntimeService/StartContainer":           true,
	"/runtime.v1.RuntimeService/StopContainer":            true,
	"/runtime.v1.RuntimeService/RemoveContainer":          true,
	"/runtime.v1.RuntimeService/UpdateContainerResources": true,
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

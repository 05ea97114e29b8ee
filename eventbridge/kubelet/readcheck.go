package kubelet

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/containerd/log"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The results of a read the endpoint could answer from the state (StateReadMetrics).
const (
	// StateReadState: answered from the state.
	StateReadState = "state"
	// StateReadRuntime: the state was not current (or a mutating call was in flight): the runtime's
	// answer went out, and the check mode compared nothing.
	StateReadRuntime = "runtime"
	// StateReadEqual and StateReadDiffer: the check mode compared the state's answer with the
	// runtime's.
	StateReadEqual  = "equal"
	StateReadDiffer = "differ"
	// StateReadInconclusive: the check mode could not compare: something changed while it asked (a
	// mutating call, the state's answer), or the runtime failed.
	StateReadInconclusive = "inconclusive"
)

// StateReadMetrics is implemented by a Metrics that counts the reads the endpoint could answer from the
// state (ProxyConfig.ReadSource): result is one of the StateRead constants.
type StateReadMetrics interface {
	StateRead(method, result string)
}

// maxLoggedDifferences is how many differences the check mode logs (each one counts, always).
const maxLoggedDifferences = 20

// stateReads is the read-source hook: it answers the reads from the state (ReadSourceState) or checks
// the runtime's answers against it (ReadSourceCheck), and tracks the mutating calls in flight, which may
// change what a read answers.
type stateReads struct {
	source  ReadSource
	state   EncodedStateReader
	metrics Metrics
	now     func() time.Time
	muts    mutations
	// logged counts the differences logged.
	logged atomic.Int32
}

var _ ReadHook = (*stateReads)(nil)

func newStateReads(source ReadSource, state EncodedStateReader, metrics Metrics, now func() time.Time) *stateReads {
	return &stateReads{source: source, state: state, metrics: metrics, now: now}
}

// Sending does nothing: the state is the core's.
func (*stateReads) Sending([]byte) {}

// Wants the reads the state can answer, and every call that may change what they answer.
func (r *stateReads) Wants(method string) bool { return stateReadMethods[method] || mutating(method) }

// Call answers a read (from the state when it is current and no mutating call in flight may change the
// answer, in the state mode; with the runtime's answer, compared with the state's, in the check mode),
// or forwards a mutating call, counted in flight until the runtime answered.
func (r *stateReads) Call(ctx context.Context, c *Call, forward func(context.Context) error) error {
	if !stateReadMethods[c.Method()] {
		defer r.muts.begin(c.Method(), c.ObjectID())()
		return forward(ctx)
	}
	req := c.Request()
	blocked, begun := r.muts.blocks(c.Method(), c.ObjectID())
	var before []byte
	ok := false
	if !blocked {
		before, ok = r.state.ReadState(ctx, c.Method(), req)
	}
	// NOTE: a mutating call that begins after blocks is concurrent with this read: either answer, before
	// or after its change, is one the runtime could give.
	if ok && r.source == ReadSourceState {
		r.stateRead(c.Method(), StateReadState)
		c.SetAnswer(before)
		return nil
	}
	if err := forward(ctx); err != nil {
		return err
	}
	switch {
	case !ok || r.source != ReadSourceCheck:
		r.stateRead(c.Method(), StateReadRuntime)
	default:
		r.check(ctx, c, begun, before)
	}
	return nil
}

// stateRead reports a read's result to the metrics.
func (r *stateReads) stateRead(method, result string) {
	if m, ok := r.metrics.(StateReadMetrics); ok {
		m.StateRead(method, result)
	}
}

// check compares the state's answer (before, asked before the runtime) with the runtime's in c, when
// nothing changed meanwhile: no mutating call began, and the state answers the same after.
func (r *stateReads) check(ctx context.Context, c *Call, begun uint64, before []byte) {
	after, ok := r.state.ReadState(ctx, c.Method(), c.Request())
	if !ok || !bytes.Equal(before, after) || !r.muts.quietSince(begun) {
		r.stateRead(c.Method(), StateReadInconclusive)
		return
	}
	runtimeAnswer, err := c.RuntimeAnswer()
	var diffs []string
	switch {
	case err != nil && status.Code(err) == codes.NotFound:
		diffs = []string{"the runtime answered NotFound: " + status.Convert(err).Message()}
	case err != nil:
		r.stateRead(c.Method(), StateReadInconclusive)
		return
	default:
		if diffs, err = compareAnswers(c.Method(), before, runtimeAnswer); err != nil {
			diffs = []string{err.Error()}
		}
	}
	if len(diffs) == 0 {
		r.stateRead(c.Method(), StateReadEqual)
		return
	}
	r.stateRead(c.Method(), StateReadDiffer)
	if r.logged.Add(1) <= maxLoggedDifferences {
		log.G(ctx).WithField("method", c.Method()).WithField("fields", diffs).
			Warn("read-source check: the state's answer differs from the runtime's")
	}
}

// newAnswer returns an empty answer message of a read.
func newAnswer(method string) proto.Message {
	switch method {
	case ListPodSandboxMethod:
		return &runtimeapi.ListPodSandboxResponse{}
	case ListContainersMethod:
		return &runtimeapi.ListContainersResponse{}
	case PodSandboxStatusMethod:
		return &runtimeapi.PodSandboxStatusResponse{}
	case ContainerStatusMethod:
		return &runtimeapi.ContainerStatusResponse{}
	}
	return nil
}

// compareAnswers returns where two encoded answers of a read differ, as field paths ("status.state",
// "containers[<id>].image", "containers[<id>]: only in the runtime's"); none when they are equal
// (proto.Equal), a list's entries being compared by id, in any order: containerd lists its store's
// map, in an order that differs from one call to the next.
func compareAnswers(method string, state, runtime []byte) ([]string, error) {
	a, b := newAnswer(method), newAnswer(method)
	if a == nil {
		return nil, fmt.Errorf("no answer type for %s", method)
	}
	if err := proto.Unmarshal(state, a); err != nil {
		return nil, fmt.Errorf("state's answer: %w", err)
	}
	if err := proto.Unmarshal(runtime, b); err != nil {
		return nil, fmt.Errorf("runtime's answer: %w", err)
	}
	switch a := a.(type) {
	case *runtimeapi.ListPodSandboxResponse:
		return diffLists("items", a.GetItems(), b.(*runtimeapi.ListPodSandboxResponse).GetItems()), nil
	case *runtimeapi.ListContainersResponse:
		return diffLists("containers", a.GetContainers(), b.(*runtimeapi.ListContainersResponse).GetContainers()), nil
	}
	return diffFields("", a.ProtoReflect(), b.ProtoReflect()), nil
}

// listEntry is an entry of a list answer.
type listEntry interface {
	proto.Message
	GetId() string
}

// diffLists compares two lists by id.
func diffLists[T listEntry](name string, state, runtime []T) []string {
	byID := func(x, y T) int { return cmp.Compare(x.GetId(), y.GetId()) }
	state, runtime = slices.Clone(state), slices.Clone(runtime)
	slices.SortFunc(state, byID)
	slices.SortFunc(runtime, byID)
	var diffs []string
	i, j := 0, 0
	for i < len(state) || j < len(runtime) {
		switch {
		case j == len(runtime) || (i < len(state) && state[i].GetId() < runtime[j].GetId()):
			diffs = append(diffs, fmt.Sprintf("%s[%s]: only in the state's", name, state[i].GetId()))
			i++
		case i == len(state) || runtime[j].GetId() < state[i].GetId():
			diffs = append(diffs, fmt.Sprintf("%s[%s]: only in the runtime's", name, runtime[j].GetId()))
			j++
		default:
			diffs = append(diffs, diffFields(fmt.Sprintf("%s[%s].", name, state[i].GetId()), state[i].ProtoReflect(), runtime[j].ProtoReflect())...)
			i, j = i+1, j+1
		}
	}
	return diffs
}

// diffFields returns the fields (prefixed) in which two messages of one type differ, down to the fields
// of their message fields.
func diffFields(prefix string, a, b protoreflect.Message) []string {
	var diffs []string
	fields := a.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		va, vb := a.Get(fd), b.Get(fd)
		if fd.Kind() == protoreflect.MessageKind && !fd.IsList() && !fd.IsMap() && a.Has(fd) && b.Has(fd) {
			diffs = append(diffs, diffFields(prefix+string(fd.Name())+".", va.Message(), vb.Message())...)
			continue
		}
		if a.Has(fd) != b.Has(fd) || !va.Equal(vb) {
			diffs = append(diffs, prefix+string(fd.Name()))
		}
	}
	return diffs
}

package corelink

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/internal/grpcraw"
)

// The core's own methods (not part of the CRI), on its socket only.
const (
	// RefreshStoppedMethod asks the core to send an object's STOPPED again, stamped now
	// (pleg.PLEG.RefreshStopped): its request is a google.protobuf.StringValue holding the id of a
	// container or sandbox, its answer a google.protobuf.Empty.
	RefreshStoppedMethod = "/plegnri.v1.Core/RefreshStopped"
	// StateMethodPrefix names the methods that answer a read from the state: StateMethodPrefix +
	// "ListContainers" takes and gives the CRI's messages of ListContainers, or fails with
	// FAILED_PRECONDITION when the state is not current for what is asked.
	StateMethodPrefix = "/plegnri.v1.State/"
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

// Core is the core's side of the link: the service of its socket (serve it with kubelet.NewServer).
type Core struct {
	events  *kubelet.EventService
	refresh func(id string)
	state   StateReader
}

// CoreConfig is everything a Core is built from.
type CoreConfig struct {
	// Events is the core's fan-out. Required.
	Events kubelet.EventSource
	// Metrics is told about the streams and the events sent (the core's send latency); nil: none.
	Metrics kubelet.Metrics
	// RefreshStopped answers RefreshStoppedMethod (pleg.PLEG.RefreshStopped); nil: UNIMPLEMENTED.
	RefreshStopped func(id string)
	// State answers the StateMethodPrefix methods (the core's pleg.PLEG); nil: UNIMPLEMENTED.
	State StateReader
}

// CoreMaxEventStreams bounds the core's streams, both in all and per connection: its client is the
// front, whose relay carries every stream of the kubelet's endpoint over one connection, and two
// fronts' during a takeover (the old front's streams end once the new one serves).
const CoreMaxEventStreams = 2 * kubelet.DefaultMaxEventStreams

// NewCore returns the core's service of cfg.
func NewCore(cfg CoreConfig) (*Core, error) {
	events, err := kubelet.NewEventService(kubelet.EventServiceConfig{Source: cfg.Events, Metrics: cfg.Metrics,
		MaxEventStreams: CoreMaxEventStreams, MaxEventStreamsPerConnection: CoreMaxEventStreams})
	if err != nil {
		return nil, err
	}
	return &Core{events: events, refresh: cfg.RefreshStopped, state: cfg.State}, nil
}

// ServerOptions makes a grpc.Server the core's service (kubelet.ServerOptions).
func (c *Core) ServerOptions() []grpc.ServerOption { return kubelet.ServerOptions(c.handle) }

// Shutdown ends the open event streams (UNAVAILABLE) and refuses new ones.
func (c *Core) Shutdown() { c.events.Shutdown() }

// handle is the grpc.StreamHandler of every method.
func (c *Core) handle(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "no method in stream")
	}
	switch {
	case method == kubelet.GetContainerEventsMethod:
		return c.events.Serve(ss)
	case method == RefreshStoppedMethod && c.refresh != nil:
		return c.serveRefreshStopped(ss)
	case strings.HasPrefix(method, StateMethodPrefix) && c.state != nil:
		return c.serveState(ss, method)
	}
	return status.Errorf(codes.Unimplemented,
		"%s: pleg-nri's core socket serves pleg-nri's front only; use the kubelet's CRI endpoint (pleg-nri's listen) or containerd's", method)
}

// serveRefreshStopped answers RefreshStoppedMethod.
func (c *Core) serveRefreshStopped(ss grpc.ServerStream) error {
	var req grpcraw.Frame
	if err := ss.RecvMsg(&req); err != nil {
		return err
	}
	var id wrapperspb.StringValue
	if err := proto.Unmarshal(req.Keep(), &id); err != nil || id.GetValue() == "" {
		return status.Error(codes.InvalidArgument, "RefreshStopped: want a google.protobuf.StringValue with an id")
	}
	c.refresh(id.GetValue())
	return ss.SendMsg(&emptypb.Empty{})
}

// stateReads decodes, per read, a request and asks a StateReader.
var stateReads = map[string]func(ctx context.Context, s StateReader, req []byte) (proto.Message, bool){
	kubelet.ListPodSandboxMethod: func(ctx context.Context, s StateReader, req []byte) (proto.Message, bool) {
		var r runtimeapi.ListPodSandboxRequest
		if proto.Unmarshal(req, &r) != nil {
			return nil, false
		}
		return s.ListPodSandbox(ctx, &r)
	},
	kubelet.ListContainersMethod: func(ctx context.Context, s StateReader, req []byte) (proto.Message, bool) {
		var r runtimeapi.ListContainersRequest
		if proto.Unmarshal(req, &r) != nil {
			return nil, false
		}
		return s.ListContainers(ctx, &r)
	},
	kubelet.PodSandboxStatusMethod: func(ctx context.Context, s StateReader, req []byte) (proto.Message, bool) {
		var r runtimeapi.PodSandboxStatusRequest
		if proto.Unmarshal(req, &r) != nil {
			return nil, false
		}
		return s.PodSandboxStatus(ctx, &r)
	},
	kubelet.ContainerStatusMethod: func(ctx context.Context, s StateReader, req []byte) (proto.Message, bool) {
		var r runtimeapi.ContainerStatusRequest
		if proto.Unmarshal(req, &r) != nil {
			return nil, false
		}
		return s.ContainerStatus(ctx, &r)
	},
}

// stateRead answers a read of the CRI method from s, encoded deterministically (maps in key order), so
// that two answers of the same state are the same bytes; ok false: not from the state.
func stateRead(ctx context.Context, s StateReader, method string, req []byte) ([]byte, bool) {
	read := stateReads[method]
	if read == nil {
		return nil, false
	}
	m, ok := read(ctx, s, req)
	if !ok {
		return nil, false
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	return b, err == nil
}

// serveState answers a StateMethodPrefix method.
func (c *Core) serveState(ss grpc.ServerStream, method string) error {
	var req grpcraw.Frame
	if err := ss.RecvMsg(&req); err != nil {
		return err
	}
	cri := kubelet.RuntimeServicePrefix + strings.TrimPrefix(method, StateMethodPrefix)
	if stateReads[cri] == nil {
		return status.Errorf(codes.Unimplemented, "unknown state method %s", method)
	}
	answer, ok := stateRead(ss.Context(), c.state, cri, req.Keep())
	if !ok {
		return status.Error(codes.FailedPrecondition, "the state is not current for this read: ask the runtime")
	}
	return ss.SendMsg(&grpcraw.Frame{Data: answer})
}

// RefreshStopped asks the core for a refresh of id's STOPPED (RefreshStoppedMethod): the front's
// fresh.Config.Refresh.
func (r *Relay) RefreshStopped(ctx context.Context, id string) error {
	var out emptypb.Empty
	return r.conn.Invoke(ctx, RefreshStoppedMethod, wrapperspb.String(id), &out, grpc.ForceCodecV2(grpcraw.Codec{}))
}

// stateReadTimeout bounds the front's question to the core: a core that does not answer at once
// (stuck, or going away) leaves the read to the runtime.
const stateReadTimeout = 500 * time.Millisecond

// ReadState asks the core to answer a read from its state (StateMethodPrefix): the front's
// kubelet.EncodedStateReader. Any failure (the core restarting, its state not current) is "ask the
// runtime".
func (r *Relay) ReadState(ctx context.Context, method string, req []byte) ([]byte, bool) {
	if stateReads[method] == nil {
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

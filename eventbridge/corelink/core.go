package corelink

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/internal/grpcraw"
)

// The core's own methods (not part of the CRI), on its socket only.
const (
	// RefreshStoppedMethod asks the core to send an object's STOPPED again, stamped now
	// (pleg.PLEG.RefreshStopped): its request is a google.protobuf.StringValue holding the id of a
	// container or sandbox, its answer a google.protobuf.Empty.
	RefreshStoppedMethod = "/plegnri.v1.Core/RefreshStopped"
)

// Core is the core's side of the link: the service of its socket (serve it with kubelet.NewServer).
type Core struct {
	events  *kubelet.EventService
	refresh func(id string)
}

// CoreConfig is everything a Core is built from.
type CoreConfig struct {
	// Events is the core's fan-out. Required.
	Events kubelet.EventSource
	// Metrics is told about the streams and the events sent (the core's send latency); nil: none.
	Metrics kubelet.Metrics
	// RefreshStopped answers RefreshStoppedMethod (pleg.PLEG.RefreshStopped); nil: UNIMPLEMENTED.
	RefreshStopped func(id string)
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
	return &Core{events: events, refresh: cfg.RefreshStopped}, nil
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

// RefreshStopped asks the core for a refresh of id's STOPPED (RefreshStoppedMethod): the front's
// fresh.Config.Refresh.
func (r *Relay) RefreshStopped(ctx context.Context, id string) error {
	var out emptypb.Empty
	return r.conn.Invoke(ctx, RefreshStoppedMethod, wrapperspb.String(id), &out, grpc.ForceCodecV2(grpcraw.Codec{}))
}

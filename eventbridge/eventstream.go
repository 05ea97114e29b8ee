package eventbridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// EventSource gives each GetContainerEvents stream its own subscription to pleg-nri's events. The daemon
// adapts the core's fan-out to it.
type EventSource interface {
	// Subscribe returns a new subscription that receives every event from now on.
	Subscribe() EventStream
}

// EventStream is one subscriber's stream of events.
type EventStream interface {
	// Next returns the next event and the time its source saw the fact (for the latency metric; zero
	// when unknown). It blocks until there is one, ctx is done (then it returns ctx's error and consumes
	// no event: the proxy ends a Next to send a refresh event and calls it again), or the
	// subscription ends: the error then says why and ends the client's stream, e.g. a gRPC status
	// error with codes.ResourceExhausted when the subscriber was evicted for being too slow.
	Next(ctx context.Context) (*runtimeapi.ContainerEventResponse, time.Time, error)
	// Close ends the subscription. It is called exactly once, when the client's stream ends.
	Close()
}

// EncodedEventStream is an EventStream that also hands out its events already encoded (protobuf), the
// same bytes for every stream: the proxy then sends them as they are instead of encoding each event once
// per subscriber.
type EncodedEventStream interface {
	EventStream
	// NextEncoded is Next, with the event encoded. The bytes are shared: they are never modified.
	NextEncoded(ctx context.Context) ([]byte, time.Time, error)
}

// errShuttingDown ends the event streams open when the proxy shuts down, and refuses new ones.
var errShuttingDown = status.Error(codes.Unavailable, "pleg-nri is shutting down")

// serveEvents answers GetContainerEvents from the event source: one subscription per stream, every event
// sent, until the subscription ends (its error is the stream's status), the client goes away or the
// proxy shuts down.
func (p *Proxy) serveEvents(ss grpc.ServerStream) (err error) {
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	logger := log.G(ctx).WithField("method", GetContainerEventsMethod)

	var req runtimeapi.GetEventsRequest
	if err := ss.RecvMsg(&req); err != nil {
		return err
	}
	select {
	case <-p.shutdown:
		return errShuttingDown
	default:
	}

	stream := p.events.Subscribe()
	p.metrics.EventStreamOpened()
	logger.Info("event stream opened")
	defer func() {
		stream.Close()
		code := status.Code(err)
		p.metrics.EventStreamClosed(code)
		entry := logger.WithField("code", code)
		if code == codes.Canceled || code == codes.OK {
			entry.Info("event stream closed by the client")
		} else {
			entry.WithError(err).Warn("event stream ended")
		}
	}()

	// next's context also ends when a refresh event is to be sent (see refresh.go); a Next ended by its
	// context consumes no event.
	var nextCtx interruptible
	nextCtx.reset(ctx)
	defer nextCtx.interrupt()
	var refreshSeq uint64
	var wake <-chan struct{}
	if p.refresh != nil {
		refreshSeq, wake = p.refresh.position()
	}
	// End Next when the proxy shuts down or a refresh event comes; this goroutine ends with ctx at the
	// latest.
	go func() {
		for {
			select {
			case <-p.shutdown:
				cancel()
				return
			case <-ctx.Done():
				return
			case <-wake:
				nextCtx.interrupt()
				_, wake = p.refresh.position()
			}
		}
	}()

	next := func(ctx context.Context) ([]byte, time.Time, error) {
		ev, sourceTime, err := stream.Next(ctx)
		if err != nil {
			return nil, sourceTime, err
		}
		b, err := proto.Marshal(ev)
		if err != nil {
			return nil, sourceTime, status.Errorf(codes.Internal, "failed to marshal event: %v", err)
		}
		return b, sourceTime, nil
	}
	if enc, ok := stream.(EncodedEventStream); ok {
		next = enc.NextEncoded
	}
	var f frame
	send := func(b []byte) error {
		if p.fresh != nil {
			// Before the send: a read the event causes must find the object tracked.
			p.fresh.observe(b)
		}
		f.data = b
		return ss.SendMsg(&f)
	}
	for {
		nctx := nextCtx.get()
		b, sourceTime, err := next(nctx)
		if err != nil && ctx.Err() == nil && nctx.Err() != nil {
			// A refresh event: a new context first (a later one cancels it), then the events.
			nextCtx.reset(ctx)
			var refreshes [][]byte
			refreshes, refreshSeq = p.refresh.since(refreshSeq)
			for _, rb := range refreshes {
				if err := send(rb); err != nil {
					return err
				}
				p.metrics.EventSent(0)
			}
			continue
		}
		if err != nil {
			return p.eventStreamError(ss.Context(), err)
		}
		if err := send(b); err != nil {
			return err
		}
		if !sourceTime.IsZero() {
			p.metrics.EventSent(p.now().Sub(sourceTime))
		} else {
			p.metrics.EventSent(0)
		}
	}
}

// interruptible is a context that another goroutine can end, and that can be made anew.
type interruptible struct {
	// mu guards ctx and cancel.
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
}

// reset replaces the context with a new child of parent.
func (i *interruptible) reset(parent context.Context) {
	ctx, cancel := context.WithCancel(parent)
	i.mu.Lock()
	i.ctx, i.cancel = ctx, cancel
	i.mu.Unlock()
}

// get returns the current context.
func (i *interruptible) get() context.Context {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.ctx
}

// interrupt ends the current context.
func (i *interruptible) interrupt() {
	i.mu.Lock()
	i.cancel()
	i.mu.Unlock()
}

// eventStreamError turns the error that ended an event stream into the status the client gets: a gRPC
// status error as it is, the client's own cancellation as Canceled, the proxy's shutdown as Unavailable.
func (p *Proxy) eventStreamError(clientCtx context.Context, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		if clientCtx.Err() != nil {
			return status.FromContextError(clientCtx.Err()).Err()
		}
		select {
		case <-p.shutdown:
			return errShuttingDown
		default:
		}
	}
	// An errdefs error (e.g. errdefs.ErrResourceExhausted) gets its gRPC code; anything else is Unknown.
	return errgrpc.ToGRPC(fmt.Errorf("event stream ended: %w", err))
}

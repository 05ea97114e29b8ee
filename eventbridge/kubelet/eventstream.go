package kubelet

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

	"github.com/pleg-nri/pleg-nri/internal/grpcraw"
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
	// when unknown). It blocks until there is one, ctx is done, or the subscription ends: the error then
	// says why and ends the client's stream, e.g. a gRPC status error with codes.ResourceExhausted when
	// the subscriber was evicted for being too slow. A Next ended by ctx may lose what the subscription
	// had queued (a Relay ends its stream from the core): the EventService ends a Next only when the client's stream
	// ends, and closes the subscription then.
	Next(ctx context.Context) (*runtimeapi.ContainerEventResponse, time.Time, error)
	// Close ends the subscription, and a pending Next with it. It is called exactly once, when the
	// client's stream ends.
	Close()
}

// EncodedEventStream is an EventStream that also hands out its events already encoded (protobuf), the
// same bytes for every stream: the EventService then sends them as they are instead of encoding each event once
// per subscriber.
type EncodedEventStream interface {
	EventStream
	// NextEncoded is Next, with the event encoded. The bytes are shared: they are never modified.
	NextEncoded(ctx context.Context) ([]byte, time.Time, error)
}

// errShuttingDown ends the event streams open when the service shuts down, and refuses new ones.
var errShuttingDown = status.Error(codes.Unavailable, "pleg-nri is shutting down")

// EventService answers GetContainerEvents from an EventSource, one subscription per stream, within the
// caps on open streams (streamlimit.go). The kubelet's endpoint (Proxy) and the core's socket (package
// corelink) serve their streams with one.
type EventService struct {
	source  EventSource
	metrics Metrics
	// now is the clock of the latency metric.
	now     func() time.Time
	streams streamLimiter
	// sending, when set, is told of each event, encoded, before it is written to a stream.
	sending func(event []byte)

	// shutdown is closed by Shutdown: open streams end with codes.Unavailable.
	shutdown     chan struct{}
	shutdownOnce sync.Once
}

// EventServiceConfig is everything an EventService is built from.
type EventServiceConfig struct {
	// Source gives each stream its subscription. Required.
	Source EventSource
	// Metrics is told about the streams and the events sent; nil is NopMetrics. It may also implement
	// StreamLimitMetrics.
	Metrics Metrics
	// MaxEventStreams bounds the streams open at once; a stream beyond it ends at once with
	// RESOURCE_EXHAUSTED (streamlimit.go). Default DefaultMaxEventStreams; negative: no bound.
	MaxEventStreams int
	// MaxEventStreamsPerConnection bounds them per client connection, likewise; default
	// DefaultMaxEventStreamsPerConnection; negative: no bound. Connections are told apart only on a
	// server made with ServerOptions: elsewhere only MaxEventStreams holds.
	MaxEventStreamsPerConnection int
	// Sending, when set, is told of each event, encoded, before it is written to a stream: a read the
	// event causes comes after it (read freshness). It must not keep or modify the bytes.
	Sending func(event []byte)
}

// NewEventService returns an EventService of cfg.
func NewEventService(cfg EventServiceConfig) (*EventService, error) {
	if cfg.Source == nil {
		return nil, errors.New("event service: no event source")
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NopMetrics{}
	}
	if cfg.MaxEventStreams == 0 {
		cfg.MaxEventStreams = DefaultMaxEventStreams
	}
	if cfg.MaxEventStreamsPerConnection == 0 {
		cfg.MaxEventStreamsPerConnection = DefaultMaxEventStreamsPerConnection
	}
	return &EventService{source: cfg.Source, metrics: cfg.Metrics, now: time.Now, sending: cfg.Sending, shutdown: make(chan struct{}),
		streams: streamLimiter{max: cfg.MaxEventStreams, perConn: cfg.MaxEventStreamsPerConnection}}, nil
}

// Shutdown ends every open stream (with codes.Unavailable) and makes new ones fail, so that a graceful
// stop of the server does not wait for them.
func (s *EventService) Shutdown() {
	s.shutdownOnce.Do(func() { close(s.shutdown) })
}

// Serve answers a GetContainerEvents call from the event source: one subscription per stream, every event
// sent, until the subscription ends (its error is the stream's status), the client goes away or the
// service shuts down.
//
// One goroutine, the pump, calls the subscription's Next; this one sends what it hands over, and
// watches the client and the service's shutdown. No shutdown ever ends a Next: a Next ended early can
// lose what its subscription had queued (a Relay's stream from the core ends, and the new one starts from
// now), and a Next that waits on a source that is gone (a Relay whose core does not come back) must
// not keep the stream, and the server's stop, waiting.
func (s *EventService) Serve(ss grpc.ServerStream) (err error) {
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	logger := log.G(ctx).WithField("method", GetContainerEventsMethod)

	var req runtimeapi.GetEventsRequest
	if err := ss.RecvMsg(&req); err != nil {
		return err
	}
	select {
	case <-s.shutdown:
		return errShuttingDown
	default:
	}
	conn := connID(ctx)
	release, limit, err := s.streams.acquire(conn)
	if err != nil {
		if m, ok := s.metrics.(StreamLimitMetrics); ok {
			m.EventStreamRefused(limit)
		}
		logger.WithField("connection", conn).WithField("limit", limit).WithError(err).Warn("event stream refused")
		return err
	}

	stream := s.source.Subscribe()
	s.metrics.EventStreamOpened()
	logger.Info("event stream opened")
	pumped := make(chan pumpedEvent)
	pumpDone := make(chan struct{})
	// leftover is the event the pump took and could not hand over before ctx ended (set before
	// pumpDone is closed).
	var leftover []byte
	go func() {
		defer close(pumpDone)
		leftover = pump(ctx, stream, pumped)
	}()
	defer func() {
		// The pump's Next ends with ctx and with Close.
		cancel()
		stream.Close()
		<-pumpDone
		code := status.Code(err)
		s.metrics.EventStreamClosed(code)
		entry := logger.WithField("code", code)
		if code == codes.Canceled || code == codes.OK {
			entry.Info("event stream closed by the client")
		} else {
			entry.WithError(err).Warn("event stream ended")
		}
	}()
	// Before the subscription is closed (deferred above, so run after this): a client that saw its
	// stream end finds its place free.
	defer release()

	var f grpcraw.Frame
	send := func(b []byte) error {
		if s.sending != nil {
			// Before the send: a read the event causes must find the object tracked.
			s.sending(b)
		}
		f.Data = b
		return ss.SendMsg(&f)
	}
	for {
		select {
		case ev := <-pumped:
			if ev.err != nil {
				return s.eventStreamError(ss.Context(), ev.err)
			}
			if err := send(ev.b); err != nil {
				return err
			}
			if !ev.sourceTime.IsZero() {
				s.metrics.EventSent(s.now().Sub(ev.sourceTime))
			} else {
				s.metrics.EventSent(0)
			}
		case <-s.shutdown:
			// The subscription counts what the pump took as received (the core's checkpoint records
			// it): the client gets it before the stream ends.
			cancel()
			<-pumpDone
			if leftover != nil {
				if err := send(leftover); err != nil {
					return err
				}
			}
			return errShuttingDown
		case <-ctx.Done():
			return s.eventStreamError(ss.Context(), ctx.Err())
		}
	}
}

// pumpedEvent is what the pump hands over: an event, encoded, or the error that ended the subscription.
type pumpedEvent struct {
	b          []byte
	sourceTime time.Time
	err        error
}

// pump hands the events of stream to out, one at a time, until Next fails (the error is handed over
// too) or ctx ends. It returns the event it took from stream and could not hand over, if any.
func pump(ctx context.Context, stream EventStream, out chan<- pumpedEvent) (leftover []byte) {
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
	for {
		b, sourceTime, err := next(ctx)
		select {
		case out <- pumpedEvent{b: b, sourceTime: sourceTime, err: err}:
		case <-ctx.Done():
			if err == nil {
				return b
			}
			return nil
		}
		if err != nil {
			return nil
		}
	}
}

// eventStreamError turns the error that ended an event stream into the status the client gets: a gRPC
// status error as it is, the client's own cancellation as Canceled, the service's shutdown as Unavailable.
func (s *EventService) eventStreamError(clientCtx context.Context, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		if clientCtx.Err() != nil {
			return status.FromContextError(clientCtx.Err()).Err()
		}
		select {
		case <-s.shutdown:
			return errShuttingDown
		default:
		}
	}
	// An errdefs error (e.g. errdefs.ErrResourceExhausted) gets its gRPC code; anything else is Unknown.
	return errgrpc.ToGRPC(fmt.Errorf("event stream ended: %w", err))
}

package corelink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/containerd/log"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/grpcraw"
	"github.com/pleg-nri/pleg-nri/internal/retry"
)

// Relay is the front's side of the core link: a kubelet.EventSource whose events come from the core's
// socket (Core's GetContainerEvents), and the client of the core's own methods (RefreshStopped,
// ReadState). Each subscription is one upstream stream; when the upstream goes away (the core restarts:
// the stream ends with UNAVAILABLE or the connection breaks) the subscription subscribes again, with
// backoff, and its own client notices nothing. Only an end that says events were lost (the upstream
// evicted the subscriber as too slow: RESOURCE_EXHAUSTED) ends the client's stream, with that status,
// so that the client relists. So does an upstream that does not come back (RelayConfig.CoreGrace): the
// client's stream ends with UNAVAILABLE rather than stay open and silent.
//
// A gapless stream across an upstream restart is the upstream's part: pleg-nri's core replays every
// event since its start to a subscriber that comes within its startup-replay, and its checkpoint says
// which events the old core's subscribers had received (see docs/restarts.md).
type Relay struct {
	conn *grpc.ClientConn
	// gate, when set, holds each event until the runtime serves.
	gate *RuntimeGate
	// retryMin and retryMax bound the delay between two subscriptions that ended without an event.
	retryMin, retryMax time.Duration
	// resubscribed counts the upstream subscriptions made again after one ended.
	resubscribed func()
	// coreGrace and coreGone: RelayConfig's CoreGrace and CoreGone.
	coreGrace time.Duration
	coreGone  func()
}

// RelayConfig is everything a Relay is built from. As every component of pleg-nri, the relay takes one
// Config struct and no functional options.
type RelayConfig struct {
	// Endpoint is the core's socket (see dial.CRI; any endpoint that serves GetContainerEvents).
	// Required.
	Endpoint string
	// Gate, when set, holds each event before it is sent on until the runtime serves calls (at most
	// RuntimeCatchUp), and no longer than the context of the Next that returns it lives: the front's,
	// so that the kubelet's reaction to an event is not a call that fails.
	Gate *RuntimeGate
	// Resubscribed, when set, is called each time a subscription subscribes again after its upstream
	// stream ended (for a metric or a test).
	Resubscribed func()
	// CoreGrace, when positive, ends a subscription that has had no upstream stream for that long, with
	// UNAVAILABLE and a message that says to relist: the core is gone and nothing restarts it (a
	// pre-registered core killed: containerd does not launch it again), and a client on an open,
	// silent stream learns of nothing (a kubelet 1.35/1.36 with EventedPLEG relists every 300 s). The
	// grace runs from when the subscription lost its last upstream stream that counted (one that
	// delivered an event or stayed open relayStreamCounts), or from the subscription itself; a stream
	// that opens and ends at once without an event (a core crash-looping) does not reset it, and while
	// a stream is open it does not run. Zero disables it: the subscription waits for ever.
	CoreGrace time.Duration
	// CoreGone, when set, is called each time a subscription ends because of CoreGrace.
	CoreGone func()
}

// Relay's resubscription delays, and its connection's reconnection backoff: the core restarts in
// well under a second, and a unix socket dial costs microseconds.
const (
	relayRetryMin    = 20 * time.Millisecond
	relayRetryMax    = 500 * time.Millisecond
	relayConnBackoff = 200 * time.Millisecond
	// relayStreamWindow is gRPC's smallest stream window (64 KiB); relayConnWindow, shared by every
	// stream of the connection, leaves room for many.
	relayStreamWindow = 64 << 10
	relayConnWindow   = 16 << 20
	// relayStreamCounts is how long an upstream stream that delivers no event must stay open to count
	// as the upstream being back (RelayConfig.CoreGrace): a core that crashes at its start ends its
	// streams sooner.
	relayStreamCounts = time.Second
)

// DefaultCoreGrace is the daemon's core-grace (RelayConfig.CoreGrace): many times a core's restart
// (the front subscribes again within about half a second of a new core's socket), well under the
// 30 s pleg-nri promises as the longest a subscriber may sit on a silent stream.
const DefaultCoreGrace = 20 * time.Second

// DialRelay returns a Relay whose upstream is cfg.Endpoint. Close it when done.
func DialRelay(cfg RelayConfig) (*Relay, error) {
	conn, err := dial.CRI(cfg.Endpoint,
		// A fixed, small stream window (no BDP growth): a client that stops reading holds back the
		// relay's upstream stream after at most this much more than it would hold on the core itself,
		// so that the core's queue fills and the core evicts it as before (RESOURCE_EXHAUSTED, passed
		// on), rather than events piling up in the relay's buffers.
		grpc.WithInitialWindowSize(relayStreamWindow),
		grpc.WithInitialConnWindowSize(relayConnWindow),
		// Faster reconnection than dial.CRI's (a later option wins).
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: relayRetryMin, Multiplier: 1.6, Jitter: 0.2, MaxDelay: relayConnBackoff},
			MinConnectTimeout: 5 * time.Second,
		}))
	if err != nil {
		return nil, fmt.Errorf("event relay: %w", err)
	}
	return &Relay{conn: conn, gate: cfg.Gate, resubscribed: cfg.Resubscribed, retryMin: relayRetryMin, retryMax: relayRetryMax,
		coreGrace: cfg.CoreGrace, coreGone: cfg.CoreGone}, nil
}

// Close closes the upstream connection; open subscriptions end.
func (r *Relay) Close() error { return r.conn.Close() }

// Subscribe returns a subscription; its first upstream stream is opened by the first Next.
func (r *Relay) Subscribe() kubelet.EventStream {
	ctx, cancel := context.WithCancel(context.Background())
	return &relayStream{r: r, ctx: ctx, cancel: cancel, lostAt: time.Now(),
		retry: retry.Doubling(r.retryMin, r.retryMax)}
}

// relayStream is one client's subscription: one upstream stream at a time, made again when it ends.
type relayStream struct {
	r *Relay
	// ctx lives as long as the subscription; upstream streams are made on it.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards up and retry. Next is called by one goroutine at a time; Close may race with it.
	mu sync.Mutex
	// up is the current upstream stream (nil: none yet, or the last one ended).
	up grpc.ClientStream
	// upCancel ends up.
	upCancel context.CancelFunc
	// retry is the delay before the next subscription: it grows while the upstream streams end without
	// an event, and starts over after one.
	retry *backoff.ExponentialBackOff
	// subscribed is set once the first upstream stream has been opened.
	subscribed bool

	// Owned by the goroutine in Next (Close does not touch them):
	// lostAt is when the subscription lost its last upstream stream that counted (see
	// RelayConfig.CoreGrace), or when it was made: the grace runs from it while no stream is open.
	lostAt time.Time
	// openedAt is when up was opened; delivered says whether it has delivered an event.
	openedAt  time.Time
	delivered bool
}

var _ kubelet.EncodedEventStream = (*relayStream)(nil)

// getEventsRequest is GetContainerEvents' request, encoded: an empty GetEventsRequest.
var getEventsRequest = &grpcraw.Frame{}

// Next returns the next event, decoded.
func (s *relayStream) Next(ctx context.Context) (*runtimeapi.ContainerEventResponse, time.Time, error) {
	b, t, err := s.NextEncoded(ctx)
	if err != nil {
		return nil, t, err
	}
	var ev runtimeapi.ContainerEventResponse
	if err := proto.Unmarshal(b, &ev); err != nil {
		return nil, t, status.Errorf(codes.Internal, "failed to decode relayed event: %v", err)
	}
	return &ev, t, nil
}

// NextEncoded returns the next event as the upstream encoded it. It subscribes again, with backoff,
// whenever the upstream stream ends for any reason but an eviction; it returns only with an event, ctx's
// error, the eviction's status, or UNAVAILABLE when the grace runs out (checkGrace).
func (s *relayStream) NextEncoded(ctx context.Context) ([]byte, time.Time, error) {
	stop := context.AfterFunc(ctx, s.abortUpstream)
	defer stop()
	for {
		if err := ctx.Err(); err != nil {
			return nil, time.Time{}, err
		}
		up, err := s.upstream(ctx)
		if err != nil {
			return nil, time.Time{}, err
		}
		var f grpcraw.Frame
		err = up.RecvMsg(&f)
		if err == nil {
			b := f.Keep()
			s.delivered = true
			s.mu.Lock()
			s.retry.Reset()
			s.mu.Unlock()
			if s.r.gate != nil {
				s.r.gate.Wait(ctx, RuntimeCatchUp)
			}
			return b, time.Time{}, nil
		}
		if now := time.Now(); s.delivered || now.Sub(s.openedAt) >= relayStreamCounts {
			s.lostAt = now
		}
		s.dropUpstream()
		if ctx.Err() != nil {
			return nil, time.Time{}, ctx.Err()
		}
		if status.Code(err) == codes.ResourceExhausted {
			// The upstream evicted this subscriber: events were lost, and only the client can repair
			// that (it relists). Say so rather than hide it behind a new subscription.
			return nil, time.Time{}, err
		}
		if err := s.checkGrace(ctx); err != nil {
			return nil, time.Time{}, err
		}
		if errors.Is(err, io.EOF) {
			err = errors.New("upstream ended the stream")
		}
		log.G(ctx).WithError(err).Info("event relay: upstream stream ended, subscribing again")
		if err := s.backoff(ctx); err != nil {
			return nil, time.Time{}, err
		}
	}
}

// upstream returns the current upstream stream, opening one if there is none. Opening waits for the
// connection (WaitForReady): while the upstream is down it blocks, and gRPC redials with backoff, until
// ctx ends, the subscription is closed or its grace runs out (checkGrace).
func (s *relayStream) upstream(ctx context.Context) (grpc.ClientStream, error) {
	s.mu.Lock()
	if s.up != nil {
		up := s.up
		s.mu.Unlock()
		return up, nil
	}
	again := s.subscribed
	s.subscribed = true
	s.mu.Unlock()
	if again && s.r.resubscribed != nil {
		s.r.resubscribed()
	}
	for {
		if err := s.checkGrace(ctx); err != nil {
			return nil, err
		}
		// The stream lives as long as the subscription; opening it, which waits for an upstream that
		// may never come back, also ends with ctx and with the grace.
		upCtx, upCancel := context.WithCancel(s.ctx)
		stopOpen := context.AfterFunc(ctx, upCancel)
		var graceOver *time.Timer
		if left, ok := s.graceLeft(); ok {
			graceOver = time.AfterFunc(left, upCancel)
		}
		up, err := s.r.conn.NewStream(upCtx, &grpc.StreamDesc{ServerStreams: true}, kubelet.GetContainerEventsMethod,
			grpc.ForceCodecV2(grpcraw.Codec{}), grpc.WaitForReady(true))
		if !stopOpen() && err == nil {
			err = ctx.Err()
		}
		if graceOver != nil && !graceOver.Stop() && err == nil {
			// The grace ran out as the stream opened, and ended it.
			err = upCtx.Err()
		}
		if err == nil {
			if err = up.SendMsg(getEventsRequest); err == nil {
				err = up.CloseSend()
			}
		}
		if err == nil {
			s.openedAt, s.delivered = time.Now(), false
			s.mu.Lock()
			s.up, s.upCancel = up, upCancel
			s.mu.Unlock()
			return up, nil
		}
		upCancel()
		if ctx.Err() != nil || s.ctx.Err() != nil {
			return nil, errors.Join(ctx.Err(), s.ctx.Err())
		}
		if err := s.checkGrace(ctx); err != nil {
			return nil, err
		}
		log.G(ctx).WithError(err).Debug("event relay: cannot subscribe upstream yet")
		if err := s.backoff(ctx); err != nil {
			return nil, err
		}
	}
}

// backoff waits before the next subscription: retryMin doubling to retryMax while subscriptions end
// without an event (a fresh upstream that ends at once must not make this spin), or until the grace
// runs out (checkGrace).
func (s *relayStream) backoff(ctx context.Context) error {
	s.mu.Lock()
	d := s.retry.NextBackOff()
	s.mu.Unlock()
	if left, ok := s.graceLeft(); ok && left < d {
		d = left
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return s.checkGrace(ctx)
	case <-ctx.Done():
		return ctx.Err()
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

// graceLeft returns how much of the subscription's grace is left (see RelayConfig.CoreGrace; zero or
// less: it has run out), and false when the relay has no grace.
func (s *relayStream) graceLeft() (time.Duration, bool) {
	if s.r.coreGrace <= 0 {
		return 0, false
	}
	return time.Until(s.lostAt.Add(s.r.coreGrace)), true
}

// checkGrace returns nil while the subscription's grace lasts. Once it has run out it logs and counts
// the end of the client's stream, and returns the status the stream ends with.
func (s *relayStream) checkGrace(ctx context.Context) error {
	if left, ok := s.graceLeft(); !ok || left > 0 {
		return nil
	}
	log.G(ctx).WithField("core-grace", s.r.coreGrace).WithField("since", time.Since(s.lostAt).Round(time.Millisecond)).
		Warn("event relay: the core has not come back within core-grace: ending the client's event stream with UNAVAILABLE, so that it relists")
	if s.r.coreGone != nil {
		s.r.coreGone()
	}
	return status.Errorf(codes.Unavailable, "pleg-nri's core has not come back within %s: relist", s.r.coreGrace)
}

// dropUpstream ends the current upstream stream.
func (s *relayStream) dropUpstream() {
	s.mu.Lock()
	if s.upCancel != nil {
		s.upCancel()
	}
	s.up, s.upCancel = nil, nil
	s.mu.Unlock()
}

// abortUpstream ends the upstream stream because the caller of Next gave up: the RecvMsg blocked in it
// returns. What the upstream had queued for it is lost; the next call subscribes again (the proxy gives
// up on a Next only when its client's stream ends).
func (s *relayStream) abortUpstream() { s.dropUpstream() }

// Close ends the subscription and its upstream stream.
func (s *relayStream) Close() {
	s.cancel()
	s.dropUpstream()
}

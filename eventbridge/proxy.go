package eventbridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// GetContainerEventsMethod is the one CRI method the proxy answers itself.
const GetContainerEventsMethod = "/runtime.v1.RuntimeService/GetContainerEvents"

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

// Metrics is told about the proxy's work. Implementations must be safe for concurrent use and fast.
type Metrics interface {
	// ForwardedCall is called when a forwarded call ends, with the full method name, the code the
	// client got and how long the call took (for a stream: its whole life).
	ForwardedCall(method string, code codes.Code, d time.Duration)
	// EventStreamOpened and EventStreamClosed count the open GetContainerEvents streams; closed gets
	// the code the stream ended with.
	EventStreamOpened()
	EventStreamClosed(code codes.Code)
	// EventSent is called for each event sent, with the time from its source to the send.
	EventSent(latency time.Duration)
	// UpstreamConnectionState is called when the connection to the runtime goes up or down.
	UpstreamConnectionState(up bool)
}

// NopMetrics is a Metrics that does nothing.
type NopMetrics struct{}

var (
	_ Metrics            = NopMetrics{}
	_ grpc.StreamHandler = (*Proxy)(nil).Handle
)

// ForwardedCall does nothing.
func (NopMetrics) ForwardedCall(string, codes.Code, time.Duration) {}

// EventStreamOpened does nothing.
func (NopMetrics) EventStreamOpened() {}

// EventStreamClosed does nothing.
func (NopMetrics) EventStreamClosed(codes.Code) {}

// EventSent does nothing.
func (NopMetrics) EventSent(time.Duration) {}

// UpstreamConnectionState does nothing.
func (NopMetrics) UpstreamConnectionState(bool) {}

// Proxy is the CRI endpoint's gRPC handler. It registers no service: every method, unary or streaming,
// known to this build or not, goes to one handler that forwards it byte for byte to the runtime, except
// GetContainerEvents, which is answered from the EventSource.
type Proxy struct {
	backend *grpc.ClientConn
	// events answers GetContainerEvents; nil forwards it to the runtime like any other method.
	events  EventSource
	metrics Metrics
	// now is the clock of the latency and duration metrics.
	now func() time.Time
	// fresh, when set, tracks the objects the served events reported stopped, for freshMode (see
	// ProxyConfig.ReadFreshness); freshWait bounds a held read.
	fresh     *stoppedTracker
	freshMode ReadFreshness
	freshWait time.Duration
	// refresh, in the hold mode, watches the objects whose held reads gave up and sends the refresh
	// events (see refresh.go).
	refresh *refresher

	// shutdown is closed by Shutdown: open event streams end with codes.Unavailable.
	shutdown     chan struct{}
	shutdownOnce sync.Once
}

// ProxyConfig is everything a Proxy is built from. As every component of pleg-nri, the proxy takes one
// Config struct and no functional options.
type ProxyConfig struct {
	// Backend is the runtime's connection (see DialCRI). Required.
	Backend *grpc.ClientConn
	// Events answers GetContainerEvents; nil forwards it to the runtime like any other method.
	Events EventSource
	// Metrics is told about the proxy's work; nil is NopMetrics. It may also implement
	// FreshnessMetrics and RefreshMetrics.
	Metrics Metrics
	// ReadFreshness makes the status reads (ContainerStatus, PodSandboxStatus, ListContainers,
	// ListPodSandbox) consistent with the events this proxy sent; "" is DefaultReadFreshness. While the
	// proxy has sent a STOPPED for an object whose status the runtime's answer still shows running,
	// ReadFreshnessOverlay answers with the stopped status that was sent, and ReadFreshnessHold asks the
	// runtime again (2 ms, 4 ms, ... 50 ms apart) until its answer shows the stop or FreshnessWait has
	// passed, and then gives the client the runtime's answer byte for byte. ReadFreshnessOff forwards
	// status reads like any other call. Only the events served by the proxy itself count.
	ReadFreshness ReadFreshness
	// FreshnessWait bounds a held read; default DefaultFreshnessWait.
	FreshnessWait time.Duration
}

// FreshnessMetrics is implemented by a Metrics that wants to know about the status reads that showed
// running an object the event stream had already reported stopped (see ProxyConfig.ReadFreshness).
type FreshnessMetrics interface {
	// StaleRead is called, in the hold mode, when the runtime's answer to a status read was older than
	// the event stream: how long the proxy held the read, and whether the runtime caught up within the
	// bound (when it did not, the client got the runtime's last answer).
	StaleRead(method string, held time.Duration, caughtUp bool)
	// OverlaidRead is called, in the overlay mode, when the proxy answered a status read with the stopped
	// status the event stream had sent instead of the runtime's older one.
	OverlaidRead(method string)
}

// DefaultFreshnessWait bounds how long a held status read waits for the runtime to catch up.
const DefaultFreshnessWait = 5 * time.Second

// The retry delays of a status read the runtime answered with an older state than the event stream's.
const (
	freshRetryMin = 2 * time.Millisecond
	freshRetryMax = 50 * time.Millisecond
)

// NewProxy returns a Proxy that forwards to cfg.Backend and answers GetContainerEvents from cfg.Events. A
// ReadFreshness that ParseReadFreshness refuses is an error.
func NewProxy(cfg ProxyConfig) (*Proxy, error) {
	mode, err := ParseReadFreshness(string(cfg.ReadFreshness))
	if err != nil {
		return nil, err
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NopMetrics{}
	}
	p := &Proxy{
		backend:   cfg.Backend,
		events:    cfg.Events,
		metrics:   cfg.Metrics,
		now:       time.Now,
		freshMode: mode,
		freshWait: cfg.FreshnessWait,
		shutdown:  make(chan struct{}),
	}
	if p.freshWait <= 0 {
		p.freshWait = DefaultFreshnessWait
	}
	now := func() time.Time { return p.now() }
	switch mode {
	case ReadFreshnessOverlay:
		p.fresh = newStoppedTracker(now, overlayTTL)
	case ReadFreshnessHold:
		p.fresh = newStoppedTracker(now, stoppedTTL)
	}
	if p.freshMode == ReadFreshnessHold && p.events != nil {
		var sent func(bool)
		if m, ok := p.metrics.(RefreshMetrics); ok {
			sent = m.RefreshSent
		}
		p.refresh = newRefresher(runtimeapi.NewRuntimeServiceClient(p.backend), now, p.shutdown, sent)
	}
	return p, nil
}

// ServerOptions returns the options that make a grpc.Server the proxy: the pass-through codec, the
// unknown-service handler and the kubelet's message size limits. Register no service on that server.
func (p *Proxy) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(rawCodec{}),
		grpc.UnknownServiceHandler(p.Handle),
		grpc.MaxRecvMsgSize(MaxMsgSize),
		grpc.MaxSendMsgSize(MaxMsgSize),
		// Handle calls on a pool of goroutines whose stacks have already grown, rather than a new
		// goroutine per call (gRPC starts one anyway when every worker is busy, e.g. with long streams).
		grpc.NumStreamWorkers(uint32(max(4, runtime.GOMAXPROCS(0)))),
	}
}

// Shutdown ends every open GetContainerEvents stream (with codes.Unavailable) and makes new ones fail, so
// that a graceful stop of the server does not wait for them. Forwarded calls are not affected.
func (p *Proxy) Shutdown() {
	p.shutdownOnce.Do(func() { close(p.shutdown) })
}

// Handle is the grpc.StreamHandler of every method.
func (p *Proxy) Handle(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "no method in stream")
	}
	if method == GetContainerEventsMethod && p.events != nil {
		return p.serveEvents(ss)
	}
	start := p.now()
	var err error
	if isUnary(method) {
		var fix *readFix
		if p.fresh != nil && p.fresh.any() {
			fix = readFixes[method]
		}
		err = p.forwardUnary(ss, method, fix)
	} else {
		err = p.forward(ss, method)
	}
	p.metrics.ForwardedCall(method, status.Code(err), p.now().Sub(start))
	return err
}

// unaryMethods caches, per full method name found in the protobuf registry (the CRI's descriptors are
// linked in), whether the method is unary. Names not in the registry are not cached, so that a client
// inventing method names cannot grow it; they are forwarded as streams.
var unaryMethods sync.Map // string -> bool

// isUnary tells whether method ("/package.Service/Method") is a known unary method.
func isUnary(method string) bool {
	if v, ok := unaryMethods.Load(method); ok {
		return v.(bool)
	}
	name := strings.TrimPrefix(method, "/")
	i := strings.LastIndexByte(name, '/')
	if name == method || i <= 0 {
		return false
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name[:i] + "." + name[i+1:]))
	md, ok := d.(protoreflect.MethodDescriptor)
	if err != nil || !ok {
		return false
	}
	unary := !md.IsStreamingClient() && !md.IsStreamingServer()
	unaryMethods.Store(method, unary)
	return unary
}

// forwardUnary proxies a call of a known unary method: one request, one answer, with gRPC's unary client
// path (no goroutine). On the wire it is the same as forward. With a fix (a status read while the event
// stream is ahead of the runtime, see ProxyConfig.ReadFreshness), the overlay mode rewrites an answer that shows
// running what the stream reported stopped, and the hold mode asks the runtime again while the answer is
// older than the stream, within p.freshWait, and sends the last answer as the runtime sent it.
func (p *Proxy) forwardUnary(ss grpc.ServerStream, method string, fix *readFix) error {
	var req frame
	defer req.free()
	if err := ss.RecvMsg(&req); err != nil {
		return err
	}
	if fix != nil {
		// The request may be sent more than once, or read: keep its bytes (a sent buffer goes to gRPC).
		b := req.bytes()
		req.free()
		req.data = b
	}
	ctx := ss.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	ctx = metadata.NewOutgoingContext(ctx, forwardableMD(md))
	start := p.now()
	delay := freshRetryMin
	held := false
	var resp frame
	defer resp.free()
	for {
		var hdr, trl metadata.MD
		err := p.backend.Invoke(ctx, method, &req, &resp, grpc.ForceCodecV2(rawCodec{}), grpc.Header(&hdr), grpc.Trailer(&trl))
		var answer []byte
		if err == nil && fix != nil {
			if answer = resp.bytes(); !p.fresh.mentioned(answer) {
				answer = nil // nothing in it is ahead of the runtime
			}
		}
		if answer != nil && p.freshMode == ReadFreshnessOverlay {
			if b := fix.overlay(p.fresh, req.data, answer); b != nil {
				resp.free()
				resp.data = b
				if m, ok := p.metrics.(FreshnessMetrics); ok {
					m.OverlaidRead(method)
				}
			}
		} else if stale := staleIDs(fix, p.fresh, answer); len(stale) > 0 {
			if p.now().Add(delay).Sub(start) < p.freshWait {
				held = true
				resp.free()
				select {
				case <-time.After(delay):
				case <-ctx.Done():
					return status.FromContextError(ctx.Err()).Err()
				}
				delay = min(2*delay, freshRetryMax)
				continue
			}
			p.staleRead(method, start, false)
			log.G(ctx).WithField("method", method).WithField("waited", p.now().Sub(start)).
				Warn("the runtime's status still shows running what the event stream reported stopped: answered as it is")
			if p.refresh != nil {
				for _, id := range stale {
					if sb := p.fresh.sandboxOf(id); sb != "" {
						p.refresh.watch(context.WithoutCancel(ctx), id, sb)
					}
				}
			}
		} else if held {
			p.staleRead(method, start, err == nil)
		}
		if len(hdr) > 0 {
			if herr := ss.SetHeader(forwardableMD(hdr)); herr != nil {
				return herr
			}
		}
		ss.SetTrailer(forwardableMD(trl))
		if err != nil {
			return err
		}
		return ss.SendMsg(&resp)
	}
}

// staleIDs returns, in the hold mode, the objects an answer (nil: none to look at) shows running that the
// stream reported stopped.
func staleIDs(fix *readFix, t *stoppedTracker, answer []byte) []string {
	if answer == nil {
		return nil
	}
	return fix.stale(t, answer)
}

// staleRead reports a status read the runtime first answered with an older state than the event stream.
func (p *Proxy) staleRead(method string, start time.Time, caughtUp bool) {
	if m, ok := p.metrics.(FreshnessMetrics); ok {
		m.StaleRead(method, p.now().Sub(start), caughtUp)
	}
}

// streamDesc describes every forwarded call: a bidirectional stream is the general form of all four
// kinds of gRPC method, and on the wire it is the same.
var streamDesc = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// forward proxies one call to the backend. The backend's status error is returned unchanged, so the
// client gets its code, message and details.
func (p *Proxy) forward(ss grpc.ServerStream, method string) error {
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	md, _ := metadata.FromIncomingContext(ctx)
	ctx = metadata.NewOutgoingContext(ctx, forwardableMD(md))

	cs, err := p.backend.NewStream(ctx, streamDesc, method, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return err
	}

	// Client -> backend, in its own goroutine. It ends with the client's half-close (or the end of the
	// call: ctx is canceled when this handler returns).
	go func() {
		for {
			var f frame
			if err := ss.RecvMsg(&f); err != nil {
				if errors.Is(err, io.EOF) {
					_ = cs.CloseSend()
				}
				return
			}
			err := cs.SendMsg(&f)
			f.free()
			if err != nil {
				// The backend ended the call; RecvMsg below returns its status.
				return
			}
		}
	}()

	// Backend -> client. Headers go as soon as the backend sends them (a trailers-only answer has none).
	if hdr, err := cs.Header(); err == nil && len(hdr) > 0 {
		if err := ss.SendHeader(forwardableMD(hdr)); err != nil {
			return err
		}
	}
	for {
		var f frame
		if err := cs.RecvMsg(&f); err != nil {
			ss.SetTrailer(forwardableMD(cs.Trailer()))
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		err := ss.SendMsg(&f)
		f.free()
		if err != nil {
			return err
		}
	}
}

// forwardableMD returns a copy of md without the keys gRPC itself sets on the next hop (pseudo-headers,
// content type, user agent, encodings, timeout); the deadline is carried by the context.
func forwardableMD(md metadata.MD) metadata.MD {
	out := make(metadata.MD, len(md))
	for k, v := range md {
		if strings.HasPrefix(k, ":") {
			continue
		}
		switch k {
		case "content-type", "user-agent", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding",
			"grpc-message", "grpc-status", "grpc-status-details-bin":
			continue
		}
		out[k] = append([]string(nil), v...)
	}
	return out
}

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
		return status.Error(codes.Unavailable, "pleg-nri is shutting down")
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
			return status.Error(codes.Unavailable, "pleg-nri is shutting down")
		default:
		}
	}
	// An errdefs error (e.g. errdefs.ErrResourceExhausted) gets its gRPC code; anything else is Unknown.
	return errgrpc.ToGRPC(fmt.Errorf("event stream ended: %w", err))
}

// WatchUpstream reports the state of the connection to the runtime to the metrics until ctx is done: up
// when it is READY, down when it is in TRANSIENT_FAILURE (other states change nothing). It asks the
// connection to connect, so that the state is known before the first forwarded call.
func (p *Proxy) WatchUpstream(ctx context.Context) {
	p.backend.Connect()
	var up *bool
	for {
		st := p.backend.GetState()
		var now *bool
		switch st {
		case connectivity.Ready:
			now = new(true)
		case connectivity.TransientFailure:
			now = new(false)
		case connectivity.Shutdown:
			return
		case connectivity.Idle:
			// The connection went idle (no calls for a while, or the runtime closed it): reconnect,
			// so that a runtime that went away shows as down.
			p.backend.Connect()
		}
		if now != nil && (up == nil || *up != *now) {
			up = now
			log.G(ctx).WithField("up", *now).Info("runtime connection state changed")
			p.metrics.UpstreamConnectionState(*now)
		}
		if !p.backend.WaitForStateChange(ctx, st) {
			return
		}
	}
}

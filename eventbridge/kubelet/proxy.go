package kubelet

import (
	"github.com/pleg-nri/pleg-nri/internal/grpcraw"

	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/containerd/log"

	"github.com/pleg-nri/pleg-nri/internal/dial"
)

// GetContainerEventsMethod is the one CRI method the proxy answers itself.
const GetContainerEventsMethod = "/runtime.v1.RuntimeService/GetContainerEvents"

var _ grpc.StreamHandler = (*Proxy)(nil).Handle

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
	// ProxyConfig.ReadFreshness, and freshread.go for the reads); freshWait bounds a held read.
	fresh     *stoppedTracker
	freshMode ReadFreshness
	freshWait time.Duration
	// refresh, in the hold mode, watches the objects whose held reads gave up and asks for their
	// refresh (see refresh.go).
	refresh *refresher
	// settle, on the front, asks the core for a refresh after each stop its client made (see
	// afterstop.go); refreshStopped, on the core, answers those requests.
	settle         *stopRefresher
	refreshStopped func(id string)
	// reads, unless nil (ReadSourceRuntime), answers the reads from the state or checks them
	// (stateread.go, readcheck.go); serveState answers StateMethodPrefix (the core's socket).
	reads      *reads
	serveState EncodedStateReader

	// streams caps the open GetContainerEvents streams (streamlimit.go); creds numbers the connections
	// for it.
	streams streamLimiter
	creds   connCredentials

	// shutdown is closed by Shutdown: open event streams end with codes.Unavailable.
	shutdown     chan struct{}
	shutdownOnce sync.Once
}

// ProxyConfig is everything a Proxy is built from. As every component of pleg-nri, the proxy takes one
// Config struct and no functional options.
type ProxyConfig struct {
	// Backend is the runtime's connection (see dial.CRI). Required.
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
	// Refresh asks the event source to send its STOPPED of an object (container or sandbox id) again,
	// stamped now, to every subscriber: the front's is Relay.RefreshStopped (the core fills it from its
	// state, in order with the pod's other events). The hold mode asks for it once the runtime caught
	// up with a read that gave up (refresh.go), and RefreshAfterStop after a stop; nil: neither does.
	Refresh func(ctx context.Context, id string) error
	// RefreshAfterStop, with Refresh, asks for the refresh after each StopContainer or StopPodSandbox
	// the runtime answered, once the client's calls about that pod have been quiet for a moment, of
	// the object stopped last (the sandbox once it was stopped; see afterstop.go). Best effort: an
	// error is logged at debug level.
	RefreshAfterStop bool
	// RefreshStopped, when set, answers RefreshStoppedMethod (the core's socket): it is handed the id.
	RefreshStopped func(id string)
	// ReadSource says where ListPodSandbox, ListContainers, PodSandboxStatus and ContainerStatus are
	// answered; "" is DefaultReadSource. ReadSourceState answers them from State when it says it is
	// current for what is asked, and no mutating call forwarded by this proxy that may change the
	// answer is in flight; otherwise they are forwarded (with ReadFreshness). ReadSourceCheck forwards
	// them, and compares each answer with State's where State is current and nothing changed while it
	// asked (StateReadMetrics counts every read and every difference; the first differences are
	// logged). ReadSourceRuntime forwards them as any call.
	ReadSource ReadSource
	// State answers the reads for ReadSourceState and ReadSourceCheck: on the front, its Relay (the
	// core's state); required by those modes.
	State EncodedStateReader
	// ServeState, when set, answers StateMethodPrefix (the core's socket): EncodeStateReader of the
	// core's state.
	ServeState EncodedStateReader
	// MaxEventStreams bounds the GetContainerEvents streams open at once; a stream beyond it ends at
	// once with RESOURCE_EXHAUSTED (streamlimit.go). Default DefaultMaxEventStreams; negative: no
	// bound.
	MaxEventStreams int
	// MaxEventStreamsPerConnection bounds them per client connection, likewise; default
	// DefaultMaxEventStreamsPerConnection; negative: no bound. Connections are told apart only on a
	// server made with ServerOptions (NewServer): elsewhere only MaxEventStreams holds.
	MaxEventStreamsPerConnection int
}

// NewProxy returns a Proxy that forwards to cfg.Backend and answers GetContainerEvents from cfg.Events. A
// ReadFreshness that ParseReadFreshness refuses is an error.
func NewProxy(cfg ProxyConfig) (*Proxy, error) {
	mode, err := ParseReadFreshness(string(cfg.ReadFreshness))
	if err != nil {
		return nil, err
	}
	source, err := ParseReadSource(string(cfg.ReadSource))
	if err != nil {
		return nil, err
	}
	if source != ReadSourceRuntime && cfg.State == nil {
		return nil, fmt.Errorf("read source %q needs a state to read", source)
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
	p := &Proxy{
		backend:   cfg.Backend,
		events:    cfg.Events,
		metrics:   cfg.Metrics,
		now:       time.Now,
		freshMode: mode,
		freshWait: cfg.FreshnessWait,
		shutdown:  make(chan struct{}),
		streams:   streamLimiter{max: cfg.MaxEventStreams, perConn: cfg.MaxEventStreamsPerConnection},
		creds:     newConnCredentials(),
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
	if cfg.RefreshAfterStop && cfg.Refresh != nil {
		p.settle = newStopRefresher(runtimeapi.NewRuntimeServiceClient(p.backend), cfg.Refresh, now, p.shutdown)
	}
	p.refreshStopped = cfg.RefreshStopped
	p.serveState = cfg.ServeState
	if source != ReadSourceRuntime {
		p.reads = &reads{source: source, state: cfg.State}
	}
	if p.freshMode == ReadFreshnessHold && cfg.Refresh != nil {
		var sent func(bool)
		if m, ok := p.metrics.(RefreshMetrics); ok {
			sent = m.RefreshSent
		}
		p.refresh = newRefresher(runtimeapi.NewRuntimeServiceClient(p.backend), cfg.Refresh, now, p.shutdown, sent)
	}
	return p, nil
}

// ServerOptions returns the options that make a grpc.Server the proxy: the pass-through codec, the
// unknown-service handler, the kubelet's message size limits and transport credentials that number the
// connections (no security, as without: see connCredentials). Register no service on that server, and
// give it no other credentials.
func (p *Proxy) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(p.creds),
		grpc.ForceServerCodecV2(grpcraw.Codec{}),
		grpc.UnknownServiceHandler(p.handleRecovering),
		grpc.MaxRecvMsgSize(dial.MaxMsgSize),
		grpc.MaxSendMsgSize(dial.MaxMsgSize),
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

// handleRecovering is Handle, with a panic in it turned into that call's INTERNAL error: the endpoint
// carries every CRI call of the node, and a bug in one call must not end the process that serves
// them all (a panic in another goroutine still does; the core then starts a new front).
func (p *Proxy) handleRecovering(srv any, ss grpc.ServerStream) (err error) {
	defer func() {
		if r := recover(); r != nil {
			method, _ := grpc.MethodFromServerStream(ss)
			log.G(ss.Context()).WithField("method", method).WithField("panic", r).WithField("stack", string(debug.Stack())).
				Error("CRI endpoint: a call panicked")
			err = status.Errorf(codes.Internal, "pleg-nri: internal error while handling %s (see pleg-nri's log)", method)
		}
	}()
	return p.Handle(srv, ss)
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
	if method == RefreshStoppedMethod && p.refreshStopped != nil {
		return p.serveRefreshStopped(ss)
	}
	if p.serveState != nil && strings.HasPrefix(method, StateMethodPrefix) {
		return p.serveStateMethod(ss, method)
	}
	if p.reads.wants(method) {
		return p.serveRead(ss, method, p.readFixOf(method))
	}
	start := p.now()
	var err error
	if isUnary(method) {
		err = p.forwardUnary(ss, method, p.readFixOf(method))
	} else {
		if p.reads != nil && mutating(method) {
			defer p.reads.muts.begin(method, "")()
		}
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

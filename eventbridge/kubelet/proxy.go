package kubelet

import (
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

	"github.com/containerd/log"

	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/grpcraw"
)

var _ grpc.StreamHandler = (*Proxy)(nil).Handle

// Proxy is the CRI endpoint's gRPC handler. It registers no service: every method, unary or streaming,
// known to this build or not, goes to one handler that forwards it byte for byte to the runtime, except
// GetContainerEvents, which is answered from the EventSource (EventService); what adjusts the answers
// after events (read freshness, the refresh after a stop: package fresh) sits behind one seam, ReadHook.
type Proxy struct {
	backend *grpc.ClientConn
	// events answers GetContainerEvents; nil forwards it to the runtime like any other method.
	events  *EventService
	metrics Metrics
	// now is the clock of the duration metric.
	now func() time.Time
	// hooks see every event sent and the calls they want, in order (hook.go).
	hooks []ReadHook
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
	// Hooks adjust the answers after the events (read freshness and the refresh after a stop: package
	// fresh), in the order a call goes through them.
	Hooks []ReadHook
	// MaxEventStreams and MaxEventStreamsPerConnection bound the GetContainerEvents streams (see
	// EventServiceConfig).
	MaxEventStreams, MaxEventStreamsPerConnection int
}

// NewProxy returns a Proxy that forwards to cfg.Backend and answers GetContainerEvents from cfg.Events.
func NewProxy(cfg ProxyConfig) (*Proxy, error) {
	if cfg.Metrics == nil {
		cfg.Metrics = NopMetrics{}
	}
	p := &Proxy{backend: cfg.Backend, metrics: cfg.Metrics, now: time.Now, hooks: cfg.Hooks}
	if cfg.Events != nil {
		ecfg := EventServiceConfig{Source: cfg.Events, Metrics: cfg.Metrics, MaxEventStreams: cfg.MaxEventStreams,
			MaxEventStreamsPerConnection: cfg.MaxEventStreamsPerConnection}
		if len(p.hooks) > 0 {
			ecfg.Sending = p.sending
		}
		var err error
		if p.events, err = NewEventService(ecfg); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// sending tells the hooks of an event about to be sent.
func (p *Proxy) sending(event []byte) {
	for _, h := range p.hooks {
		h.Sending(event)
	}
}

// ServerOptions returns the options that make a grpc.Server the proxy (see the package function).
func (p *Proxy) ServerOptions() []grpc.ServerOption { return ServerOptions(p.Handle) }

// Shutdown ends every open GetContainerEvents stream (with codes.Unavailable) and makes new ones fail, so
// that a graceful stop of the server does not wait for them. Forwarded calls are not affected.
func (p *Proxy) Shutdown() {
	if p.events != nil {
		p.events.Shutdown()
	}
}

// ServerOptions returns the options that make a grpc.Server serve every method, known or not, with
// handler: the pass-through codec (grpcraw), the kubelet's message size limits, transport credentials
// that number the connections for the caps on event streams (no security, as without: see
// connCredentials), and a panic in a call turned into that call's INTERNAL error. Register no service
// on that server, and give it no other credentials.
func ServerOptions(handler grpc.StreamHandler) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(newConnCredentials()),
		grpc.ForceServerCodecV2(grpcraw.Codec{}),
		grpc.UnknownServiceHandler(recovering(handler)),
		grpc.MaxRecvMsgSize(dial.MaxMsgSize),
		grpc.MaxSendMsgSize(dial.MaxMsgSize),
		// Handle calls on a pool of goroutines whose stacks have already grown, rather than a new
		// goroutine per call (gRPC starts one anyway when every worker is busy, e.g. with long streams).
		grpc.NumStreamWorkers(uint32(max(4, runtime.GOMAXPROCS(0)))),
	}
}

// recovering is handler, with a panic in it turned into that call's INTERNAL error: the endpoint
// carries every CRI call of the node, and a bug in one call must not end the process that serves
// them all (a panic in another goroutine still does; the core then starts a new front).
func recovering(handler grpc.StreamHandler) grpc.StreamHandler {
	return func(srv any, ss grpc.ServerStream) (err error) {
		defer func() {
			if r := recover(); r != nil {
				method, _ := grpc.MethodFromServerStream(ss)
				log.G(ss.Context()).WithField("method", method).WithField("panic", r).WithField("stack", string(debug.Stack())).
					Error("CRI endpoint: a call panicked")
				err = status.Errorf(codes.Internal, "pleg-nri: internal error while handling %s (see pleg-nri's log)", method)
			}
		}()
		return handler(srv, ss)
	}
}

// Handle is the grpc.StreamHandler of every method: the events, or the call forwarded (serveCall).
func (p *Proxy) Handle(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "no method in stream")
	}
	if method == GetContainerEventsMethod && p.events != nil {
		return p.events.Serve(ss)
	}
	start := p.now()
	forwarded, err := p.serveCall(ss, method)
	// A call a hook answered itself was not forwarded.
	if forwarded || err != nil {
		p.metrics.ForwardedCall(method, status.Code(err), p.now().Sub(start))
	}
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

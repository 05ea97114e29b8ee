package kubelet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/containerd/log"
	"google.golang.org/grpc"

	"github.com/pleg-nri/pleg-nri/internal/dial"
)

// HandshakeTimeout bounds the HTTP/2 handshake of a new connection to the CRI endpoint: a client that
// connects and sends nothing (or garbage too slowly) is disconnected after it rather than gRPC's default
// of 2 minutes. A CRI client on the node completes it in well under a millisecond.
const HandshakeTimeout = 5 * time.Second

// Service is what a Server serves: a Proxy (the kubelet's endpoint), or the core's own service (package
// corelink).
type Service interface {
	// ServerOptions makes the server the service (see the package function ServerOptions).
	ServerOptions() []grpc.ServerOption
	// Shutdown ends the service's open event streams and refuses new ones.
	Shutdown()
}

// runtimeWatcher is a Service that reports the state of its connection to the runtime (Proxy).
type runtimeWatcher interface {
	WatchRuntime(ctx context.Context)
}

// Server is a gRPC server of a Service (pleg-nri's CRI endpoint, or the core's socket), on a listener
// opened by Listen.
type Server struct {
	listen  string
	service Service
	grpc    *grpc.Server
	// lis is set by Start.
	lis net.Listener
	// errCh receives the result of Serve, once.
	errCh chan error
	// stopWatch ends the runtime connection's watcher.
	stopWatch context.CancelFunc
	// watchDone is closed when that watcher has returned.
	watchDone chan struct{}
}

// NewServer returns a server of service (a *Proxy: the CRI endpoint) on the listen address (see
// ParseEndpoint). extra server options are added to the service's and to a HandshakeTimeout.
func NewServer(listen string, service Service, extra ...grpc.ServerOption) (*Server, error) {
	if _, _, err := dial.ParseEndpoint(listen); err != nil {
		return nil, err
	}
	if p, ok := service.(*Proxy); service == nil || (ok && p == nil) {
		return nil, errors.New("nil service")
	}
	return &Server{
		listen:  listen,
		service: service,
		grpc:    grpc.NewServer(append(append(service.ServerOptions(), grpc.ConnectionTimeout(HandshakeTimeout)), extra...)...),
		errCh:   make(chan error, 1),
	}, nil
}

// Start listens (see Listen) and serves in a goroutine; a serving error is reported on Err. It also
// starts watching the runtime connection for the metrics (a Proxy's).
func (s *Server) Start(ctx context.Context) error {
	if s.lis != nil {
		return errors.New("server already started")
	}
	l, err := Listen(ctx, s.listen)
	if err != nil {
		return err
	}
	return s.StartOn(ctx, l)
}

// StartOn is Start on a listener already open (one handed over by a previous server, see
// ReceiveListeners); the server closes it when it stops.
func (s *Server) StartOn(ctx context.Context, l net.Listener) error {
	if s.lis != nil {
		return errors.New("server already started")
	}
	s.lis = l
	if w, ok := s.service.(runtimeWatcher); ok {
		watchCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		s.stopWatch = cancel
		s.watchDone = make(chan struct{})
		go func() {
			defer close(s.watchDone)
			w.WatchRuntime(watchCtx)
		}()
	}
	go func() {
		// ErrServerStopped: Stop came before Serve began, which is a stop like any other.
		if err := s.grpc.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.errCh <- fmt.Errorf("CRI endpoint %s: %w", s.listen, err)
			return
		}
		s.errCh <- nil
	}()
	log.G(ctx).WithField("address", l.Addr().String()).Info("CRI endpoint serving")
	return nil
}

// Addr returns the listener's address (nil before Start).
func (s *Server) Addr() net.Addr {
	if s.lis == nil {
		return nil
	}
	return s.lis.Addr()
}

// Err delivers the error that ended serving (nil after Stop), once.
func (s *Server) Err() <-chan error {
	return s.errCh
}

// StopWithin is Stop with a deadline timeout from now, even when ctx is done already (a stop at the
// end of a process whose context ended).
func (s *Server) StopWithin(ctx context.Context, timeout time.Duration) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	s.Stop(sctx)
}

// Stop ends open event streams, lets forwarded calls finish until ctx is done, then closes every
// connection; the socket file is removed. It is safe to call before Start.
func (s *Server) Stop(ctx context.Context) {
	s.service.Shutdown()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		log.G(ctx).Warn("CRI endpoint: calls still running at the stop deadline, closing them")
		s.grpc.Stop()
		<-done
	}
	if s.stopWatch != nil {
		s.stopWatch()
		<-s.watchDone
	}
}

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

// Server is pleg-nri's CRI endpoint: a gRPC server made of a Proxy, on a listener opened by Listen.
type Server struct {
	listen string
	proxy  *Proxy
	grpc   *grpc.Server
	// lis is set by Start.
	lis net.Listener
	// errCh receives the result of Serve, once.
	errCh chan error
	// stopWatch ends the upstream watcher.
	stopWatch context.CancelFunc
	// watchDone is closed when the upstream watcher has returned.
	watchDone chan struct{}
}

// NewServer returns a server for the proxy on the listen address (see ParseEndpoint). extra
// server options are added to the proxy's and to a HandshakeTimeout.
func NewServer(listen string, proxy *Proxy, extra ...grpc.ServerOption) (*Server, error) {
	if _, _, err := dial.ParseEndpoint(listen); err != nil {
		return nil, err
	}
	if proxy == nil {
		return nil, errors.New("nil proxy")
	}
	return &Server{
		listen: listen,
		proxy:  proxy,
		grpc:   grpc.NewServer(append(append(proxy.ServerOptions(), grpc.ConnectionTimeout(HandshakeTimeout)), extra...)...),
		errCh:  make(chan error, 1),
	}, nil
}

// Start listens (see Listen) and serves in a goroutine; a serving error is reported on Err. It also
// starts watching the runtime connection for the metrics.
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
	watchCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.stopWatch = cancel
	s.watchDone = make(chan struct{})
	go func() {
		defer close(s.watchDone)
		s.proxy.WatchUpstream(watchCtx)
	}()
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
	s.proxy.Shutdown()
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

package kubelet

import (
	"context"
	"net"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// The caps on GetContainerEvents streams (ProxyConfig.MaxEventStreams, MaxEventStreamsPerConnection).
// Each stream holds a subscription to the core's fan-out (a queue of subscriber-queue events) and two
// goroutines: a client that opens streams in a loop, or many clients, would otherwise grow pleg-nri
// without bound. A node has one kubelet (one connection, one stream at a time; a new one after each end)
// and a few `crictl events` or `pleg-nri events` (a connection each), so the defaults are far above
// what a node uses. A stream beyond a cap ends at once with RESOURCE_EXHAUSTED and a message that says
// which cap, not with an EOF a client would take for the server's end of a working stream.
const (
	// DefaultMaxEventStreams bounds the event streams open at once on one endpoint.
	DefaultMaxEventStreams = 256
	// DefaultMaxEventStreamsPerConnection bounds the event streams open at once on one client
	// connection.
	DefaultMaxEventStreamsPerConnection = 16
)

// Which cap refused a stream: the limit label of StreamLimitMetrics.EventStreamRefused.
const (
	StreamLimitConnection = "connection"
	StreamLimitTotal      = "total"
)

// StreamLimitMetrics is implemented by a Metrics that wants to count the event streams refused by a cap.
type StreamLimitMetrics interface {
	// EventStreamRefused is called for a GetContainerEvents stream ended at once because limit
	// (StreamLimitConnection or StreamLimitTotal) was reached.
	EventStreamRefused(limit string)
}

// streamLimiter counts the open event streams, in all and per connection, against their caps.
type streamLimiter struct {
	max, perConn int // <= 0: no cap

	// mu guards open and byConn.
	mu     sync.Mutex
	open   int
	byConn map[uint64]int // streams open per connection id (connID); 0 is a connection without one
}

// acquire counts a new stream on the connection conn, or refuses it with RESOURCE_EXHAUSTED (and which
// cap refused it). release uncounts it; call it once, when the stream ends.
func (l *streamLimiter) acquire(conn uint64) (release func(), limit string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perConn > 0 && conn != 0 && l.byConn[conn] >= l.perConn {
		return nil, StreamLimitConnection, status.Errorf(codes.ResourceExhausted,
			"too many event streams on this connection: %d open, at most %d per connection; close one or open another connection",
			l.byConn[conn], l.perConn)
	}
	if l.max > 0 && l.open >= l.max {
		return nil, StreamLimitTotal, status.Errorf(codes.ResourceExhausted,
			"too many event streams on this endpoint: %d open, at most %d in all", l.open, l.max)
	}
	l.open++
	if conn != 0 {
		if l.byConn == nil {
			l.byConn = map[uint64]int{}
		}
		l.byConn[conn]++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.open--
			if conn != 0 {
				if l.byConn[conn]--; l.byConn[conn] <= 0 {
					delete(l.byConn, conn)
				}
			}
		})
	}, "", nil
}

// connCredentials are the proxy's server transport credentials: no security, as without any (the
// endpoint is a unix socket that only root reaches), and a number for each connection in its AuthInfo,
// which the streams of that connection find with connID.
//
// NOTE: gRPC gives a handler no handle on its connection. Its peer address is no such handle on a unix
// socket (every client's is "@" or empty), and a stats.Handler's TagConn would be one, at the cost of
// gRPC building and handing it stats for every message of every forwarded call; the handshake of the
// transport credentials runs once per connection (issue 56).
type connCredentials struct {
	next *atomic.Uint64 // shared by clones
}

func newConnCredentials() connCredentials { return connCredentials{next: new(atomic.Uint64)} }

var _ credentials.TransportCredentials = connCredentials{}

// connAuthInfo is a connection's AuthInfo: no security, and the connection's number (from 1).
type connAuthInfo struct {
	credentials.CommonAuthInfo
	id uint64
}

func (connAuthInfo) AuthType() string { return "insecure" }

// ServerHandshake numbers the connection; it reads and writes nothing.
func (c connCredentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return conn, connAuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, id: c.next.Add(1)}, nil
}

// ClientHandshake is ServerHandshake: the proxy uses these credentials only to serve.
func (c connCredentials) ClientHandshake(_ context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.ServerHandshake(conn)
}

func (connCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (c connCredentials) Clone() credentials.TransportCredentials { return c }

func (connCredentials) OverrideServerName(string) error { return nil }

// connID returns the number connCredentials gave the connection of a stream's context; 0 when it has
// none (a grpc.Server made without the proxy's ServerOptions).
func connID(ctx context.Context) uint64 {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return 0
	}
	info, _ := p.AuthInfo.(connAuthInfo)
	return info.id
}

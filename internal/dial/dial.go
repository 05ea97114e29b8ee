// Package dial parses pleg-nri's socket addresses and dials CRI endpoints, for every package that
// talks to containerd or serves the kubelet.
package dial

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// ParseEndpoint splits an endpoint into a network and an address, the one parser of every socket
// address pleg-nri takes (its listen address, the runtime's CRI endpoint, containerd's address):
// "unix:///path" and "/path" are unix sockets (the path must be absolute), "tcp://host:port" is TCP.
// Nothing else is accepted, so that TCP is only ever used when asked for explicitly.
func ParseEndpoint(endpoint string) (network, address string, err error) {
	switch {
	case endpoint == "":
		return "", "", errors.New("endpoint is empty")
	case strings.HasPrefix(endpoint, "unix://"):
		path := strings.TrimPrefix(endpoint, "unix://")
		if !filepath.IsAbs(path) {
			return "", "", fmt.Errorf("endpoint %q: the socket path must be absolute", endpoint)
		}
		return "unix", filepath.Clean(path), nil
	case filepath.IsAbs(endpoint):
		return "unix", filepath.Clean(endpoint), nil
	case strings.HasPrefix(endpoint, "tcp://"):
		u, err := url.Parse(endpoint)
		if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return "", "", fmt.Errorf("endpoint %q: want tcp://host:port", endpoint)
		}
		return "tcp", u.Host, nil
	}
	return "", "", fmt.Errorf("endpoint %q: want unix:///path, an absolute path or tcp://host:port", endpoint)
}

// Target turns an endpoint into a gRPC client target.
func Target(endpoint string) (string, error) {
	network, address, err := ParseEndpoint(endpoint)
	if err != nil {
		return "", err
	}
	if network == "tcp" {
		return "passthrough:///" + address, nil
	}
	return "unix://" + address, nil
}

// UnixSocketPath returns the socket path of an endpoint that must be a unix socket (containerd's
// address: its client dials a path).
func UnixSocketPath(endpoint string) (string, error) {
	network, address, err := ParseEndpoint(endpoint)
	if err != nil {
		return "", err
	}
	if network != "unix" {
		return "", fmt.Errorf("endpoint %q: only unix sockets are supported", endpoint)
	}
	return address, nil
}

// MaxMsgSize is the largest CRI message sent or received, the kubelet's limit (16 MiB).
const MaxMsgSize = 16 << 20

// CRI returns a gRPC client connection to a CRI endpoint: a unix:// URL, an absolute socket path, or
// a tcp://host:port address. The connection is made lazily and re-made quickly (100ms..2s backoff) after
// the runtime restarts; calls are not WaitForReady, so they fail with codes.Unavailable at once while
// the runtime is down. extra options are appended.
func CRI(endpoint string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	target, err := Target(endpoint)
	if err != nil {
		return nil, err
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(MaxMsgSize),
			grpc.MaxCallSendMsgSize(MaxMsgSize),
		),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  100 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   2 * time.Second,
			},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	conn, err := grpc.NewClient(target, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("failed to create CRI client for %s: %w", endpoint, err)
	}
	return conn, nil
}

// Conns holds one connection per socket for a process's clients: every client of the same endpoint
// (containerd's CRI, its events and its tasks are served on one socket) shares it. The zero value is
// ready; it is not safe for concurrent use.
type Conns struct {
	conns map[string]*grpc.ClientConn
}

// Get returns the connection to endpoint (see CRI), dialing it the first time it is asked for.
func (c *Conns) Get(endpoint string) (*grpc.ClientConn, error) {
	target, err := Target(endpoint)
	if err != nil {
		return nil, err
	}
	if conn, ok := c.conns[target]; ok {
		return conn, nil
	}
	conn, err := CRI(endpoint)
	if err != nil {
		return nil, err
	}
	if c.conns == nil {
		c.conns = make(map[string]*grpc.ClientConn)
	}
	c.conns[target] = conn
	return conn, nil
}

// Close closes every connection.
func (c *Conns) Close() {
	for target, conn := range c.conns {
		_ = conn.Close()
		delete(c.conns, target)
	}
}

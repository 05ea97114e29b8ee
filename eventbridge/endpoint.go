package eventbridge

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
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

// grpcTarget turns an endpoint into a gRPC client target.
func grpcTarget(endpoint string) (string, error) {
	network, address, err := ParseEndpoint(endpoint)
	if err != nil {
		return "", err
	}
	if network == "tcp" {
		return "passthrough:///" + address, nil
	}
	return "unix://" + address, nil
}

// unixSocketPath returns the socket path of an endpoint that must be a unix socket (containerd's
// address: its client dials a path).
func unixSocketPath(endpoint string) (string, error) {
	network, address, err := ParseEndpoint(endpoint)
	if err != nil {
		return "", err
	}
	if network != "unix" {
		return "", fmt.Errorf("endpoint %q: only unix sockets are supported", endpoint)
	}
	return address, nil
}

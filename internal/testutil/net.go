package testutil

import "net"

// FreeLoopbackAddr returns a 127.0.0.1 address with a port nobody listens on right now (the port may be
// taken again before the caller listens on it: use it where a clash fails loudly).
func FreeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

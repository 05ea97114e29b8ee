package dial

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in            string
		network, addr string
		wantErr       bool
	}{
		{in: "unix:///run/pleg-nri/cri.sock", network: "unix", addr: "/run/pleg-nri/cri.sock"},
		{in: "/run/pleg-nri/cri.sock", network: "unix", addr: "/run/pleg-nri/cri.sock"},
		{in: "/run/pleg-nri/../pleg-nri/cri.sock", network: "unix", addr: "/run/pleg-nri/cri.sock"},
		{in: "tcp://127.0.0.1:9000", network: "tcp", addr: "127.0.0.1:9000"},
		{in: "tcp://[::1]:9000", network: "tcp", addr: "[::1]:9000"},
		{in: "", wantErr: true},
		{in: "127.0.0.1:9000", wantErr: true},
		{in: "unix://run/cri.sock", wantErr: true},
		{in: "relative/cri.sock", wantErr: true},
		{in: "tcp://", wantErr: true},
		{in: "tcp://host:1/path", wantErr: true},
		{in: "http://127.0.0.1:1", wantErr: true},
	} {
		network, addr, err := ParseEndpoint(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("ParseEndpoint(%q): error %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if network != tc.network || addr != tc.addr {
			t.Errorf("ParseEndpoint(%q) = %q, %q; want %q, %q", tc.in, network, addr, tc.network, tc.addr)
		}
	}
}

// TestConns: the endpoints of one socket, however spelled, share a connection; another socket has its
// own; Close closes them all.
func TestConns(t *testing.T) {
	var c Conns
	a, err := c.Get("unix:///run/containerd/containerd.sock")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Get("/run/containerd/../containerd/containerd.sock")
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Error("two spellings of one socket got two connections")
	}
	other, err := c.Get("tcp://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	if other == a {
		t.Error("another endpoint got the same connection")
	}
	if _, err := c.Get("relative.sock"); err == nil {
		t.Error("Get of an invalid endpoint: no error")
	}
	c.Close()
	for _, conn := range []*grpc.ClientConn{a, other} {
		if s := conn.GetState(); s != connectivity.Shutdown {
			t.Errorf("after Close: state %v, want Shutdown", s)
		}
	}
}

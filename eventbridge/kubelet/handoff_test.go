package kubelet

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/internal/endpointtest"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// sendListener listens on path and sends the listener's socket with msg over a socket pair: it returns
// the listener and the pair's receiving end, both closed when the test ends.
func sendListener(t *testing.T, path string, msg []byte) (net.Listener, *net.UnixConn) {
	t.Helper()
	l, err := Listen(context.Background(), "unix://"+path)
	if err != nil {
		t.Fatal(err)
	}
	a, b, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = a.Close(), b.Close() })
	f, err := ListenerFile(l)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := SendFiles(a, msg, f); err != nil {
		t.Fatal(err)
	}
	return l, b
}

// TestListenerHandoff: a listener opened by Listen, handed to a successor over a unix connection,
// serves there; the old one closed with KeepSocketFile leaves the socket file in place, and the
// successor's Close removes it.
func TestListenerHandoff(t *testing.T) {
	dir := testutil.ShortTempDir(t, "eb-")
	path := filepath.Join(dir, "cri.sock")
	old, b := sendListener(t, path, []byte("hello"))
	msg, files, err := ReceiveFiles(b, 64, 2)
	if err != nil || string(msg) != "hello" || len(files) != 1 {
		t.Fatalf("received %q, %d files, %v", msg, len(files), err)
	}
	succ, err := FileListener(context.Background(), files[0], path)
	files[0].Close()
	if err != nil {
		t.Fatal(err)
	}
	KeepSocketFile(old)
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the socket file is gone after the handed-over listener closed: %v", err)
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := succ.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial after the handoff: %v", err)
	}
	c.Close()
	if err := <-accepted; err != nil {
		t.Fatalf("the successor did not accept: %v", err)
	}
	if err := succ.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the successor's Close left the socket file: %v", err)
	}
}

// socketPair returns two connected unix connections.
func socketPair() (*net.UnixConn, *net.UnixConn, error) {
	dir, err := os.MkdirTemp("", "sp-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "s"), Net: "unix"})
	if err != nil {
		return nil, nil, err
	}
	defer l.Close()
	a, err := net.DialUnix("unix", nil, l.Addr().(*net.UnixAddr))
	if err != nil {
		return nil, nil, err
	}
	b, err := l.AcceptUnix()
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// TestFailedHandoffListenerStops: a listener whose socket was sent to a successor that then dropped it
// (a refused or failed takeover) serves on, and its Close still ends a pending Accept at once. Sending
// used to put the shared socket in blocking mode (os.File.Fd), so that the Accept sat in the kernel and
// Close waited for it for ever: a front whose takeover failed could not stop.
func TestFailedHandoffListenerStops(t *testing.T) {
	path := filepath.Join(testutil.ShortTempDir(t, "eb-"), "cri.sock")
	l, b := sendListener(t, path, nil)
	_, files, err := ReceiveFiles(b, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		f.Close() // the successor gives up
	}
	accepted := make(chan error, 2)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				accepted <- err
				return
			}
			c.Close()
			accepted <- nil
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := endpointtest.Recv(t, accepted, "a connection accepted"); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	endpointtest.Recv(t, closed, "Close to return")
	if err := endpointtest.Recv(t, accepted, "the pending Accept to end"); err == nil {
		t.Error("Accept after Close: no error")
	}
}

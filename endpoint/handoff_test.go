package endpoint

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// TestListenerHandoff: a listener opened by Listen, handed to a successor over a unix connection,
// serves there; the old one closed with KeepSocketFile leaves the socket file in place, and the
// successor's Close removes it.
func TestListenerHandoff(t *testing.T) {
	dir := testutil.ShortTempDir(t, "eb-")
	path := filepath.Join(dir, "cri.sock")
	old, err := Listen(context.Background(), "unix://"+path)
	if err != nil {
		t.Fatal(err)
	}
	a, b, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	f, err := ListenerFile(old)
	if err != nil {
		t.Fatal(err)
	}
	if err := SendFiles(a, []byte("hello"), f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	msg, files, err := ReceiveFiles(b, 64, 2)
	if err != nil || string(msg) != "hello" || len(files) != 1 {
		t.Fatalf("received %q, %d files, %v", msg, len(files), err)
	}
	succ, err := FileListener(files[0])
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

package kubelet

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

func TestServerRefusesSecondInstance(t *testing.T) {
	e := newEnv(t, 1)
	s2, err := NewServer(e.server.Addr().String(), mustProxy(t, ProxyConfig{Backend: e.direct}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "another server") {
		t.Fatalf("second server started: %v", err)
	}
	s2.Stop(context.Background())
}

// TestServerStopRightAfterStart: a Stop that comes before the serving goroutine has begun is a stop, not a
// serving error (seen as "grpc: the server has been stopped" on a loaded machine). Repeated, since
// which comes first is up to the scheduler.
func TestServerStopRightAfterStart(t *testing.T) {
	e := newEnv(t, 1)
	dir := testutil.ShortTempDir(t, "eb")
	for i := range 50 {
		srv, err := NewServer("unix://"+filepath.Join(dir, fmt.Sprintf("s%d.sock", i)), mustProxy(t, ProxyConfig{Backend: e.direct}))
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		srv.Stop(context.Background())
		if err := <-srv.Err(); err != nil {
			t.Fatalf("start %d: serving ended with %v after Stop", i, err)
		}
	}
}

package eventbridge

import (
	"context"
	"strings"
	"testing"
)

func TestServerRefusesSecondInstance(t *testing.T) {
	e := newEnv(t, 1)
	s2, err := NewServer(e.server.Addr().String(), mustProxy(t, ProxyConfig{Backend: e.direct, ReadFreshness: ReadFreshnessOff}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "another server") {
		t.Fatalf("second server started: %v", err)
	}
	s2.Stop(context.Background())
}

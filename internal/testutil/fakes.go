package testutil

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// VersionRuntime is a CRI runtime service that answers Version, as a runtime the kubelet accepts (API
// 0.1.0, v1) named Name ("" names none), and every other call Unimplemented: the least a CRI endpoint
// answers (the front as pleg-nri health sees it, the gate's check). Embed it to answer more.
type VersionRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	Name string
}

func (v VersionRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: v.Name, RuntimeVersion: "0.1.0", RuntimeApiVersion: "v1"}, nil
}

// ServeVersionRuntime serves VersionRuntime{Name: name} on the unix socket at path, as ServeGRPC does.
func ServeVersionRuntime(t testing.TB, path, name string) *grpc.Server {
	t.Helper()
	return ServeGRPC(t, path, func(s *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(s, VersionRuntime{Name: name}) })
}

// Readyz is a fake of the core's /readyz, served until the test ends: 200 "ok" while it is ready, 503
// with the reason Fail gave while it is not.
type Readyz struct {
	// URL is its /readyz's URL.
	URL    string
	reason atomic.Pointer[string]
}

// ServeReadyz serves a Readyz, ready.
func ServeReadyz(t testing.TB) *Readyz {
	t.Helper()
	r := &Readyz{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if reason := r.reason.Load(); reason != nil {
			http.Error(w, *reason, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	}))
	t.Cleanup(srv.Close)
	r.URL = srv.URL + "/readyz"
	return r
}

// Fail makes it answer 503 with reason, or, with "", ready again.
func (r *Readyz) Fail(reason string) {
	if reason == "" {
		r.reason.Store(nil)
		return
	}
	r.reason.Store(&reason)
}

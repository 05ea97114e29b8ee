package kubelet

import (
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/internal/endpointtest"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// panickingMetrics panics when a forwarded call ends: a bug in the endpoint's own code, in the
// goroutine that handles a call.
type panickingMetrics struct{ NopMetrics }

func (panickingMetrics) ForwardedCall(string, codes.Code, time.Duration) { panic("a bug") }

// TestHandlerPanicIsAnError (issue 56): a panic while the endpoint handles a call fails that call with
// INTERNAL and the endpoint serves on. It failed before: the panic ended the process, the front, and
// with it every CRI call of the node.
func TestHandlerPanicIsAnError(t *testing.T) {
	dir := testutil.ShortTempDir(t, "eb-")
	b := startBackend(t, filepath.Join(dir, "backend.sock"), newFakeRuntime(1))
	srv, _ := startServer(t, filepath.Join(dir, "cri.sock"), ProxyConfig{Backend: endpointtest.Connect(t, b.path),
		Events: newFakeSource(), Metrics: panickingMetrics{}})
	client := runtimeapi.NewRuntimeServiceClient(endpointtest.Connect(t, srv.Addr().String()))
	for range 2 {
		_, err := client.Version(endpointtest.Ctx(t), &runtimeapi.VersionRequest{})
		if status.Code(err) != codes.Internal {
			t.Fatalf("Version with a panicking handler: %v, want INTERNAL", err)
		}
	}
}

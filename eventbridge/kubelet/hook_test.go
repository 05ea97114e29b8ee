package kubelet

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/internal/endpointtest"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// orderHook records the calls it sees into a shared log, forwards each times times (0: it answers
// itself with answer), and notes the answers it got.
type orderHook struct {
	name   string
	method string
	times  int
	answer proto.Message
	// mu guards log.
	mu  *sync.Mutex
	log *[]string
}

func (h *orderHook) Sending([]byte) {}

func (h *orderHook) Wants(method string) bool { return method == h.method }

func (h *orderHook) Call(ctx context.Context, c *Call, forward func(context.Context) error) error {
	h.note(h.name + " in")
	if h.times == 0 {
		b, err := proto.Marshal(h.answer)
		if err != nil {
			return err
		}
		c.SetAnswer(b)
	}
	for range h.times {
		if err := forward(ctx); err != nil {
			return err
		}
		if _, err := c.Answer(); err != nil {
			h.note(h.name + " got " + err.Error())
		}
	}
	h.note(h.name + " out")
	return nil
}

func (h *orderHook) note(s string) {
	h.mu.Lock()
	*h.log = append(*h.log, s)
	h.mu.Unlock()
}

// TestReadHooks (issue 57, the seam): the hooks that want a call see it in order, each forward going
// through the ones after it to the runtime; a call a hook answers itself reaches no runtime and is not
// counted as forwarded; a hook's answer is the client's.
func TestReadHooks(t *testing.T) {
	dir := testutil.ShortTempDir(t, "hk-")
	b := startBackend(t, filepath.Join(dir, "backend.sock"), newFakeRuntime(1))
	metrics := &recordingMetrics{}
	p := mustProxy(t, ProxyConfig{Backend: endpointtest.Connect(t, b.path), Metrics: metrics})
	var mu sync.Mutex
	var log []string
	const version, list = "/runtime.v1.RuntimeService/Version", "/runtime.v1.RuntimeService/ListContainers"
	p.hooks = []ReadHook{
		&orderHook{name: "outer", method: version, times: 2, mu: &mu, log: &log},
		&orderHook{name: "inner", method: version, times: 1, mu: &mu, log: &log},
		&orderHook{name: "answers", method: list, answer: &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{{Id: "from-hook"}}}, mu: &mu, log: &log},
	}
	srv, _ := serveProxy(t, filepath.Join(dir, "cri.sock"), p)
	rt := runtimeapi.NewRuntimeServiceClient(endpointtest.Connect(t, srv.Addr().String()))
	ctx := endpointtest.Ctx(t)

	v, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil || v.GetRuntimeName() != "fake" {
		t.Fatalf("Version = %v, %v; want the runtime's", v, err)
	}
	if want := []string{"outer in", "inner in", "inner out", "inner in", "inner out", "outer out"}; !slices.Equal(log, want) {
		t.Errorf("hooks saw %q, want %q", log, want)
	}
	l, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil || len(l.GetContainers()) != 1 || l.GetContainers()[0].GetId() != "from-hook" {
		t.Fatalf("ListContainers = %v, %v; want the hook's answer", l, err)
	}
	metrics.mu.Lock()
	defer metrics.mu.Unlock()
	if got := metrics.forwarded[version]; !slices.Equal(got, []codes.Code{codes.OK}) {
		t.Errorf("Version counted as forwarded %v, want once, OK", got)
	}
	if got := metrics.forwarded[list]; len(got) != 0 {
		t.Errorf("ListContainers answered by a hook counted as forwarded: %v", got)
	}
}

package kubelet

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/internal/endpointtest"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// TestMessageID: field 1 of a CRI request about one object, as a decoder reads it (the last occurrence
// wins); a message without it, or whose field 1 is not bytes, has none; a message cut short gives what
// was read before the cut.
func TestMessageID(t *testing.T) {
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	status := marshal(&runtimeapi.ContainerStatusRequest{ContainerId: "c1", Verbose: true})
	twice := protowire.AppendString(protowire.AppendTag(status, 1, protowire.BytesType), "c2")
	varint := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 7)
	for _, tc := range []struct {
		name  string
		b     []byte
		id    string
		found bool
	}{
		{"container", status, "c1", true},
		{"sandbox", marshal(&runtimeapi.PodSandboxStatusRequest{PodSandboxId: "s1"}), "s1", true},
		{"after other fields", protowire.AppendString(protowire.AppendTag(protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 1), 1, protowire.BytesType), "c3"), "c3", true},
		{"last wins", twice, "c2", true},
		{"empty", nil, "", false},
		{"field 1 a varint", varint, "", false},
		{"cut in the id", status[:3], "", false},
		{"cut after the id", append(status[:len(status):len(status)], 0x10), "c1", true},
		{"bad tag", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, "", false},
	} {
		if id, found := MessageID(tc.b); id != tc.id || found != tc.found {
			t.Errorf("%s: MessageID = %q, %v; want %q, %v", tc.name, id, found, tc.id, tc.found)
		}
	}
}

// callHook notes what a hook sees of a call, and forwards it twice, forgetting the first answer.
type callHook struct {
	method, objectID string
	request          []byte
	first, second    []byte
}

func (h *callHook) Sending([]byte) {}

func (h *callHook) Wants(method string) bool { return method == ContainerStatusMethod }

func (h *callHook) Call(ctx context.Context, c *Call, forward func(context.Context) error) error {
	h.method, h.objectID, h.request = c.Method(), c.ObjectID(), append([]byte(nil), c.Request()...)
	if b, err := c.Answer(); b != nil || err != nil {
		h.first = []byte("an answer before the forward")
		return nil
	}
	if err := forward(ctx); err != nil {
		return err
	}
	b, err := c.Answer()
	if err != nil {
		return err
	}
	h.first = append([]byte(nil), b...)
	c.ClearAnswer()
	if err := forward(ctx); err != nil {
		return err
	}
	if b, err = c.Answer(); err != nil {
		return err
	}
	h.second = append([]byte(nil), b...)
	return nil
}

// TestCallAccessors: a hook sees the call's method, its request as sent and the object it names; no
// answer before it forwards; the runtime's answer after; and after ClearAnswer the next forward's.
func TestCallAccessors(t *testing.T) {
	dir := testutil.ShortTempDir(t, "ca-")
	rt := newFakeRuntime(1)
	b := startBackend(t, filepath.Join(dir, "backend.sock"), rt)
	p := mustProxy(t, ProxyConfig{Backend: endpointtest.Connect(t, b.path)})
	h := &callHook{}
	p.hooks = []ReadHook{h}
	srv, _ := serveProxy(t, filepath.Join(dir, "cri.sock"), p)
	client := runtimeapi.NewRuntimeServiceClient(endpointtest.Connect(t, srv.Addr().String()))
	id := rt.containers[0].Id
	resp, err := client.ContainerStatus(endpointtest.Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil || resp.GetStatus().GetId() != id {
		t.Fatalf("ContainerStatus = %v, %v", resp, err)
	}
	if h.method != ContainerStatusMethod || h.objectID != id {
		t.Errorf("the hook saw method %q, object %q; want ContainerStatus of %s", h.method, h.objectID, id)
	}
	var req runtimeapi.ContainerStatusRequest
	if err := proto.Unmarshal(h.request, &req); err != nil || req.ContainerId != id {
		t.Errorf("the hook's request: %v, %v", &req, err)
	}
	var first, second runtimeapi.ContainerStatusResponse
	if err := proto.Unmarshal(h.first, &first); err != nil || first.GetStatus().GetId() != id {
		t.Errorf("the answer after the first forward: %q, %v", h.first, err)
	}
	if err := proto.Unmarshal(h.second, &second); err != nil || !proto.Equal(&first, &second) {
		t.Errorf("the answer after ClearAnswer and a second forward: %v, %v; want the first again", &second, err)
	}
}

// TestRefusedPeersMetric: the count of refused connections is one metric, by socket.
func TestRefusedPeersMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := NewRefusedPeersMetric(reg)
	c.WithLabelValues(SocketCore).Inc()
	c.WithLabelValues(SocketCRI).Add(2)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "pleg_nri_refused_connections_total" {
		t.Fatalf("gathered %v, %v; want pleg_nri_refused_connections_total", mfs, err)
	}
	got := map[string]float64{}
	for _, m := range mfs[0].GetMetric() {
		got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
	}
	if len(got) != 2 || got[SocketCore] != 1 || got[SocketCRI] != 2 {
		t.Errorf("refused connections by socket: %v, want core 1, cri 2", got)
	}
}

// TestStopWithin: a server stops within the timeout even when the context it is given has ended.
func TestStopWithin(t *testing.T) {
	dir := testutil.ShortTempDir(t, "sw-")
	srv, err := NewServer("unix://"+filepath.Join(dir, "cri.sock"), mustProxy(t, ProxyConfig{Backend: endpointtest.Connect(t, filepath.Join(dir, "none.sock"))}))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	srv.StopWithin(ctx, time.Second)
	if took := time.Since(start); took > endpointtest.WaitTimeout {
		t.Errorf("StopWithin took %s", took)
	}
	if err := endpointtest.Recv(t, srv.Err(), "the serve's end"); err != nil {
		t.Errorf("serve: %v", err)
	}
}

package kubelet

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/internal/endpointtest"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// encodedSource's streams are EncodedEventStreams: NextEncoded gives one event's bytes, Next another
// event, so a client tells which one the proxy used.
type encodedSource struct {
	encoded []byte
	decoded *runtimeapi.ContainerEventResponse
}

func (s encodedSource) Subscribe() EventStream {
	return &encodedStream{src: s, sent: make(chan struct{}, 1)}
}

type encodedStream struct {
	src  encodedSource
	sent chan struct{}
}

func (s *encodedStream) Next(ctx context.Context) (*runtimeapi.ContainerEventResponse, time.Time, error) {
	select {
	case s.sent <- struct{}{}:
		return s.src.decoded, time.Time{}, nil
	default:
		<-ctx.Done()
		return nil, time.Time{}, ctx.Err()
	}
}

func (s *encodedStream) NextEncoded(ctx context.Context) ([]byte, time.Time, error) {
	select {
	case s.sent <- struct{}{}:
		return s.src.encoded, time.Now(), nil
	default:
		<-ctx.Done()
		return nil, time.Time{}, ctx.Err()
	}
}

func (s *encodedStream) Close() {}

// TestEncodedEventStream: the proxy sends the bytes an EncodedEventStream hands out, as they are.
func TestEncodedEventStream(t *testing.T) {
	ctx := endpointtest.Ctx(t)
	dir := testutil.ShortTempDir(t, "eb-")
	be := startBackend(t, filepath.Join(dir, "backend.sock"), newFakeRuntime(0))
	want := endpointtest.Event("encoded", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	b, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	src := encodedSource{encoded: b, decoded: endpointtest.Event("decoded", runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT)}
	srv, _ := startServer(t, filepath.Join(dir, "run", "cri.sock"), ProxyConfig{Backend: endpointtest.Connect(t, be.path), Events: src})
	conn := endpointtest.Connect(t, srv.Addr().String())

	for range 2 { // two streams get the same shared bytes
		sctx, cancel := context.WithCancel(ctx)
		s, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(sctx, &runtimeapi.GetEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, endpointtest.RecvEvent(t, s), protocmp.Transform()); diff != "" {
			t.Errorf("event (-want +got):\n%s", diff)
		}
		cancel()
	}
}

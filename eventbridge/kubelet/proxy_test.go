package kubelet

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/wrapperspb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/internal/endpointtest"
	"github.com/pleg-nri/pleg-nri/internal/grpcraw"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// rawCall calls method with the request's bytes and returns the answer's bytes as received.
func rawCall(ctx context.Context, conn *grpc.ClientConn, method string, req proto.Message, opts ...grpc.CallOption) ([]byte, error) {
	in, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	var out grpcraw.Frame
	defer out.Free()
	err = conn.Invoke(ctx, method, &grpcraw.Frame{Data: in}, &out, append(opts, grpc.ForceCodecV2(grpcraw.Codec{}))...)
	return out.Bytes(), err
}

func TestProxyUnaryByteEqual(t *testing.T) {
	e := newEnv(t, 20)
	ctx := endpointtest.Ctx(t)
	for _, c := range []struct {
		method string
		req    proto.Message
	}{
		{runtimeapi.RuntimeService_Version_FullMethodName, &runtimeapi.VersionRequest{Version: "v1"}},
		{runtimeapi.RuntimeService_ListContainers_FullMethodName, &runtimeapi.ListContainersRequest{}},
		{runtimeapi.RuntimeService_ContainerStatus_FullMethodName, &runtimeapi.ContainerStatusRequest{ContainerId: e.backend.runtime.containers[3].Id}},
		{runtimeapi.ImageService_ListImages_FullMethodName, &runtimeapi.ListImagesRequest{}},
		{"/pleg.test.Custom/Echo", wrapperspb.String("hello")},
	} {
		t.Run(c.method, func(t *testing.T) {
			want, err := rawCall(ctx, e.direct, c.method, c.req)
			if err != nil {
				t.Fatalf("direct: %v", err)
			}
			got, err := rawCall(ctx, e.proxied, c.method, c.req)
			if err != nil {
				t.Fatalf("proxied: %v", err)
			}
			if len(want) == 0 {
				t.Fatal("empty answer")
			}
			if string(want) != string(got) {
				t.Errorf("answers differ:\ndirect  %x\nproxied %x", want, got)
			}
		})
	}

	// The generated clients work through the proxy too.
	rt := runtimeapi.NewRuntimeServiceClient(e.proxied)
	v, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil || v.RuntimeName != "fake" {
		t.Fatalf("Version through the proxy: %v, %v", v, err)
	}
	imgs, err := runtimeapi.NewImageServiceClient(e.proxied).ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil || len(imgs.Images) != 1 {
		t.Fatalf("ListImages through the proxy: %v, %v", imgs, err)
	}
	var echo wrapperspb.StringValue
	if err := e.proxied.Invoke(ctx, "/pleg.test.Custom/Echo", wrapperspb.String("x"), &echo); err != nil || echo.Value != "echo:x" {
		t.Fatalf("unknown method through the proxy: %q, %v", echo.Value, err)
	}

	e.metrics.mu.Lock()
	defer e.metrics.mu.Unlock()
	if got := e.metrics.forwarded[runtimeapi.RuntimeService_Version_FullMethodName]; len(got) != 2 || got[0] != codes.OK {
		t.Errorf("Version metrics: %v", got)
	}
}

func TestProxyMetadataAndErrors(t *testing.T) {
	e := newEnv(t, 2)
	ctx := endpointtest.Ctx(t)

	// Metadata goes to the backend; its headers and trailers come back.
	var hdr, trl metadata.MD
	octx := metadata.AppendToOutgoingContext(ctx, "x-test", "hello")
	if _, err := runtimeapi.NewRuntimeServiceClient(e.proxied).Version(octx, &runtimeapi.VersionRequest{}, grpc.Header(&hdr), grpc.Trailer(&trl)); err != nil {
		t.Fatal(err)
	}
	if got := hdr.Get("x-echo"); len(got) != 1 || got[0] != "hello" {
		t.Errorf("header x-echo = %v, want [hello] (all: %v)", got, hdr)
	}
	if got := trl.Get("x-trailer"); len(got) != 1 || got[0] != "t-hello" {
		t.Errorf("trailer x-trailer = %v, want [t-hello] (all: %v)", got, trl)
	}

	// Errors: code, message and details as the backend sent them.
	call := func(conn *grpc.ClientConn) *status.Status {
		_, err := runtimeapi.NewRuntimeServiceClient(conn).ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "missing"})
		return status.Convert(err)
	}
	want, got := call(e.direct), call(e.proxied)
	if want.Code() != codes.NotFound {
		t.Fatalf("direct code %v", want.Code())
	}
	if diff := cmp.Diff(want.Proto(), got.Proto(), protocmp.Transform()); diff != "" {
		t.Errorf("status (-direct +proxied):\n%s", diff)
	}
	if len(got.Details()) != 1 {
		t.Errorf("details = %v", got.Details())
	}

	// A method the backend does not implement.
	_, err := runtimeapi.NewRuntimeServiceClient(e.proxied).CheckpointContainer(ctx, &runtimeapi.CheckpointContainerRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("CheckpointContainer: %v, want Unimplemented", err)
	}
	// A method nobody has.
	err = e.proxied.Invoke(ctx, "/nope.Service/Nope", wrapperspb.String("x"), &wrapperspb.StringValue{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("unknown service: %v, want Unimplemented", err)
	}
}

func TestProxyStreams(t *testing.T) {
	e := newEnv(t, 5)
	ctx := endpointtest.Ctx(t)

	// Server streaming.
	stream, err := runtimeapi.NewRuntimeServiceClient(e.proxied).StreamContainers(ctx, &runtimeapi.StreamContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.Containers[0].Id)
	}
	if len(ids) != 5 {
		t.Errorf("got %d containers, want 5", len(ids))
	}

	// Bidirectional streaming on a method unknown to this build.
	cs, err := e.proxied.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/pleg.test.Custom/Chat")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"a", "b", "c"} {
		if err := cs.SendMsg(wrapperspb.String(s)); err != nil {
			t.Fatal(err)
		}
		var out wrapperspb.StringValue
		if err := cs.RecvMsg(&out); err != nil {
			t.Fatal(err)
		}
		if out.Value != "re:"+s {
			t.Errorf("got %q", out.Value)
		}
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(&wrapperspb.StringValue{}); err != io.EOF {
		t.Errorf("end of chat: %v, want EOF", err)
	}
}

func TestProxyCancellationReachesBackend(t *testing.T) {
	e := newEnv(t, 1)
	ctx, cancel := context.WithCancel(endpointtest.Ctx(t))
	stream, err := runtimeapi.NewRuntimeServiceClient(e.proxied).StreamContainers(ctx, &runtimeapi.StreamContainersRequest{
		Filter: &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"wait": "yes"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	if m := endpointtest.Recv(t, e.backend.runtime.canceled, "the backend to see the cancellation"); m != "StreamContainers" {
		t.Fatalf("canceled %s", m)
	}

	// A deadline reaches the backend too: the first answer shows the call reached it before the deadline
	// (long enough for a loaded machine), then the stream ends with it.
	dctx, dcancel := context.WithTimeout(endpointtest.Ctx(t), 2*time.Second)
	defer dcancel()
	stream, err = runtimeapi.NewRuntimeServiceClient(e.proxied).StreamContainers(dctx, &runtimeapi.StreamContainersRequest{
		Filter: &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"wait": "yes"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("the call did not reach the backend before its deadline: %v", err)
	}
	for {
		if _, err = stream.Recv(); err != nil {
			break
		}
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("stream past its deadline: %v, want DeadlineExceeded", err)
	}
	endpointtest.Recv(t, e.backend.runtime.canceled, "the backend to see the deadline")
}

func TestProxyEvents(t *testing.T) {
	e := newEnv(t, 1)
	ctx := endpointtest.Ctx(t)
	rt := runtimeapi.NewRuntimeServiceClient(e.proxied)

	// Two subscribers each get every event, none from the backend.
	s1, err := rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fs1 := e.source.NextOpened(t)
	ctx2, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	s2, err := rt.GetContainerEvents(ctx2, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fs2 := e.source.NextOpened(t)
	want := []*runtimeapi.ContainerEventResponse{
		endpointtest.Event("c1", runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT),
		endpointtest.Event("c1", runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT),
		endpointtest.Event("c1", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT),
	}
	for _, ev := range want {
		e.source.Publish(ev)
	}
	for _, s := range []grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]{s1, s2} {
		for _, w := range want {
			if diff := cmp.Diff(w, endpointtest.RecvEvent(t, s), protocmp.Transform()); diff != "" {
				t.Errorf("event (-want +got):\n%s", diff)
			}
		}
	}

	// The core evicts s1: its client gets RESOURCE_EXHAUSTED; s2 goes on.
	fs1.End <- status.Error(codes.ResourceExhausted, "subscriber too slow, evicted")
	if _, err := s1.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("evicted stream: %v, want ResourceExhausted", err)
	}
	e.source.Publish(endpointtest.Event("c2", runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT))
	if got := endpointtest.RecvEvent(t, s2); got.ContainerId != "c2" {
		t.Errorf("s2 got %s", got.ContainerId)
	}
	endpointtest.WaitClosed(t, fs1)

	// An errdefs error from the core gets its gRPC code.
	s4, err := rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fs4 := e.source.NextOpened(t)
	fs4.End <- fmt.Errorf("queue full: %w", errdefs.ErrResourceExhausted)
	if _, err := s4.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("errdefs eviction: %v, want ResourceExhausted", err)
	}
	endpointtest.WaitClosed(t, fs4)

	// A client that goes away closes its subscription.
	ctx3, cancel3 := context.WithCancel(ctx)
	if _, err := rt.GetContainerEvents(ctx3, &runtimeapi.GetEventsRequest{}); err != nil {
		t.Fatal(err)
	}
	fs3 := e.source.NextOpened(t)
	cancel3()
	endpointtest.WaitClosed(t, fs3)

	// The proxy counts an event after sending it, so after its client may have it: every count is in
	// once every stream has ended.
	cancel2()
	endpointtest.WaitClosed(t, fs2)
	e.metrics.mu.Lock()
	sent := e.metrics.sent
	e.metrics.mu.Unlock()
	if sent != 7 {
		t.Errorf("events sent = %d, want 7", sent)
	}
}

// TestProxyBackendRestart: while the backend is down, forwarded calls fail with UNAVAILABLE at once and
// open event streams go on; when it is back, calls work again.
func TestProxyBackendRestart(t *testing.T) {
	e := newEnv(t, 1)
	ctx := endpointtest.Ctx(t)
	rt := runtimeapi.NewRuntimeServiceClient(e.proxied)
	if _, err := rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	events, err := rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.source.NextOpened(t)

	e.backend.stop()
	for i := range 3 {
		start := time.Now()
		_, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("call %d with the backend down: %v, want Unavailable", i, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("call %d took %s to fail", i, d)
		}
	}
	e.source.Publish(endpointtest.Event("c1", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT))
	if got := endpointtest.RecvEvent(t, events); got.ContainerId != "c1" {
		t.Errorf("event %s", got.ContainerId)
	}

	e.backend.start()
	if err := testutil.Poll(ctx, endpointtest.WaitTimeout, "calls to work again with the backend back", func() (bool, error) {
		_, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
		return err == nil, err
	}); err != nil {
		t.Fatal(err)
	}
	e.source.Publish(endpointtest.Event("c2", runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT))
	if got := endpointtest.RecvEvent(t, events); got.ContainerId != "c2" {
		t.Errorf("event %s", got.ContainerId)
	}

	// The upstream state went up, down and up again.
	if err := testutil.Poll(ctx, endpointtest.WaitTimeout, "the upstream state to go up, down and up", func() (bool, error) {
		e.metrics.mu.Lock()
		states := append([]bool(nil), e.metrics.upstream...)
		e.metrics.mu.Unlock()
		return cmp.Equal(states, []bool{true, false, true}), fmt.Errorf("upstream states %v, want [true false true]", states)
	}); err != nil {
		t.Fatal(err)
	}
}

// TestProxyShutdownEndsEventStreams: Stop does not wait for event streams.
func TestProxyShutdownEndsEventStreams(t *testing.T) {
	e := newEnv(t, 1)
	ctx := endpointtest.Ctx(t)
	events, err := runtimeapi.NewRuntimeServiceClient(e.proxied).GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fs := e.source.NextOpened(t)
	start := time.Now()
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	e.server.Stop(stopCtx)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Stop took %s", d)
	}
	if _, err := events.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("event stream at shutdown: %v, want Unavailable", err)
	}
	endpointtest.WaitClosed(t, fs)
}

func TestIsUnary(t *testing.T) {
	for method, want := range map[string]bool{
		runtimeapi.RuntimeService_Version_FullMethodName:            true,
		runtimeapi.RuntimeService_ListContainers_FullMethodName:     true,
		runtimeapi.ImageService_PullImage_FullMethodName:            true,
		runtimeapi.RuntimeService_GetContainerEvents_FullMethodName: false,
		runtimeapi.RuntimeService_StreamContainers_FullMethodName:   false,
		"/pleg.test.Custom/Echo":                                    false, // unknown: forwarded as a stream
		"/runtime.v1.RuntimeService/NoSuchMethod":                   false,
		"/runtime.v1.RuntimeService":                                false,
		"":                                                          false,
		"no-slash":                                                  false,
	} {
		if got := isUnary(method); got != want {
			t.Errorf("isUnary(%q) = %v, want %v", method, got, want)
		}
	}
}

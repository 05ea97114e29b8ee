package kubelet

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// deterministicCodec marshals protos deterministically, so that two answers of the fake backend to the
// same request are byte-equal (map fields would otherwise come out in random order).
type deterministicCodec struct{}

func (deterministicCodec) Marshal(v any) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(v.(proto.Message))
}
func (deterministicCodec) Unmarshal(data []byte, v any) error {
	return proto.Unmarshal(data, v.(proto.Message))
}
func (deterministicCodec) Name() string { return "proto" }

var _ encoding.Codec = deterministicCodec{}

// fakeRuntime is a CRI runtime and image service with a few methods.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	// containers is what ListContainers returns.
	containers []*runtimeapi.Container
	// canceled receives the method name when a streaming call sees its context canceled.
	canceled chan string
}

func (f *fakeRuntime) Version(ctx context.Context, _ *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("x-test"); len(v) > 0 {
			_ = grpc.SetHeader(ctx, metadata.Pairs("x-echo", v[0]))
			_ = grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "t-"+v[0]))
		}
	}
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fake", RuntimeVersion: "1.2.3", RuntimeApiVersion: "v1"}, nil
}

func (f *fakeRuntime) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{Containers: f.containers}, nil
}

func (f *fakeRuntime) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	for _, c := range f.containers {
		if c.Id == req.ContainerId {
			return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{
				Id: c.Id, Metadata: c.Metadata, State: c.State, CreatedAt: c.CreatedAt, Labels: c.Labels, Annotations: c.Annotations,
			}}, nil
		}
	}
	st, err := status.New(codes.NotFound, fmt.Sprintf("an error occurred when try to find container %q: not found", req.ContainerId)).
		WithDetails(wrapperspb.String("detail:" + req.ContainerId))
	if err != nil {
		return nil, err
	}
	return nil, st.Err()
}

func (f *fakeRuntime) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	if req.PodSandboxId == "s1" {
		return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{
			Id: "s1", Metadata: &runtimeapi.PodSandboxMetadata{Name: "pod", Uid: "uid-1", Namespace: "default"},
			State: runtimeapi.PodSandboxState_SANDBOX_READY,
		}}, nil
	}
	return nil, status.Errorf(codes.NotFound, "sandbox %q not found", req.PodSandboxId)
}

func (f *fakeRuntime) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	return &runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{{Id: "s1"}, {Id: "s2"}}}, nil
}

// StreamContainers sends every container, then waits for the client to cancel if asked to by the
// filter's label "wait".
func (f *fakeRuntime) StreamContainers(req *runtimeapi.StreamContainersRequest, srv grpc.ServerStreamingServer[runtimeapi.StreamContainersResponse]) error {
	for _, c := range f.containers {
		if err := srv.Send(&runtimeapi.StreamContainersResponse{Containers: []*runtimeapi.Container{c}}); err != nil {
			return err
		}
	}
	if req.GetFilter().GetLabelSelector()["wait"] == "" {
		return nil
	}
	<-srv.Context().Done()
	f.canceled <- "StreamContainers"
	return srv.Context().Err()
}

// GetContainerEvents must never be reached through the proxy when it has an event source.
func (f *fakeRuntime) GetContainerEvents(_ *runtimeapi.GetEventsRequest, srv grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	return srv.Send(&runtimeapi.ContainerEventResponse{ContainerId: "from-backend"})
}

type fakeImages struct {
	runtimeapi.UnimplementedImageServiceServer
}

func (fakeImages) ListImages(context.Context, *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	return &runtimeapi.ListImagesResponse{Images: []*runtimeapi.Image{
		{Id: "sha256:abc", RepoTags: []string{"registry.k8s.io/pause:3.10.2"}},
	}}, nil
}

// customService is a service no CRI build knows: Echo (unary) and Chat (bidirectional stream).
type customService interface{}

type customServer struct{}

var customDesc = grpc.ServiceDesc{
	ServiceName: "pleg.test.Custom",
	HandlerType: (*customService)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Echo",
		Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var in wrapperspb.StringValue
			if err := dec(&in); err != nil {
				return nil, err
			}
			return wrapperspb.String("echo:" + in.Value), nil
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Chat",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(_ any, ss grpc.ServerStream) error {
			for {
				var in wrapperspb.StringValue
				if err := ss.RecvMsg(&in); err == io.EOF {
					return nil
				} else if err != nil {
					return err
				}
				if err := ss.SendMsg(wrapperspb.String("re:" + in.Value)); err != nil {
					return err
				}
			}
		},
	}},
}

// backend is a fake CRI runtime on a unix socket that can be stopped and started again.
type backend struct {
	t       testing.TB
	path    string
	runtime *fakeRuntime
	// mu guards srv, nil while the backend is stopped.
	mu  sync.Mutex
	srv *grpc.Server
}

func newFakeRuntime(n int) *fakeRuntime {
	f := &fakeRuntime{canceled: make(chan string, 10)}
	for i := range n {
		f.containers = append(f.containers, &runtimeapi.Container{
			Id:           fmt.Sprintf("c%03d-0123456789abcdef0123456789abcdef0123456789abcdef0123456789", i),
			PodSandboxId: "s1",
			Metadata:     &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("ctr-%d", i), Attempt: 1},
			Image:        &runtimeapi.ImageSpec{Image: "docker.io/library/busybox:latest"},
			ImageRef:     "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			State:        runtimeapi.ContainerState_CONTAINER_RUNNING,
			CreatedAt:    time.Unix(1700000000, int64(i)).UnixNano(),
			Labels: map[string]string{
				"io.kubernetes.pod.name": "pod", "io.kubernetes.pod.namespace": "default",
				"io.kubernetes.container.name": fmt.Sprintf("ctr-%d", i), "io.kubernetes.pod.uid": "uid-1",
			},
			Annotations: map[string]string{"io.kubernetes.container.hash": "abcdef", "io.kubernetes.container.restartCount": "0"},
		})
	}
	return f
}

func startBackend(t testing.TB, path string, rt *fakeRuntime) *backend {
	t.Helper()
	b := &backend{t: t, path: path, runtime: rt}
	b.start()
	t.Cleanup(b.stop)
	return b
}

func (b *backend) start() {
	b.t.Helper()
	srv := testutil.ServeGRPC(b.t, b.path, func(srv *grpc.Server) {
		runtimeapi.RegisterRuntimeServiceServer(srv, b.runtime)
		runtimeapi.RegisterImageServiceServer(srv, fakeImages{})
		srv.RegisterService(&customDesc, customServer{})
	}, grpc.ForceServerCodec(deterministicCodec{}))
	b.mu.Lock()
	b.srv = srv
	b.mu.Unlock()
}

func (b *backend) stop() {
	b.mu.Lock()
	srv := b.srv
	b.srv = nil
	b.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

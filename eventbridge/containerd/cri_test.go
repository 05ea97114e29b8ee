package containerd

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// criRuntime is a CRI runtime with one sandbox (s1) and two containers (c1, c2), and nothing else.
type criRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (criRuntime) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{
		{Id: "c1", PodSandboxId: "s1", State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		{Id: "c2", PodSandboxId: "s1", State: runtimeapi.ContainerState_CONTAINER_EXITED},
	}}, nil
}

func (criRuntime) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	return &runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{{Id: "s1", Metadata: &runtimeapi.PodSandboxMetadata{Uid: "uid-1"}}}}, nil
}

func (criRuntime) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	switch r.ContainerId {
	case "c1", "c2":
		return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: r.ContainerId}}, nil
	case "empty":
		return &runtimeapi.ContainerStatusResponse{}, nil
	}
	return nil, status.Errorf(codes.NotFound, "container %q not found", r.ContainerId)
}

func (criRuntime) PodSandboxStatus(_ context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	if r.PodSandboxId == "s1" {
		return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: "s1", Metadata: &runtimeapi.PodSandboxMetadata{Uid: "uid-1"}}}, nil
	}
	return nil, status.Errorf(codes.NotFound, "sandbox %q not found", r.PodSandboxId)
}

// TestCRIClient: the client's answers are the runtime's, and its errors keep the runtime's gRPC code
// while satisfying errdefs' classes.
func TestCRIClient(t *testing.T) {
	path := filepath.Join(testutil.ShortTempDir(t, "ct-"), "cri.sock")
	srv := testutil.ServeGRPC(t, path, func(s *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(s, criRuntime{}) })
	conn, err := dial.CRI("unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := NewCRIClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()

	ctrs, err := c.ListContainers(ctx)
	if err != nil || len(ctrs) != 2 || ctrs[1].Id != "c2" {
		t.Fatalf("ListContainers: %v, %v", ctrs, err)
	}
	sbs, err := c.ListPodSandbox(ctx)
	if err != nil || len(sbs) != 1 {
		t.Fatalf("ListPodSandbox: %v, %v", sbs, err)
	}
	st, err := c.ContainerStatus(ctx, "c2")
	if err != nil || st.Id != "c2" {
		t.Fatalf("ContainerStatus: %v, %v", st, err)
	}
	ps, err := c.PodSandboxStatus(ctx, "s1")
	if err != nil || ps.Metadata.Uid != "uid-1" {
		t.Fatalf("PodSandboxStatus: %v, %v", ps, err)
	}
	if _, err := c.ContainerStatus(ctx, "empty"); err == nil {
		t.Error("ContainerStatus of an answer without a status: no error")
	}

	for _, err := range []error{
		func() error { _, err := c.ContainerStatus(ctx, "missing"); return err }(),
		func() error { _, err := c.PodSandboxStatus(ctx, "missing"); return err }(),
	} {
		if !errdefs.IsNotFound(err) {
			t.Errorf("errdefs.IsNotFound(%v) = false", err)
		}
		if status.Code(err) != codes.NotFound {
			t.Errorf("status.Code(%v) = %v, want NotFound", err, status.Code(err))
		}
	}

	srv.Stop()
	_, err = c.ListContainers(ctx)
	if status.Code(err) != codes.Unavailable || !errdefs.IsUnavailable(err) {
		t.Errorf("runtime down: %v (code %v), want Unavailable", err, status.Code(err))
	}
	c.ResetConnectBackoff()
}

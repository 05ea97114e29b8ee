package containerd

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/pleg"
)

// CRIClient is a CRI client of the runtime (containerd), used by the core for exact statuses and by the
// relist reconciler. Errors of its methods satisfy both errdefs.IsNotFound (and the other errdefs
// classes) and status.Code (the runtime's gRPC code is kept).
type CRIClient struct {
	conn    *grpc.ClientConn
	runtime runtimeapi.RuntimeServiceClient
}

var (
	_ pleg.StatusSource = (*CRIClient)(nil)
	_ pleg.Lister       = (*CRIClient)(nil)
)

// NewCRIClient returns a CRI client over conn (see dial.CRI), which its owner closes.
func NewCRIClient(conn *grpc.ClientConn) *CRIClient {
	return &CRIClient{conn: conn, runtime: runtimeapi.NewRuntimeServiceClient(conn)}
}

// ResetConnectBackoff makes a connection waiting out its reconnection backoff try again at once: call it
// when the runtime is known to be back.
func (c *CRIClient) ResetConnectBackoff() { c.conn.ResetConnectBackoff() }

// PodSandboxStatus returns the runtime's (non-verbose) status of a sandbox.
func (c *CRIClient) PodSandboxStatus(ctx context.Context, id string) (*runtimeapi.PodSandboxStatus, error) {
	resp, err := c.runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil {
		return nil, fmt.Errorf("failed to get status of sandbox %s: %w", id, fromGRPC(err))
	}
	if resp.GetStatus() == nil {
		return nil, fmt.Errorf("failed to get status of sandbox %s: runtime returned no status", id)
	}
	return resp.GetStatus(), nil
}

// ContainerStatus returns the runtime's (non-verbose) status of a container.
func (c *CRIClient) ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	resp, err := c.runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return nil, fmt.Errorf("failed to get status of container %s: %w", id, fromGRPC(err))
	}
	if resp.GetStatus() == nil {
		return nil, fmt.Errorf("failed to get status of container %s: runtime returned no status", id)
	}
	return resp.GetStatus(), nil
}

// ListPodSandbox lists every sandbox.
func (c *CRIClient) ListPodSandbox(ctx context.Context) ([]*runtimeapi.PodSandbox, error) {
	resp, err := c.runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("failed to list sandboxes: %w", fromGRPC(err))
	}
	return resp.GetItems(), nil
}

// ListContainers lists every container.
func (c *CRIClient) ListContainers(ctx context.Context) ([]*runtimeapi.Container, error) {
	resp, err := c.runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, fmt.Errorf("failed to list containers: %w", fromGRPC(err))
	}
	return resp.GetContainers(), nil
}

// grpcError is an error from the runtime in both forms: Unwrap gives the errdefs error (errdefs.IsNotFound
// works), GRPCStatus the original status (status.Code works).
type grpcError struct {
	native error
	st     *status.Status
}

func (e *grpcError) Error() string              { return e.native.Error() }
func (e *grpcError) Unwrap() error              { return e.native }
func (e *grpcError) GRPCStatus() *status.Status { return e.st }

// fromGRPC converts a gRPC error into a grpcError; other errors are returned as they are.
func fromGRPC(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return &grpcError{native: errgrpc.ToNative(err), st: st}
}

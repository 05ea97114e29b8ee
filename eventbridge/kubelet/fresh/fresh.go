package fresh

import (
	"context"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
)

// Config is everything the hooks are built from.
type Config struct {
	// Runtime is the runtime's connection (the endpoint's backend): the refresh after a stop asks it.
	// Required.
	Runtime *grpc.ClientConn
	// Metrics is the endpoint's; it may implement kubelet.FreshnessMetrics. nil: none.
	Metrics kubelet.Metrics
	// ReadFreshness makes the status reads (ContainerStatus, PodSandboxStatus, ListContainers,
	// ListPodSandbox) consistent with the events the endpoint sent; "" is DefaultReadFreshness. While the
	// endpoint has sent a STOPPED for an object whose status the runtime's answer still shows running,
	// ReadFreshnessOverlay answers with the stopped status that was sent. ReadFreshnessOff adds no hook.
	// Only the events served by the endpoint itself count.
	ReadFreshness ReadFreshness
	// Refresh asks the event source to send its STOPPED of an object (container or sandbox id) again,
	// stamped now, to every subscriber: the front's is corelink.Relay.RefreshStopped (the core fills it
	// from its state, in order with the pod's other events). RefreshAfterStop asks for it after a stop;
	// nil: it does not.
	Refresh func(ctx context.Context, id string) error
	// RefreshAfterStop, with Refresh, asks for the refresh after each StopContainer or StopPodSandbox
	// the runtime answered, once the client's calls about that pod have been quiet for a moment, of
	// the object stopped last (the sandbox once it was stopped; see afterstop.go), and after each
	// STOPPED of a container sent within a second of its StartContainer's answer (an early exit). Best
	// effort: an error is logged at debug level.
	RefreshAfterStop bool
	// Done ends the hooks' own calls and waits (the endpoint's stop). Required.
	Done <-chan struct{}
}

// Hooks returns the hooks of cfg for kubelet.ProxyConfig.Hooks, in the order a call goes through them:
// the refresh after a stop sees the stops the runtime answered, read freshness the runtime's answers. A
// ReadFreshness that ParseReadFreshness refuses is an error.
func Hooks(cfg Config) ([]kubelet.ReadHook, error) {
	mode, err := ParseReadFreshness(string(cfg.ReadFreshness))
	if err != nil {
		return nil, err
	}
	if cfg.Metrics == nil {
		cfg.Metrics = kubelet.NopMetrics{}
	}
	var hooks []kubelet.ReadHook
	if cfg.RefreshAfterStop && cfg.Refresh != nil {
		hooks = append(hooks, newStopRefresher(runtimeapi.NewRuntimeServiceClient(cfg.Runtime), cfg.Refresh, time.Now, cfg.Done))
	}
	if mode == ReadFreshnessOverlay {
		hooks = append(hooks, newFreshReads(cfg.Metrics, time.Now))
	}
	return hooks, nil
}

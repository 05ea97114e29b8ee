package plugin

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/log"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// The NRI requests the plugin handles; the stub subscribes to exactly these. CreateContainer, StartContainer,
// UpdateContainer and the pod update requests are left out on purpose (see convert.go).
var (
	_ stub.ConfigureInterface           = (*Plugin)(nil)
	_ stub.SynchronizeInterface         = (*Plugin)(nil)
	_ stub.ShutdownInterface            = (*Plugin)(nil)
	_ stub.RunPodInterface              = (*Plugin)(nil)
	_ stub.StopPodInterface             = (*Plugin)(nil)
	_ stub.RemovePodInterface           = (*Plugin)(nil)
	_ stub.PostCreateContainerInterface = (*Plugin)(nil)
	_ stub.PostStartContainerInterface  = (*Plugin)(nil)
	_ stub.StopContainerInterface       = (*Plugin)(nil)
	_ stub.RemoveContainerInterface     = (*Plugin)(nil)
	_ stub.PostUpdateContainerInterface = (*Plugin)(nil)
)

// Configure checks the configuration the runtime hands to a pre-registered plugin (Config.Configure;
// containerd's is the plugin's /etc/nri/conf.d file, "" when there is none). With Hold (a pre-registered
// plugin), the first configuration, accepted or refused, is handed on Configured: the daemon builds its
// core from it, or exits with its error, rather than run with a configuration nobody wrote; a refused
// one is refused to the runtime in the answer to its Synchronize (see Refuse for why not here), and the
// daemon may refuse an accepted one too while it is held (Refuse). Without Hold, a refused configuration
// is Configure's error. The plugin subscribes to every request it handles.
//
// The runtime waits for the answer only for its request timeout (NRI's default: 2 s; ctx carries it as
// its deadline), and drops a plugin that does not answer in time: Config.Configure gets a context that
// ends configureMargin before that.
func (p *Plugin) Configure(ctx context.Context, config, runtime, version string) (stub.EventMask, error) {
	entry := log.G(ctx).WithField("runtime", runtime+"/"+version)
	entry.Info("NRI plugin configured by the runtime")
	if p.cfg.Configure == nil {
		return 0, nil
	}
	ctx, cancel := configureContext(ctx, time.Now())
	defer cancel()
	var err error
	if config != "" {
		if err = p.cfg.Configure(ctx, []byte(config)); err != nil {
			entry.WithError(err).Error("invalid configuration from the runtime (NRI plugin config): refused")
			err = fmt.Errorf("invalid NRI plugin configuration: %w", err)
		}
	}
	if !p.cfg.Hold || !p.handedConfig.CompareAndSwap(false, true) {
		return 0, err
	}
	// The first configuration: hand it on (the channel's one slot: never blocks). An accepted one's
	// answer (and so the runtime's Synchronize) waits until the core is built from it, as long as the
	// runtime waits for it (ctx).
	p.configured <- Configuration{Data: []byte(config), Err: err}
	if err != nil {
		p.refuse(err)
		return 0, nil
	}
	select {
	case <-p.released:
	case <-p.refusing:
	case <-ctx.Done():
		entry.Info("answering the runtime's Configure before the core is built: its callbacks wait for it")
	}
	return 0, nil
}

// configureMargin is how long before the runtime's deadline for Configure the plugin answers at the
// latest.
const configureMargin = 250 * time.Millisecond

// configureContext returns ctx ending configureMargin before its deadline; without a deadline (a runtime
// that sets none), NRI's default request timeout from now stands for it.
func configureContext(ctx context.Context, now time.Time) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = now.Add(api.DefaultPluginRequestTimeout)
	}
	return context.WithDeadline(ctx, deadline.Add(-configureMargin))
}

// Synchronize observes every sandbox and container the runtime reports, then calls the OnSynchronized hook.
// With Hold, it first waits for Release, or answers with the refusal (Refuse).
func (p *Plugin) Synchronize(ctx context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	if p.cfg.Hold {
		select {
		case <-p.released: // released: never a refusal
		default:
			select {
			case <-p.released:
			case err := <-p.refusal:
				log.G(ctx).WithError(err).Error("refusing to start: answering the runtime's Synchronize with the error")
				defer p.sentOnce.Do(func() { close(p.refusalSent) })
				return nil, err
			}
		}
	}
	start := p.cfg.Clock()
	n := 0
	defer p.endHook(CallbackSynchronize, start, &n)

	for _, pod := range pods {
		if o, ok := ConvertPodSandbox(CallbackSynchronize, pod, start); ok {
			p.cfg.Observer.Observe(o)
			n++
		}
	}
	for _, ctr := range ctrs {
		if o, ok := ConvertContainer(CallbackSynchronize, nil, ctr, start); ok {
			p.cfg.Observer.Observe(o)
			n++
		}
	}
	log.G(ctx).WithField("pods", len(pods)).WithField("containers", len(ctrs)).Info("NRI synchronized")
	if p.cfg.OnSynchronized != nil {
		p.cfg.OnSynchronized()
	}
	return nil, nil
}

// Shutdown logs that the runtime is shutting down; the connection loop reconnects when it is back.
func (p *Plugin) Shutdown(ctx context.Context) {
	log.G(ctx).Info("runtime is shutting down NRI")
}

// RunPodSandbox observes a sandbox whose pause process has started.
func (p *Plugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.podHook(CallbackRunPodSandbox, pod)
	return nil
}

// StopPodSandbox observes a sandbox whose pause process has exited.
func (p *Plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.podHook(CallbackStopPodSandbox, pod)
	return nil
}

// RemovePodSandbox observes a removed sandbox.
func (p *Plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.podHook(CallbackRemovePodSandbox, pod)
	return nil
}

// PostCreateContainer observes a created container.
func (p *Plugin) PostCreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.containerHook(CallbackPostCreateContainer, pod, ctr)
	return nil
}

// PostStartContainer observes a started container.
func (p *Plugin) PostStartContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.containerHook(CallbackPostStartContainer, pod, ctr)
	return nil
}

// StopContainer observes a container whose process has exited; it requests no update.
func (p *Plugin) StopContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.containerHook(CallbackStopContainer, pod, ctr)
	return nil, nil
}

// RemoveContainer observes a removed container.
func (p *Plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.containerHook(CallbackRemoveContainer, pod, ctr)
	return nil
}

// PostUpdateContainer observes that containerd stored new resources for a container (an in-place resize): its
// CRI status changed.
func (p *Plugin) PostUpdateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.containerHook(CallbackPostUpdateContainer, pod, ctr)
	return nil
}

// podHook handles a sandbox callback.
func (p *Plugin) podHook(cb Callback, pod *api.PodSandbox) {
	start := p.cfg.Clock()
	n := 0
	defer p.endHook(cb, start, &n)
	if o, ok := ConvertPodSandbox(cb, pod, start); ok {
		p.cfg.Observer.Observe(o)
		n = 1
	}
}

// containerHook handles a container callback.
func (p *Plugin) containerHook(cb Callback, pod *api.PodSandbox, ctr *api.Container) {
	start := p.cfg.Clock()
	n := 0
	defer p.endHook(cb, start, &n)
	if o, ok := ConvertContainer(cb, pod, ctr, start); ok {
		p.cfg.Observer.Observe(o)
		n = 1
	}
}

// endHook records a callback's duration and observations. It is deferred by every handler and stops a panic
// there (in the observer, say): a callback never fails and never takes the daemon down.
func (p *Plugin) endHook(cb Callback, start time.Time, n *int) {
	if r := recover(); r != nil {
		log.L.WithField("callback", cb.String()).WithField("panic", r).Error("NRI callback panicked, ignored")
	}
	p.cfg.Metrics.HookDuration(cb, p.cfg.Clock().Sub(start))
	p.cfg.Metrics.Observations(cb, *n)
}

package plugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/nri/pkg/api"
)

// Defaults of Config.
const (
	DefaultPluginName = "pleg-nri"
	DefaultPluginIdx  = "10"
	DefaultSocketPath = api.DefaultSocketPath
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 5 * time.Second
	// defaultSocketPoll caps the delay between two dials of a missing or refusing NRI socket: a failed
	// dial of a unix socket costs no more than a stat.
	defaultSocketPoll = 250 * time.Millisecond
)

// Config is everything a Plugin is built from: its settings, as the daemon's flags and config file give
// them (a zero field takes its default), and what the daemon wires in (the observer, callbacks, metrics,
// clock). As every component of pleg-nri, the plugin takes one Config struct and no functional options.
type Config struct {
	// PluginName and PluginIdx are the name and the two-digit index the plugin registers with; the index
	// orders the plugins NRI calls. A pre-registered plugin (launched by the runtime) keeps the name and index
	// the runtime gave it in NRI_PLUGIN_NAME and NRI_PLUGIN_IDX.
	PluginName string
	PluginIdx  string
	// SocketPath is the runtime's NRI socket.
	SocketPath string
	// MinBackoff and MaxBackoff bound the delay between two connection attempts: it starts at MinBackoff,
	// doubles on every failed attempt up to MaxBackoff, and goes back to MinBackoff after a registration.
	// While the socket is missing or refuses connections, the delay is at most 250ms (see Plugin.Run).
	MinBackoff, MaxBackoff time.Duration

	// Observer receives the observations. Required.
	Observer Observer
	// OnSynchronized is called after every Synchronize has been observed, i.e. after every (re)connect;
	// the daemon starts a relist from it. It is called from the Synchronize callback and must not block.
	OnSynchronized func()
	// OnConnectionState is called with true when the plugin has registered with the runtime and with
	// false when that connection is gone. It must not block.
	OnConnectionState func(up bool)
	// Configure checks the configuration a runtime hands to a pre-registered plugin (its
	// /etc/nri/conf.d file; the same schema as the daemon's --config file). An error is the plugin's
	// answer to the runtime (with Hold, to its first Synchronize), which then stops the plugin (see
	// Plugin.Configure). ctx ends configureMargin before the runtime gives up on the request.
	Configure func(ctx context.Context, config []byte) error
	// Hold makes the callbacks (Observer, OnSynchronized) wait until Release: a pre-registered plugin runs
	// before the core it feeds, which is built from the configuration the runtime sends first. That first
	// configuration is then handed on Configured (with Configure's error, if it refused it), and the
	// answer to an accepted one waits for Release as long as the runtime waits for it (so that the
	// runtime's Synchronize finds the core).
	Hold bool
	// Metrics records the plugin's work; nil records nothing.
	Metrics Metrics
	// Clock stamps observations (SourceTime) and times the callbacks; nil is time.Now.
	Clock func() time.Time
}

// withDefaults returns o with its zero fields set to their defaults.
func (o Config) withDefaults() Config {
	if o.PluginName == "" {
		o.PluginName = DefaultPluginName
	}
	if o.PluginIdx == "" {
		o.PluginIdx = DefaultPluginIdx
	}
	if o.SocketPath == "" {
		o.SocketPath = DefaultSocketPath
	}
	if o.MinBackoff == 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	if o.Metrics == nil {
		o.Metrics = NopMetrics{}
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return o
}

// Validate checks o once the defaults are applied.
func (o Config) Validate() error {
	o = o.withDefaults()
	if o.Observer == nil {
		return errors.New("no observer")
	}
	if err := api.CheckPluginName(o.PluginName); err != nil {
		return fmt.Errorf("plugin-name: %w", err)
	}
	if err := api.CheckPluginIndex(o.PluginIdx); err != nil {
		return fmt.Errorf("plugin-idx: %w", err)
	}
	if o.MinBackoff < 0 || o.MaxBackoff < o.MinBackoff {
		return fmt.Errorf("invalid backoff bounds %s..%s: want 0 < min <= max", o.MinBackoff, o.MaxBackoff)
	}
	return nil
}

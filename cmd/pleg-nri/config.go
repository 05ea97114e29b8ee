package main

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
)

// daemonFlags are the daemon's flags: --config, and one per config key with its default in d.
func daemonFlags(d config.Config) []cli.Flag {
	// Local: the daemon's flags are not the commands'.
	str := func(name, usage, v string) cli.Flag {
		return &cli.StringFlag{Name: name, Usage: usage, Value: v, Local: true}
	}
	dur := func(name, usage string, v config.Duration) cli.Flag {
		return &cli.DurationFlag{Name: name, Usage: usage, Value: time.Duration(v), Local: true}
	}
	flags := []cli.Flag{
		&cli.StringFlag{Name: "config", Usage: "YAML config file (keys: the flag names)", TakesFile: true, Local: true},
		str("nri-socket", "NRI socket to dial when running as an external plugin", d.NRISocket),
		str("containerd-address", "containerd's gRPC socket (events)", d.ContainerdAddress),
		str("containerd-namespace", "containerd namespace of the CRI", d.ContainerdNamespace),
		str("runtime-endpoint", "containerd's CRI endpoint (statuses, relists, forwarded calls)", d.RuntimeEndpoint),
		str("listen", "CRI endpoint served to the kubelet", d.Listen),
		&cli.BoolFlag{Name: "allow-tcp-listen", Value: d.AllowTCPListen, Local: true,
			Usage: "allow a tcp:// listen (no authentication: whoever connects has containerd's whole API, root on the node)"},
		str("run-dir", "directory of the core's event socket and the front's control socket (default: the --listen socket's)", d.RunDir),
		str("metrics-address", "address of /metrics, /healthz and /readyz (empty disables)", d.MetricsAddress),
		dur("relist-period", "how often the reconciler relists", d.RelistPeriod),
		str("plugin-name", "NRI plugin name", d.PluginName),
		str("plugin-idx", "NRI plugin index (two digits)", d.PluginIdx),
		&cli.IntFlag{Name: "subscriber-queue", Usage: "bound of each event subscriber's queue", Value: d.SubscriberQueue, Local: true},
		dur("subscriber-stall-timeout", "disconnect an event subscriber that takes no event for this long while it has events queued (0 disables)", d.SubscriberStallTimeout),
		str("log-level", "log level: trace, debug, info, warn, error", d.LogLevel),
		str("state-dir", "directory of the checkpoint that lets a restart emit only what changed (empty disables it)", d.StateDir),
		dur("checkpoint-interval", "least time between two checkpoint writes", d.CheckpointInterval),
		dur("startup-replay", "how long after startup a new subscriber still gets every event since the start (0 disables)", d.StartupReplay),
		str("read-freshness", "status reads the runtime answers older than a sent event: overlay (answer with the sent stop) or off", d.ReadFreshness),
		dur("cache-tick", "send each pod's statuses again this often as a CREATED of its sandbox (kubelet 1.35/1.36: pod workers wait at most this long for a newer status instead of 5 s; 0 disables)", d.CacheTick),
		dur("core-grace", "end the kubelet's event stream (UNAVAILABLE: it relists) once no core has served the front for this long (0 disables)", d.CoreGrace),
		&cli.BoolFlag{Name: "refresh-after-stop", Value: d.RefreshAfterStop, Local: true,
			Usage: "send a stopped pod's STOPPED, and the STOPPED of a container that exited within 1 s of its start, again once the kubelet's calls about the pod went quiet (kubelet 1.35/1.36: terminations without the 5 s cache wait; every kubelet: init containers and jobs without a relist's wait)"},
	}
	// A retired key's flag is still taken, hidden, and ignored with the key's warning (daemonConfig).
	for _, key := range slices.Sorted(maps.Keys(config.Retired)) {
		flags = append(flags, &cli.StringFlag{Name: key, Usage: "retired, ignored: " + config.Retired[key], Hidden: true, Local: true})
	}
	return flags
}

// daemonConfig builds the daemon's configuration (config.Load) from the --config file and the flags
// cmd was given explicitly. path is the file's.
func daemonConfig(cmd *cli.Command) (cfg config.Config, path string, err error) {
	if cmd.Args().Len() > 0 {
		return config.Config{}, "", fmt.Errorf("unexpected argument %q", cmd.Args().First())
	}
	path = cmd.String("config")
	cfg, err = config.Load(path, func(key string) (any, bool) { return cmd.Value(key), cmd.IsSet(key) })
	return cfg, path, err
}

package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
)

// containerdConfig is the isolated containerd's config: every path under the environment's directory,
// CRI and NRI on, cgroupfs, and only the plugins the tests need.
var containerdConfig = template.Must(template.New("config").Parse(`version = 3
root = "{{.Dir}}/root"
state = "{{.Dir}}/state"
temp = "{{.Dir}}/tmp"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{{.Address}}"

[ttrpc]
  address = "{{.Address}}.ttrpc"

[debug]
  level = "{{.LogLevel}}"
{{- if .DebugAddress}}
  address = "{{.DebugAddress}}"

[metrics]
  address = "{{.MetricsAddress}}"
{{- end}}

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{{.Dir}}/opt"

  [plugins."io.containerd.shim.v1.manager"]
    socket_dir = "{{.ShimSocketDir}}"

  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "{{.Snapshotter}}"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "{{.PauseImage}}"
    [plugins."io.containerd.cri.v1.images".registry]
      config_path = "{{.RegistryHostsDir}}"

  [plugins."io.containerd.cri.v1.runtime"]
    enable_selinux = false
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = ["{{.Dir}}/cdi"]
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        snapshotter = "{{.Snapshotter}}"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          BinaryName = "{{.Runc}}"
          Root = "{{.Dir}}/runc"
          SystemdCgroup = false
      # The handler upstream's RuntimeClass tests ask for (e2eruntimeclass.PreconfiguredRuntimeClassHandler),
      # runc again, as kind's and upstream's node e2e containerd configurations have it.
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.test-handler]
        runtime_type = "io.containerd.runc.v2"
        snapshotter = "{{.Snapshotter}}"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.test-handler.options]
          BinaryName = "{{.Runc}}"
          Root = "{{.Dir}}/runc"
          SystemdCgroup = false
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["{{.CNIBinDir}}"]
      conf_dir = "{{.CNIConfDir}}"
      max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

{{- if .DebugAddress}}
  [plugins."io.containerd.metrics.v1.grpc-prometheus"]
    grpc_histogram = true
{{- end}}

  [plugins."io.containerd.nri.v1.nri"]
    disable = false
    socket_path = "{{.NRISocket}}"
    plugin_path = "{{.NRIPluginDir}}"
    plugin_config_path = "{{.NRIConfDir}}"
    plugin_registration_timeout = "5s"
    plugin_request_timeout = "2s"
    disable_connections = false
`))

// cniConfig is a bridge network on a private /24 with no gateway on the host: pods get an address (so
// sandbox statuses carry IPs) but nothing is routed, masqueraded or forwarded, and no host setting
// changes. With Options.HostReachable the bridge is the pods' gateway (the host and the pods reach
// each other; still nothing masqueraded).
var cniConfig = template.Must(template.New("cni").Parse(`{
  "cniVersion": "1.0.0",
  "name": "{{.NetName}}",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "{{.Bridge}}",
      "isGateway": {{.IsGateway}},
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "{{.Subnet}}"}]]
      }
    }
  ]
}
`))

// writeConfigs writes containerd's config and the CNI network config of e.
func (e *Env) writeConfigs() error {
	var b strings.Builder
	if err := containerdConfig.Execute(&b, map[string]string{
		"Dir":              e.Dir,
		"Address":          e.Address,
		"LogLevel":         e.opts.LogLevel,
		"ShimSocketDir":    e.ShimSocketDir,
		"Snapshotter":      e.Snapshotter,
		"PauseImage":       PauseImage,
		"Runc":             e.RuncPath(),
		"CNIBinDir":        e.cniBinDir(),
		"CNIConfDir":       e.CNIConfDir,
		"NRISocket":        e.NRISocket,
		"NRIPluginDir":     e.NRIPluginDir,
		"NRIConfDir":       e.NRIConfDir,
		"RegistryHostsDir": e.RegistryHostsDir(),
		"DebugAddress":     e.DebugAddress,
		"MetricsAddress":   e.MetricsAddress,
	}); err != nil {
		return err
	}
	if err := os.WriteFile(e.ConfigPath, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("failed to write containerd config: %w", err)
	}
	b.Reset()
	if err := cniConfig.Execute(&b, map[string]string{
		"NetName": e.NetName, "Bridge": e.Bridge, "Subnet": e.Subnet,
		"IsGateway": strconv.FormatBool(e.opts.HostReachable),
	}); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(e.CNIConfDir, "10-"+e.NetName+".conflist"), []byte(b.String()),
		0o644); err != nil {
		return fmt.Errorf("failed to write CNI config: %w", err)
	}
	return nil
}

// RegistryHostsDir is containerd's registry host configuration directory (config_path): a
// <registry host>/hosts.toml written there, even while containerd runs, sends that registry's pulls
// elsewhere (a local mirror). Empty at the start: every registry is reached as named.
func (e *Env) RegistryHostsDir() string { return filepath.Join(e.Dir, "certs.d") }

// RuncPath is runc's path where containerd runs: the cache's, or the image's for containerd in Docker.
func (e *Env) RuncPath() string {
	if e.Container != "" {
		return imageRunc
	}
	return filepath.Join(e.BinDir, "runc")
}

// cniBinDir is the CNI plugins' directory where containerd runs: the cache's or the image's.
func (e *Env) cniBinDir() string {
	if e.Container != "" {
		return imageCNIBinDir
	}
	return filepath.Join(e.BinDir, "cni")
}

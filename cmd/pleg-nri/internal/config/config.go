// Package config is the daemon's configuration: its keys (the --config file, a pre-registered plugin's
// NRI configuration and the flags share them), their defaults, parsing and validation.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/containerd/log"
	"github.com/containerd/nri/pkg/api"

	"github.com/pleg-nri/pleg-nri/eventbridge/containerd"
	"github.com/pleg-nri/pleg-nri/eventbridge/corelink"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/fresh"
	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/pleg"
	"github.com/pleg-nri/pleg-nri/plugin"
)

// Config is the daemon's configuration. The --config file (YAML) and the pre-registered plugin's
// Configure data use these keys; every key is also a flag of the same name.
type Config struct {
	// NRISocket is the NRI socket the plugin dials when it runs external.
	NRISocket string `json:"nri-socket"`
	// ContainerdAddress is containerd's gRPC socket, for its events service.
	ContainerdAddress string `json:"containerd-address"`
	// ContainerdNamespace is the containerd namespace of the CRI's containers.
	ContainerdNamespace string `json:"containerd-namespace"`
	// RuntimeEndpoint is containerd's CRI endpoint: statuses, relists, and every forwarded call.
	RuntimeEndpoint string `json:"runtime-endpoint"`
	// Listen is the CRI endpoint pleg-nri serves to the kubelet (through its front, package front).
	Listen string `json:"listen"`
	// AllowTCPListen lets Listen be a tcp:// address. Off, a TCP listen is refused: it has no
	// authentication, and the endpoint is containerd's whole API (root on the node).
	AllowTCPListen bool `json:"allow-tcp-listen"`
	// RunDir holds the core's event socket and the front's control socket (and the front's log when
	// it has no journal); one pleg-nri per run directory. Empty: the directory of the --listen socket
	// (/run/pleg-nri for a TCP --listen).
	RunDir string `json:"run-dir"`
	// MetricsAddress serves /metrics, /healthz and /readyz; empty disables it.
	MetricsAddress string `json:"metrics-address"`
	// RelistPeriod is how often the reconciler relists.
	RelistPeriod Duration `json:"relist-period"`
	// PluginName and PluginIdx register the NRI plugin.
	PluginName string `json:"plugin-name"`
	PluginIdx  string `json:"plugin-idx"`
	// SubscriberQueue bounds each event subscriber's queue.
	SubscriberQueue int `json:"subscriber-queue"`
	// SubscriberStallTimeout disconnects, with RESOURCE_EXHAUSTED, an event subscriber that takes no
	// event for this long while it has events queued (pleg.Config.SubscriberStallTimeout); 0 disables it.
	SubscriberStallTimeout Duration `json:"subscriber-stall-timeout"`
	// LogLevel is one of trace, debug, info, warn, error.
	LogLevel string `json:"log-level"`
	// StateDir keeps the checkpoint (what the subscribers received, so that a restart emits only what
	// changed while pleg-nri was down); empty disables it.
	StateDir string `json:"state-dir"`
	// CheckpointInterval is the least time between two checkpoint writes.
	CheckpointInterval Duration `json:"checkpoint-interval"`
	// StartupReplay is how long after its startup reconciliation a new subscriber still receives every
	// event emitted since pleg-nri started; 0 disables it.
	StartupReplay Duration `json:"startup-replay"`
	// ReadFreshness is how the CRI endpoint answers a status read that the runtime would answer with an
	// older state than an event already sent: overlay or off (fresh.ReadFreshness); hold is retired
	// (RetiredValues).
	ReadFreshness string `json:"read-freshness"`
	// RefreshAfterStop makes the CRI endpoint ask for a pod's STOPPED to be sent again once the client's
	// calls about a pod it stopped went quiet: a kubelet 1.35 or 1.36 then ends a termination step
	// without waiting for its 5 s cache tick (corelink.RefreshStoppedMethod); and the same for a
	// container that exited within a second of its start, whose STOPPED can come while the kubelet
	// still syncs the pod with the container shown running (every kubelet; issue 59).
	RefreshAfterStop bool `json:"refresh-after-stop"`
	// CacheTick, when positive, sends every CacheTick each pod's statuses as they stand in a CREATED
	// about its sandbox: a kubelet 1.35 or 1.36 writes it into its pod cache and acts on nothing, so its
	// pod workers wait at most that long for a newer status instead of its 5 s cache tick
	// (pleg.Config.CacheTick). 0 disables it.
	CacheTick Duration `json:"cache-tick"`
	// CoreGrace is how long the front keeps its clients' event streams open while no core serves its
	// events (a core killed and not restarted): then it ends them with UNAVAILABLE, so that the
	// kubelet relists (corelink.RelayConfig.CoreGrace). 0 disables it.
	CoreGrace Duration `json:"core-grace"`
}

// Default returns the configuration used for every key not set. The packages' own defaults are
// the daemon's, so that one place says each.
func Default() Config {
	return Config{
		NRISocket:              plugin.DefaultSocketPath,
		ContainerdAddress:      "/run/containerd/containerd.sock",
		ContainerdNamespace:    containerd.DefaultNamespace,
		RuntimeEndpoint:        "unix:///run/containerd/containerd.sock",
		Listen:                 "unix:///run/pleg-nri/cri.sock",
		MetricsAddress:         "127.0.0.1:9810",
		RelistPeriod:           Duration(pleg.DefaultRelistPeriod),
		PluginName:             plugin.DefaultPluginName,
		PluginIdx:              plugin.DefaultPluginIdx,
		SubscriberQueue:        pleg.DefaultSubscriberQueue,
		SubscriberStallTimeout: Duration(pleg.DefaultSubscriberStallTimeout),
		LogLevel:               "info",
		StateDir:               "/var/lib/pleg-nri",
		CheckpointInterval:     Duration(pleg.DefaultCheckpointInterval),
		StartupReplay:          Duration(time.Minute),
		ReadFreshness:          string(fresh.DefaultReadFreshness),
		CoreGrace:              Duration(corelink.DefaultCoreGrace),
	}
}

// Duration is a time.Duration written as a Go duration string ("10s", "1m30s").
type Duration time.Duration

// UnmarshalJSON parses a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("want a duration string such as \"10s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON renders the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// String renders the duration.
func (d Duration) String() string { return time.Duration(d).String() }

// Retired are the keys a release took away, each with what replaces it (docs/operations.md, "Retired
// keys"): a config that still sets one is read, with a warning, rather than refused, so that a node's
// configuration of an earlier release (a file, or containerd's NRI plugin config) keeps pleg-nri
// running after an upgrade.
var Retired = map[string]string{
	"read-source": "the kubelet's reads are always forwarded to containerd (read-source: runtime); answering them " +
		"from pleg-nri's state measured no gain end to end (docs/operations.md, \"Retired keys\")",
}

// RetiredValue is a value a release took away from a key: Now replaces it, and Note says why.
type RetiredValue struct{ Now, Note string }

// RetiredValues are, per key, the values a release took away (docs/operations.md, "Retired keys"): a
// config that still sets one gets the value that replaces it, with a warning (ReplaceRetired).
var RetiredValues = map[string]map[string]RetiredValue{
	"read-freshness": {"hold": {Now: string(fresh.ReadFreshnessOverlay), Note: "hold was no sooner than overlay on kubelet 1.36 " +
		"and later than containerd's own stream on 1.37 (docs/operations.md, \"Retired keys\")"}},
}

// ReplaceRetired replaces, with a warning, each value of c that RetiredValues lists (Parse does it for
// a file; the daemon for its flags too).
func ReplaceRetired(c *Config) {
	for key, field := range Fields(c) {
		if field.Kind() != reflect.String {
			continue
		}
		if r, ok := RetiredValues[key][field.String()]; ok {
			log.L.WithField("key", key).WithField("value", field.String()).WithField("now", r.Now).Warn("config value retired, replaced: " + r.Note)
			field.SetString(r.Now)
		}
	}
}

// Parse reads YAML (or JSON) config data over base. Unknown keys, wrong types and bad values are
// errors naming the key; a Retired key is ignored with a warning.
func Parse(data []byte, base Config) (Config, error) {
	cfg := base
	if len(bytes.TrimSpace(data)) == 0 {
		return cfg, nil
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return cfg, fmt.Errorf("invalid config: %w", err)
	}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return cfg, nil
	}
	// Decode key by key, so an error names its key.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(js, &raw); err != nil {
		return cfg, errors.New("invalid config: want a mapping of keys to values")
	}
	fields := Fields(&cfg)
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if note, ok := Retired[k]; ok {
			log.L.WithField("key", k).Warn("config key retired, ignored: " + note)
			continue
		}
		f, ok := fields[k]
		if !ok {
			return cfg, fmt.Errorf("unknown config key %q (known keys: %s)", k, strings.Join(Keys(), ", "))
		}
		if err := json.Unmarshal(raw[k], f.Addr().Interface()); err != nil {
			return cfg, fmt.Errorf("config key %q: %w", k, cleanJSONError(err))
		}
	}
	ReplaceRetired(&cfg)
	return cfg, cfg.Validate()
}

// cleanJSONError turns encoding/json's type errors into a short sentence.
func cleanJSONError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("want a %s, got a %s", te.Type, te.Value)
	}
	return err
}

// Load builds the daemon's configuration: the defaults, then the file at path (none when empty), then
// the flags given explicitly (flag says whether one was, and its value), which win over the file. A
// retired key's flag is ignored with its warning; a retired value is replaced (ReplaceRetired). The
// result is validated.
func Load(path string, flag func(key string) (v any, set bool)) (Config, error) {
	cfg := Default()
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("failed to read config: %w", err)
		}
		if cfg, err = Parse(data, cfg); err != nil {
			return Config{}, fmt.Errorf("%s: %w", path, err)
		}
	}
	for key, field := range Fields(&cfg) {
		if v, set := flag(key); set {
			field.Set(reflect.ValueOf(v).Convert(field.Type()))
		}
	}
	for key, note := range Retired {
		if _, set := flag(key); set {
			log.L.WithField("flag", "--"+key).Warn("flag retired, ignored: " + note)
		}
	}
	ReplaceRetired(&cfg)
	return cfg, cfg.Validate()
}

// Fields maps each key to its field in cfg.
func Fields(cfg *Config) map[string]reflect.Value {
	v := reflect.ValueOf(cfg).Elem()
	out := map[string]reflect.Value{}
	for i := 0; i < v.NumField(); i++ {
		out[v.Type().Field(i).Tag.Get("json")] = v.Field(i)
	}
	return out
}

// Keys lists every config key.
func Keys() []string {
	var keys []string
	for k := range Fields(&Config{}) {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// defaultRunDir is the run directory of a TCP --listen when run-dir is not set.
const defaultRunDir = "/run/pleg-nri"

// RunDirectory returns the run directory: run-dir, or the directory of the --listen socket.
func (c Config) RunDirectory() string {
	if c.RunDir != "" {
		return c.RunDir
	}
	if network, address, err := dial.ParseEndpoint(c.Listen); err == nil && network == "unix" {
		return filepath.Dir(address)
	}
	return defaultRunDir
}

// Validate checks every value; an error names the key.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config key %q: "+format, append([]any{key}, args...)...))
	}
	for key, v := range map[string]string{
		"nri-socket": c.NRISocket, "containerd-address": c.ContainerdAddress,
		"containerd-namespace": c.ContainerdNamespace, "runtime-endpoint": c.RuntimeEndpoint,
		"listen": c.Listen, "plugin-name": c.PluginName, "plugin-idx": c.PluginIdx,
	} {
		if strings.TrimSpace(v) == "" {
			bad(key, "must not be empty")
		}
	}
	if c.RelistPeriod <= 0 {
		bad("relist-period", "must be a positive duration, got %s", c.RelistPeriod)
	} else if time.Duration(c.RelistPeriod) < 100*time.Millisecond {
		bad("relist-period", "must be at least 100ms, got %s", c.RelistPeriod)
	}
	if c.SubscriberQueue < 1 {
		bad("subscriber-queue", "must be at least 1, got %d", c.SubscriberQueue)
	}
	if c.SubscriberStallTimeout < 0 || (c.SubscriberStallTimeout > 0 && time.Duration(c.SubscriberStallTimeout) < time.Second) {
		bad("subscriber-stall-timeout", "must be 0 (off) or at least 1s, got %s", c.SubscriberStallTimeout)
	}
	if c.RunDir != "" && !filepath.IsAbs(c.RunDir) {
		bad("run-dir", "must be an absolute path (or empty for the --listen socket's directory), got %q", c.RunDir)
	}
	if c.StateDir != "" && !filepath.IsAbs(c.StateDir) {
		bad("state-dir", "must be an absolute path (or empty to disable the checkpoint), got %q", c.StateDir)
	}
	if time.Duration(c.CheckpointInterval) < 10*time.Millisecond {
		bad("checkpoint-interval", "must be at least 10ms, got %s", c.CheckpointInterval)
	}
	if c.CacheTick < 0 || (c.CacheTick > 0 && time.Duration(c.CacheTick) < 100*time.Millisecond) {
		bad("cache-tick", "must be 0 (off) or at least 100ms, got %s", c.CacheTick)
	}
	if c.CoreGrace < 0 || (c.CoreGrace > 0 && time.Duration(c.CoreGrace) < time.Second) {
		bad("core-grace", "must be 0 (off) or at least 1s, got %s", c.CoreGrace)
	}
	if c.StartupReplay < 0 {
		bad("startup-replay", "must not be negative (0 disables it), got %s", c.StartupReplay)
	}
	if c.PluginIdx != "" && api.CheckPluginIndex(c.PluginIdx) != nil {
		bad("plugin-idx", "must be two digits (00-99), got %q", c.PluginIdx)
	}
	if _, err := fresh.ParseReadFreshness(c.ReadFreshness); err != nil || c.ReadFreshness == "" {
		bad("read-freshness", "want overlay or off, got %q", c.ReadFreshness)
	}
	switch c.LogLevel {
	case "trace", "debug", "info", "warn", "warning", "error":
	default:
		bad("log-level", "want trace, debug, info, warn or error, got %q", c.LogLevel)
	}
	if c.MetricsAddress != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddress); err != nil {
			bad("metrics-address", "want host:port: %v", err)
		}
	}
	if network, _, err := dial.ParseEndpoint(c.Listen); err == nil && network == "tcp" && !c.AllowTCPListen {
		bad("listen", "a TCP endpoint (%s) is refused unless allow-tcp-listen is true: it has no authentication, and whoever connects has containerd's whole API (root on the node)", c.Listen)
	}
	for _, key := range []string{"runtime-endpoint", "listen"} {
		if _, _, err := dial.ParseEndpoint(map[string]string{"runtime-endpoint": c.RuntimeEndpoint, "listen": c.Listen}[key]); err != nil {
			bad(key, "%v", err)
		}
	}
	if _, err := dial.UnixSocketPath(c.ContainerdAddress); err != nil {
		bad("containerd-address", "%v", err)
	}
	return errors.Join(errs...)
}

// ChangedKeys lists the keys whose values differ between a and b.
func ChangedKeys(a, b Config) []string {
	fa, fb := Fields(&a), Fields(&b)
	var out []string
	for k, v := range fa {
		if !reflect.DeepEqual(v.Interface(), fb[k].Interface()) {
			out = append(out, k)
		}
	}
	return out
}

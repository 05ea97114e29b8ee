// Package kubeletconfig points a kubelet's configuration at a CRI endpoint and sets its EventedPLEG
// gate: the KubeletConfiguration file, and kubeadm's kubelet flags file where it names the endpoint.
package kubeletconfig

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"

	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/internal/atomicfile"
)

// Edit is what `pleg-nri kubelet-config` changes in a kubelet's settings.
type Edit struct {
	// Endpoint is the containerRuntimeEndpoint to set; empty leaves it.
	Endpoint string
	// EventedPLEG sets the EventedPLEG gate to "true" or "false", or removes it ("remove"); empty
	// leaves it.
	EventedPLEG string
}

// EditConfig applies e to a KubeletConfiguration file's YAML and says whether it changed. The
// file is rewritten with its keys sorted; comments are not kept (kubeadm writes none).
func EditConfig(data []byte, e Edit) ([]byte, bool, error) {
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return nil, false, fmt.Errorf("not a kubelet configuration: %w", err)
	}
	if cfg == nil {
		cfg = map[string]any{}
	}
	if k, _ := cfg["kind"].(string); k != "" && k != "KubeletConfiguration" {
		return nil, false, fmt.Errorf("kind is %q, want KubeletConfiguration", k)
	}
	changed := false
	if e.Endpoint != "" && cfg["containerRuntimeEndpoint"] != e.Endpoint {
		cfg["containerRuntimeEndpoint"] = e.Endpoint
		changed = true
	}
	gates, _ := cfg["featureGates"].(map[string]any)
	switch e.EventedPLEG {
	case "":
	case "remove":
		if _, ok := gates["EventedPLEG"]; ok {
			delete(gates, "EventedPLEG")
			if len(gates) == 0 {
				delete(cfg, "featureGates")
			}
			changed = true
		}
	case "true", "false":
		want := e.EventedPLEG == "true"
		if gates == nil {
			gates = map[string]any{}
			cfg["featureGates"] = gates
		}
		if v, ok := gates["EventedPLEG"].(bool); !ok || v != want {
			gates["EventedPLEG"] = want
			changed = true
		}
	default:
		return nil, false, fmt.Errorf("EventedPLEG: want true, false or remove, got %q", e.EventedPLEG)
	}
	if !changed {
		return data, false, nil
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, false, fmt.Errorf("failed to encode the kubelet configuration: %w", err)
	}
	return out, true, nil
}

// runtimeEndpointFlag is the kubelet's --container-runtime-endpoint flag with its value, as kubeadm
// writes it in kubeadm-flags.env.
var runtimeEndpointFlag = regexp.MustCompile(`--container-runtime-endpoint[= ]("[^"]*"|[^\s"]+)`)

// EditKubeadmFlags sets the value of --container-runtime-endpoint in a kubeadm-flags.env, where it
// is (flags win over the configuration file), and says whether it changed. A file without the flag is
// left as it is.
func EditKubeadmFlags(data []byte, endpoint string) ([]byte, bool) {
	if endpoint == "" || !runtimeEndpointFlag.Match(data) {
		return data, false
	}
	out := runtimeEndpointFlag.ReplaceAll(data, []byte("--container-runtime-endpoint="+endpoint))
	return out, !bytes.Equal(out, data)
}

// Apply applies e to the kubelet's configuration file config and kubeadm's flags file flags (missing is
// fine), each replaced atomically only when it changes, and says whether anything changed.
func Apply(config, flags string, e Edit) (changed bool, err error) {
	data, err := os.ReadFile(config)
	if err != nil {
		return false, fmt.Errorf("--config: %w", err)
	}
	out, changed, err := EditConfig(data, e)
	if err != nil {
		return false, fmt.Errorf("%s: %w", config, err)
	}
	if changed {
		if err := atomicfile.WriteFile(config, out, 0o644); err != nil {
			return false, fmt.Errorf("failed to write %s: %w", config, err)
		}
	}
	if fdata, err := os.ReadFile(flags); err == nil {
		if fout, fchanged := EditKubeadmFlags(fdata, e.Endpoint); fchanged {
			if err := atomicfile.WriteFile(flags, fout, 0o644); err != nil {
				return changed, fmt.Errorf("failed to write %s: %w", flags, err)
			}
			changed = true
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return changed, fmt.Errorf("--kubeadm-flags: %w", err)
	}
	return changed, nil
}

// Check says how the kubelet's configuration file config and kubeadm's flags file flags (missing is
// fine) differ from what Apply with e would make them, one line per difference (none: they are as e
// wants): a drift, such as `kubeadm upgrade node` rewriting the configuration from its ConfigMap. It
// writes nothing.
func Check(config, flags string, e Edit) (drift []string, err error) {
	data, err := os.ReadFile(config)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	if _, changed, err := EditConfig(data, e); err != nil {
		return nil, fmt.Errorf("%s: %w", config, err)
	} else if changed {
		var cfg map[string]any
		_ = yaml.Unmarshal(data, &cfg)
		if e.Endpoint != "" && cfg["containerRuntimeEndpoint"] != e.Endpoint {
			drift = append(drift, fmt.Sprintf("%s: containerRuntimeEndpoint is %v, want %s", config, orNone(cfg["containerRuntimeEndpoint"]), e.Endpoint))
		}
		gates, _ := cfg["featureGates"].(map[string]any)
		if g, ok := gates["EventedPLEG"]; e.EventedPLEG == "remove" && ok {
			drift = append(drift, fmt.Sprintf("%s: featureGates.EventedPLEG is %v, want it unset", config, g))
		} else if e.EventedPLEG == "true" || e.EventedPLEG == "false" {
			if v, isBool := g.(bool); !isBool || fmt.Sprint(v) != e.EventedPLEG {
				drift = append(drift, fmt.Sprintf("%s: featureGates.EventedPLEG is %v, want %s", config, orNone(g), e.EventedPLEG))
			}
		}
	}
	if fdata, err := os.ReadFile(flags); err == nil {
		if _, fchanged := EditKubeadmFlags(fdata, e.Endpoint); fchanged {
			m := runtimeEndpointFlag.FindSubmatch(fdata)
			drift = append(drift, fmt.Sprintf("%s: --container-runtime-endpoint is %s, want %s", flags, m[1], e.Endpoint))
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("--kubeadm-flags: %w", err)
	}
	return drift, nil
}

// orNone prints an absent value as "unset".
func orNone(v any) any {
	if v == nil {
		return "unset"
	}
	return v
}

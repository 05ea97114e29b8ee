package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"

	"sigs.k8s.io/yaml"

	"github.com/urfave/cli/v3"

	"github.com/pleg-nri/pleg-nri/internal/atomicfile"
)

// kubeletEdit is what `pleg-nri kubelet-config` changes in a kubelet's settings.
type kubeletEdit struct {
	// endpoint is the containerRuntimeEndpoint to set; empty leaves it.
	endpoint string
	// eventedPLEG sets the EventedPLEG gate to "true" or "false", or removes it ("remove"); empty
	// leaves it.
	eventedPLEG string
}

// editKubeletConfig applies e to a KubeletConfiguration file's YAML and says whether it changed. The
// file is rewritten with its keys sorted; comments are not kept (kubeadm writes none).
func editKubeletConfig(data []byte, e kubeletEdit) ([]byte, bool, error) {
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
	if e.endpoint != "" && cfg["containerRuntimeEndpoint"] != e.endpoint {
		cfg["containerRuntimeEndpoint"] = e.endpoint
		changed = true
	}
	gates, _ := cfg["featureGates"].(map[string]any)
	switch e.eventedPLEG {
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
		want := e.eventedPLEG == "true"
		if gates == nil {
			gates = map[string]any{}
			cfg["featureGates"] = gates
		}
		if v, ok := gates["EventedPLEG"].(bool); !ok || v != want {
			gates["EventedPLEG"] = want
			changed = true
		}
	default:
		return nil, false, fmt.Errorf("EventedPLEG: want true, false or remove, got %q", e.eventedPLEG)
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

// editKubeadmFlags sets the value of --container-runtime-endpoint in a kubeadm-flags.env, where it
// is (flags win over the configuration file), and says whether it changed. A file without the flag is
// left as it is.
func editKubeadmFlags(data []byte, endpoint string) ([]byte, bool) {
	if endpoint == "" || !runtimeEndpointFlag.Match(data) {
		return data, false
	}
	out := runtimeEndpointFlag.ReplaceAll(data, []byte("--container-runtime-endpoint="+endpoint))
	return out, !bytes.Equal(out, data)
}

// kubeletConfigCommand is `pleg-nri kubelet-config`: point a kubelet's configuration (and kubeadm's
// flags file, where it sets the endpoint) at a CRI endpoint and set its EventedPLEG gate. It prints
// "changed" or "unchanged", so that a caller restarts the kubelet only when needed. The Helm chart's
// node script runs it; an operator can too.
func kubeletConfigCommand() *cli.Command {
	return &cli.Command{
		Name:      "kubelet-config",
		Usage:     "point a kubelet's configuration at pleg-nri and set its EventedPLEG gate; prints changed or unchanged",
		UsageText: "pleg-nri kubelet-config [flags]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Value: "/var/lib/kubelet/config.yaml", TakesFile: true,
				Usage: "the kubelet's configuration file (KubeletConfiguration)"},
			&cli.StringFlag{Name: "kubeadm-flags", Value: "/var/lib/kubelet/kubeadm-flags.env", TakesFile: true,
				Usage: "kubeadm's kubelet flags file, whose --container-runtime-endpoint (if any) is changed too; missing is fine"},
			&cli.StringFlag{Name: "container-runtime-endpoint", Usage: "set containerRuntimeEndpoint to this (e.g. " + DefaultConfig().Listen + ")"},
			&cli.StringFlag{Name: "evented-pleg", Usage: "set the EventedPLEG feature gate: true, false, or remove"},
		},
		OnUsageError: onUsageError,
		Action: func(_ context.Context, cmd *cli.Command) error {
			if cmd.Args().Len() > 0 {
				return usageError{fmt.Errorf("unexpected argument %q", cmd.Args().First())}
			}
			e := kubeletEdit{endpoint: cmd.String("container-runtime-endpoint"), eventedPLEG: cmd.String("evented-pleg")}
			return editKubelet(cmd.String("config"), cmd.String("kubeadm-flags"), e, cmd.Root().Writer)
		},
	}
}

// runKubeletConfig runs `pleg-nri kubelet-config` with args (after "kubelet-config").
func runKubeletConfig(args []string, stdout, stderr io.Writer) error {
	cmd := kubeletConfigCommand()
	cmd.Writer, cmd.ErrWriter = stdout, stderr
	return cmd.Run(context.Background(), append([]string{"kubelet-config"}, args...))
}

// editKubelet applies e to the kubelet's configuration file config and kubeadm's flags file flags, and
// prints whether anything changed.
func editKubelet(config, flags string, e kubeletEdit, stdout io.Writer) error {
	data, err := os.ReadFile(config)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	out, changed, err := editKubeletConfig(data, e)
	if err != nil {
		return fmt.Errorf("%s: %w", config, err)
	}
	if changed {
		if err := atomicfile.WriteFile(config, out, 0o644); err != nil {
			return fmt.Errorf("failed to write %s: %w", config, err)
		}
	}
	if fdata, err := os.ReadFile(flags); err == nil {
		if fout, fchanged := editKubeadmFlags(fdata, e.endpoint); fchanged {
			if err := atomicfile.WriteFile(flags, fout, 0o644); err != nil {
				return fmt.Errorf("failed to write %s: %w", flags, err)
			}
			changed = true
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("--kubeadm-flags: %w", err)
	}
	fmt.Fprintln(stdout, map[bool]string{true: "changed", false: "unchanged"}[changed])
	return nil
}

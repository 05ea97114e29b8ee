// Package kubeletconfig points a kubelet's configuration at a CRI endpoint, its image service at
// another (containerd's own, so that image calls do not cross pleg-nri) and sets its EventedPLEG gate:
// the KubeletConfiguration file, and kubeadm's kubelet flags file where it names the endpoint.
package kubeletconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/internal/atomicfile"
)

// Edit is what `pleg-nri kubelet-config` changes in a kubelet's settings.
type Edit struct {
	// Endpoint is the containerRuntimeEndpoint to set; empty leaves it.
	Endpoint string
	// ImageEndpoint is the imageServiceEndpoint to set (containerd's socket: without it the kubelet
	// sends its image calls to containerRuntimeEndpoint, through pleg-nri); "remove" removes it;
	// "restore" (Apply and Check only) puts back what Record holds; empty leaves it.
	ImageEndpoint string
	// EventedPLEG sets the EventedPLEG gate to "true" or "false", or removes it ("remove"); empty
	// leaves it.
	EventedPLEG string
	// Record, if not empty, is a file that keeps the kubelet's imageServiceEndpoint from before the
	// switch: Apply setting ImageEndpoint writes it first unless it holds one already (a switch
	// applied again keeps the first), and ImageEndpoint "restore" puts that back and removes the file.
	// A missing or empty file holds none: restoring from it leaves imageServiceEndpoint as it is.
	// A switch through the drop-in directory (DropinDir) records its files there too, and needs it.
	Record string
	// DropinDir, if not empty, switches the kubelet through its drop-in configuration directory
	// (--config-dir; the kubelet's path) instead of editing its configuration file in place: Apply
	// writes DropinName there and adds --config-dir to kubeadm's flags file, Check reads the merged
	// configuration (dropin.go). "restore" undoes whichever switch Record holds, with or without it.
	DropinDir string
	// HostRoot is where the kubelet's / is (the drop-in directory is under it; the configuration and
	// flags files are given with it already); empty: /.
	HostRoot string
}

// record is what Edit.Record holds: the kubelet's imageServiceEndpoint before the switch, in the
// configuration file and in kubeadm's flags file, each nil where it was absent.
type record struct {
	Config *string `json:"imageServiceEndpoint"`
	Flag   *string `json:"kubeadmFlagImageServiceEndpoint"`
	// DropinFile is the drop-in written by a switch through the drop-in directory, as the kubelet
	// names it; empty: a switch in place (the fields above).
	DropinFile string `json:"dropinFile,omitempty"`
	// Dropin is what DropinFile held before the switch; nil: it did not exist.
	Dropin *string `json:"dropin,omitempty"`
	// KubeadmFlags is kubeadm's flags file before the switch through the drop-in directory.
	KubeadmFlags *string `json:"kubeadmFlags,omitempty"`
	// KubeadmFlagsSwitched is kubeadm's flags file as the switch (or its last re-apply) left it: the
	// undo restores KubeadmFlags byte for byte only while the file is still so (undoDropin).
	KubeadmFlagsSwitched *string `json:"kubeadmFlagsSwitched,omitempty"`
	// DropinDirCreated says the switch made the drop-in directory (the undo removes it if empty).
	DropinDirCreated bool `json:"dropinDirCreated,omitempty"`
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
	switch e.ImageEndpoint {
	case "":
	case "remove":
		if _, ok := cfg["imageServiceEndpoint"]; ok {
			delete(cfg, "imageServiceEndpoint")
			changed = true
		}
	case "restore":
		return nil, false, errors.New(`imageServiceEndpoint: "restore" needs a record (Apply)`)
	default:
		if cfg["imageServiceEndpoint"] != e.ImageEndpoint {
			cfg["imageServiceEndpoint"] = e.ImageEndpoint
			changed = true
		}
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

// imageEndpointFlag is the kubelet's --image-service-endpoint flag with its value and the blank before
// it (removed with it).
var imageEndpointFlag = regexp.MustCompile(`([ \t]?)--image-service-endpoint[= ]("[^"]*"|[^\s"]+)`)

// EditKubeadmFlags sets the value of --container-runtime-endpoint in a kubeadm-flags.env, where it
// is (flags win over the configuration file), and of --image-service-endpoint: where the file has it,
// or else right after --container-runtime-endpoint; image "remove" removes it, empty leaves it. It
// says whether the file changed. A file with neither flag is left as it is.
func EditKubeadmFlags(data []byte, endpoint, image string) ([]byte, bool) {
	out := data
	if endpoint != "" {
		out = runtimeEndpointFlag.ReplaceAllLiteral(out, []byte("--container-runtime-endpoint="+endpoint))
	}
	switch {
	case image == "":
	case image == "remove":
		out = imageEndpointFlag.ReplaceAllLiteral(out, nil)
	case imageEndpointFlag.Match(out):
		out = imageEndpointFlag.ReplaceAllFunc(out, func(m []byte) []byte {
			blank := imageEndpointFlag.FindSubmatch(m)[1]
			return append(append([]byte{}, blank...), "--image-service-endpoint="+image...)
		})
	default:
		if loc := runtimeEndpointFlag.FindIndex(out); loc != nil {
			out = append(append(append([]byte{}, out[:loc[1]]...), " --image-service-endpoint="+image...), out[loc[1]:]...)
		}
	}
	return out, !bytes.Equal(out, data)
}

// flagValue is the value of the flag re matches in data (its quotes taken off), nil where it is
// absent.
func flagValue(re *regexp.Regexp, data []byte) *string {
	m := re.FindSubmatch(data)
	if m == nil {
		return nil
	}
	v := strings.Trim(string(m[len(m)-1]), `"`)
	return &v
}

// readFlags reads kubeadm's flags file; missing is nil data.
func readFlags(flags string) ([]byte, error) {
	data, err := os.ReadFile(flags)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("--kubeadm-flags: %w", err)
	}
	return data, nil
}

// readRecord reads what e.Record holds; nil: none (no file, or an empty one).
func readRecord(path string) (*record, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(bytes.TrimSpace(data)) == 0) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the record of imageServiceEndpoint: %w", err)
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("the record of imageServiceEndpoint %s: %w", path, err)
	}
	return &r, nil
}

// imageEdits resolves e.ImageEndpoint into the edits of the configuration and of the flags file
// ("restore": from e.Record, each "remove" where the record says absent) and says whether it restores
// from a record.
func imageEdits(e Edit) (config, flag string, restoring bool, err error) {
	if e.ImageEndpoint != "restore" {
		return e.ImageEndpoint, e.ImageEndpoint, false, nil
	}
	if e.Record == "" {
		return "", "", false, errors.New(`imageServiceEndpoint "restore" needs a record file`)
	}
	r, err := readRecord(e.Record)
	if err != nil || r == nil {
		return "", "", false, err
	}
	config, flag = "remove", "remove"
	if r.Config != nil {
		config = *r.Config
	}
	if r.Flag != nil {
		flag = *r.Flag
	}
	return config, flag, true, nil
}

// keepRecord writes the imageServiceEndpoint of config (a configuration's YAML) and of flags (kubeadm's
// flags file, nil if missing) to path, unless path holds a record already.
func keepRecord(path string, config, flags []byte) error {
	if r, err := readRecord(path); err != nil || r != nil {
		return err
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(config, &cfg); err != nil {
		return fmt.Errorf("not a kubelet configuration: %w", err)
	}
	var r record
	if v, ok := cfg["imageServiceEndpoint"]; ok {
		s := fmt.Sprint(v)
		r.Config = &s
	}
	r.Flag = flagValue(imageEndpointFlag, flags)
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("failed to record imageServiceEndpoint: %w", err)
	}
	if err := atomicfile.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("failed to record imageServiceEndpoint: %w", err)
	}
	return nil
}

// inputs are what Apply and Check start from: the kubelet's configuration file and kubeadm's flags
// file as they are, and the image service endpoint that e asks of each (imageEdits).
type inputs struct {
	// config is the configuration file's path, data its content; flags is the flags file's content
	// (nil: there is none).
	config      string
	data, flags []byte
	e           Edit
	// image and flagImage are the image endpoints asked of the configuration and of the flags file;
	// restoring says they come from e.Record.
	image, flagImage string
	restoring        bool
}

// readInputs reads the files of Apply and Check and resolves e's image endpoint.
func readInputs(config, flags string, e Edit) (inputs, error) {
	in := inputs{config: config, e: e}
	var err error
	if in.data, err = os.ReadFile(config); err != nil {
		return in, fmt.Errorf("--config: %w", err)
	}
	if in.flags, err = readFlags(flags); err != nil {
		return in, err
	}
	if in.image, in.flagImage, in.restoring, err = imageEdits(e); err != nil {
		return in, err
	}
	return in, nil
}

// edited is the configuration file as e makes it (EditConfig), and whether that changes it.
func (in inputs) edited() (out []byte, changed bool, err error) {
	ce := in.e
	ce.ImageEndpoint = in.image
	if out, changed, err = EditConfig(in.data, ce); err != nil {
		return nil, false, fmt.Errorf("%s: %w", in.config, err)
	}
	return out, changed, nil
}

// Apply applies e to the kubelet's configuration file config and kubeadm's flags file flags (missing is
// fine), each replaced atomically only when it changes, and says whether anything changed. With
// e.DropinDir it switches through the drop-in directory instead (applyDropin); ImageEndpoint "restore"
// undoes a switch through the drop-in directory where e.Record holds one, whatever e.DropinDir is.
func Apply(config, flags string, e Edit) (changed bool, err error) {
	if e.ImageEndpoint == "restore" && e.Record != "" {
		r, err := readRecord(e.Record)
		if err != nil {
			return false, err
		}
		if r != nil && r.DropinFile != "" {
			return undoDropin(flags, e, r)
		}
	} else if e.DropinDir != "" {
		return applyDropin(flags, e, e.ImageEndpoint)
	}
	in, err := readInputs(config, flags, e)
	if err != nil {
		return false, err
	}
	data, fdata, image, flagImage, restoring := in.data, in.flags, in.image, in.flagImage, in.restoring
	out, changed, err := in.edited()
	if err != nil {
		return false, err
	}
	if e.Record != "" && image != "" && image != "remove" && !restoring {
		if err := keepRecord(e.Record, data, fdata); err != nil {
			return false, err
		}
	}
	if changed {
		if err := atomicfile.WriteFile(config, out, 0o644); err != nil {
			return false, fmt.Errorf("failed to write %s: %w", config, err)
		}
	}
	if fdata != nil {
		if fout, fchanged := EditKubeadmFlags(fdata, e.Endpoint, flagImage); fchanged {
			if err := atomicfile.WriteFile(flags, fout, 0o644); err != nil {
				return changed, fmt.Errorf("failed to write %s: %w", flags, err)
			}
			changed = true
		}
	}
	if restoring {
		if err := os.Remove(e.Record); err != nil && !errors.Is(err, os.ErrNotExist) {
			return changed, fmt.Errorf("failed to remove the record of imageServiceEndpoint: %w", err)
		}
	}
	return changed, nil
}

// Check says how the kubelet's configuration file config and kubeadm's flags file flags (missing is
// fine) differ from what Apply with e would make them, one line per difference (none: they are as e
// wants): a drift, such as `kubeadm upgrade node` rewriting the configuration from its ConfigMap. With
// e.DropinDir it checks the kubelet's effective configuration: config.yaml with the drop-ins of its
// --config-dir (checkDropin). It writes nothing.
func Check(config, flags string, e Edit) (drift []string, err error) {
	if e.DropinDir != "" {
		image, flagImage, _, err := imageEdits(e)
		if err != nil {
			return nil, err
		}
		return checkDropin(config, flags, e, image, flagImage)
	}
	in, err := readInputs(config, flags, e)
	if err != nil {
		return nil, err
	}
	if _, _, err := in.edited(); err != nil {
		return nil, err
	}
	var cfg map[string]any
	_ = yaml.Unmarshal(in.data, &cfg)
	drift = settingsDrift(config, cfg, e, in.image)
	return append(drift, flagsDrift(flags, in.flags, e, in.flagImage)...), nil
}

// settingsDrift says how the kubelet configuration cfg (read from where) differs from e's settings,
// image being the imageServiceEndpoint wanted ("remove": unset; empty: any).
func settingsDrift(where string, cfg map[string]any, e Edit, image string) (drift []string) {
	if e.Endpoint != "" && cfg["containerRuntimeEndpoint"] != e.Endpoint {
		drift = append(drift, fmt.Sprintf("%s: containerRuntimeEndpoint is %v, want %s", where, orNone(cfg["containerRuntimeEndpoint"]), e.Endpoint))
	}
	if v, ok := cfg["imageServiceEndpoint"]; image == "remove" && ok {
		drift = append(drift, fmt.Sprintf("%s: imageServiceEndpoint is %v, want it unset", where, v))
	} else if image != "" && image != "remove" && v != image {
		drift = append(drift, fmt.Sprintf("%s: imageServiceEndpoint is %v, want %s", where, orNone(v), image))
	}
	gates, _ := cfg["featureGates"].(map[string]any)
	if g, ok := gates["EventedPLEG"]; e.EventedPLEG == "remove" && ok {
		drift = append(drift, fmt.Sprintf("%s: featureGates.EventedPLEG is %v, want it unset", where, g))
	} else if e.EventedPLEG == "true" || e.EventedPLEG == "false" {
		if v, isBool := g.(bool); !isBool || fmt.Sprint(v) != e.EventedPLEG {
			drift = append(drift, fmt.Sprintf("%s: featureGates.EventedPLEG is %v, want %s", where, orNone(g), e.EventedPLEG))
		}
	}
	return drift
}

// flagsDrift says how kubeadm's flags file fdata (read from flags; nil: missing) differs from e's
// endpoint flags, where it sets them (flags win over every configuration file).
func flagsDrift(flags string, fdata []byte, e Edit, flagImage string) (drift []string) {
	if fdata == nil {
		return nil
	}
	if _, fchanged := EditKubeadmFlags(fdata, e.Endpoint, ""); fchanged {
		drift = append(drift, fmt.Sprintf("%s: --container-runtime-endpoint is %s, want %s", flags, *flagValue(runtimeEndpointFlag, fdata), e.Endpoint))
	}
	if _, fchanged := EditKubeadmFlags(fdata, "", flagImage); fchanged {
		want := flagImage
		if want == "remove" {
			want = "it unset"
		}
		is := "unset"
		if v := flagValue(imageEndpointFlag, fdata); v != nil {
			is = *v
		}
		drift = append(drift, fmt.Sprintf("%s: --image-service-endpoint is %s, want %s", flags, is, want))
	}
	return drift
}

// orNone prints an absent value as "unset".
func orNone(v any) any {
	if v == nil {
		return "unset"
	}
	return v
}

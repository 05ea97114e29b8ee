package kubeletconfig

// The switch through the kubelet's drop-in configuration directory (--config-dir, KEP-3983, GA in
// 1.35; issue 60). `kubeadm upgrade node` rewrites /var/lib/kubelet/config.yaml from the kubelet-config
// ConfigMap (cmd/kubeadm/app/cmd/phases/upgrade/node/kubeletconfig.go: the old file is moved away and
// kubeletphase.WriteConfigToDisk writes a new one) and leaves kubeadm-flags.env and any drop-in alone.
// A kubelet started with --config-dir merges every *.conf under it over config.yaml, walking the
// directory in lexical order, each file a JSON merge patch (cmd/kubelet/app/server.go,
// mergeKubeletConfigurations); command-line flags still win over both. So the switch writes its
// settings to a drop-in late in that order and adds --config-dir to kubeadm's flags file: both outlive
// a kubeadm upgrade. Everything it changes is recorded first, and the undo puts the files back byte for
// byte.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/internal/atomicfile"
)

// DropinName is the name of the switch's drop-in in the kubelet's configuration directory: a high
// prefix, so that it is merged after (and wins over) the usual lower-numbered drop-ins.
const DropinName = "90-pleg-nri.conf"

// configDirFlag is the kubelet's --config-dir flag with its value.
var configDirFlag = regexp.MustCompile(`--config-dir[= ]("[^"]*"|[^\s"]+)`)

// kubeadmArgs is the KUBELET_KUBEADM_ARGS line of a kubeadm-flags.env, its value's closing quote
// in the second group.
var kubeadmArgs = regexp.MustCompile(`(?m)^(KUBELET_KUBEADM_ARGS="[^"\n]*)(")`)

// DropinContent is the drop-in of a switch by e: a KubeletConfiguration fragment with what the switch
// in place sets (e.ImageEndpoint "", "remove" or "restore": no imageServiceEndpoint; e.EventedPLEG ""
// or "remove": no gate).
func DropinContent(e Edit) []byte {
	var b bytes.Buffer
	b.WriteString("# Written by pleg-nri kubelet-config --dropin-dir: the kubelet on pleg-nri's endpoint, merged over\n" +
		"# config.yaml (which kubeadm upgrade node rewrites) by the kubelet's --config-dir. The undo removes it.\n" +
		"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")
	if e.Endpoint != "" {
		fmt.Fprintf(&b, "containerRuntimeEndpoint: %s\n", strconv.Quote(e.Endpoint))
	}
	switch e.ImageEndpoint {
	case "", "remove", "restore":
	default:
		fmt.Fprintf(&b, "imageServiceEndpoint: %s\n", strconv.Quote(e.ImageEndpoint))
	}
	if e.EventedPLEG == "true" || e.EventedPLEG == "false" {
		fmt.Fprintf(&b, "featureGates:\n  EventedPLEG: %s\n", e.EventedPLEG)
	}
	return b.Bytes()
}

// ConfigDir is the value of the kubelet's --config-dir in a kubeadm-flags.env, nil where it has none.
func ConfigDir(flags []byte) *string { return flagValue(configDirFlag, flags) }

// AddConfigDir adds --config-dir=dir to the KUBELET_KUBEADM_ARGS of a kubeadm-flags.env (a new line
// where it has none) and says whether it changed; a file with a --config-dir already is left as it is.
func AddConfigDir(flags []byte, dir string) ([]byte, bool) {
	if ConfigDir(flags) != nil {
		return flags, false
	}
	if kubeadmArgs.Match(flags) {
		return kubeadmArgs.ReplaceAllFunc(flags, func(m []byte) []byte {
			sm := kubeadmArgs.FindSubmatch(m)
			sep := " "
			if bytes.HasSuffix(sm[1], []byte(`"`)) {
				sep = ""
			}
			return append(append(append([]byte{}, sm[1]...), sep+"--config-dir="+dir...), '"')
		}), true
	}
	out := append([]byte{}, flags...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, `KUBELET_KUBEADM_ARGS="--config-dir=`+dir+"\"\n"...), true
}

// readOptional reads path; missing is nil.
func readOptional(path string) (*string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s := string(data)
	return &s, nil
}

// kubeletConfigDir is the drop-in directory of a switch by e on a kubelet with kubeadm's flags file
// fdata: e.DropinDir, which must be the kubelet's own --config-dir where it has one.
func kubeletConfigDir(fdata []byte, e Edit) error {
	if dir := ConfigDir(fdata); dir != nil && filepath.Clean(*dir) != filepath.Clean(e.DropinDir) {
		return fmt.Errorf("the kubelet's --config-dir is %s already: use --dropin-dir %s (or take --config-dir out of kubeadm's flags file)", *dir, *dir)
	}
	return nil
}

// applyDropin switches the kubelet through its drop-in directory e.DropinDir: it records the drop-in
// and kubeadm's flags file as they are (unless e.Record holds a record of this switch already: a
// re-apply keeps it, but for a flags file rewritten by someone else since), then writes the drop-in and
// adds --config-dir (and, where kubeadm's flags name the endpoints, which win over any file, those too).
// config.yaml is not touched.
func applyDropin(flags string, e Edit, flagImage string) (bool, error) {
	if e.Record == "" {
		return false, errors.New("a switch through the drop-in directory needs a record file (--record)")
	}
	if !filepath.IsAbs(e.DropinDir) {
		return false, fmt.Errorf("--dropin-dir %q: want an absolute path (the kubelet's)", e.DropinDir)
	}
	fdata, err := os.ReadFile(flags)
	if err != nil {
		return false, fmt.Errorf("--kubeadm-flags (the switch through the drop-in directory adds --config-dir there): %w", err)
	}
	if err := kubeletConfigDir(fdata, e); err != nil {
		return false, err
	}
	file := filepath.Join(e.DropinDir, DropinName)
	hostDir := filepath.Join(e.HostRoot, e.DropinDir)
	hostFile := filepath.Join(e.HostRoot, file)
	fout, _ := AddConfigDir(fdata, e.DropinDir)
	fout, _ = EditKubeadmFlags(fout, e.Endpoint, flagImage)
	switched := string(fout)
	r, err := readRecord(e.Record)
	if err != nil {
		return false, err
	}
	switch {
	case r == nil:
		prev, err := readOptional(hostFile)
		if err != nil {
			return false, fmt.Errorf("failed to read %s: %w", hostFile, err)
		}
		_, statErr := os.Stat(hostDir)
		was := string(fdata)
		if err := writeRecord(e.Record, record{DropinFile: file, Dropin: prev, KubeadmFlags: &was, KubeadmFlagsSwitched: &switched,
			DropinDirCreated: errors.Is(statErr, os.ErrNotExist)}); err != nil {
			return false, err
		}
	case r.DropinFile == "":
		return false, fmt.Errorf("%s records a switch of config.yaml in place: undo it first (--image-service-endpoint restore without --dropin-dir)", e.Record)
	case r.DropinFile != file:
		return false, fmt.Errorf("%s records a switch through %s: undo it first", e.Record, r.DropinFile)
	case r.KubeadmFlagsSwitched == nil || *r.KubeadmFlagsSwitched != switched:
		// A re-apply over a flags file someone else rewrote since the switch (kubeadm removing a flag
		// it no longer wants): what the undo puts back becomes that file without the switch's edits,
		// not the copy from before the first switch (which would bring the removed flag back).
		if r.KubeadmFlags != nil {
			was := string(unswitchFlags(fdata, []byte(*r.KubeadmFlags), e.DropinDir))
			r.KubeadmFlags = &was
		}
		r.KubeadmFlagsSwitched = &switched
		if err := writeRecord(e.Record, *r); err != nil {
			return false, err
		}
	}
	changed := false
	want := DropinContent(e)
	if cur, err := os.ReadFile(hostFile); err != nil || !bytes.Equal(cur, want) {
		if err := os.MkdirAll(hostDir, 0o755); err != nil {
			return false, fmt.Errorf("failed to make the drop-in directory: %w", err)
		}
		if err := atomicfile.WriteFile(hostFile, want, 0o644); err != nil {
			return false, fmt.Errorf("failed to write %s: %w", hostFile, err)
		}
		changed = true
	}
	if !bytes.Equal(fout, fdata) {
		if err := atomicfile.WriteFile(flags, fout, 0o644); err != nil {
			return changed, fmt.Errorf("failed to write %s: %w", flags, err)
		}
		changed = true
	}
	return changed, nil
}

// undoDropin puts back what r (a record of a switch through the drop-in directory, in e.Record)
// holds: the drop-in and kubeadm's flags file byte for byte (a drop-in that did not exist removed, and
// its directory if the switch made it and it is empty), then removes the record. A flags file someone
// else changed since the switch left it (kubeadm upgrade removing a flag it no longer wants:
// RemoveKubeletArgsFromFile in cmd/kubeadm/app/phases/upgrade/postupgrade.go) keeps their change: only
// the switch's own edits are taken out of it (unswitchFlags).
func undoDropin(flags string, e Edit, r *record) (bool, error) {
	changed := false
	hostFile := filepath.Join(e.HostRoot, r.DropinFile)
	flagsWas := r.KubeadmFlags
	if cur, err := readOptional(flags); err == nil && cur != nil && r.KubeadmFlags != nil && r.KubeadmFlagsSwitched != nil &&
		*cur != *r.KubeadmFlagsSwitched && *cur != *r.KubeadmFlags {
		out := string(unswitchFlags([]byte(*cur), []byte(*r.KubeadmFlags), filepath.Dir(r.DropinFile)))
		flagsWas = &out
	}
	for _, f := range []struct {
		path string
		was  *string
	}{{hostFile, r.Dropin}, {flags, flagsWas}} {
		cur, err := readOptional(f.path)
		if err != nil {
			return changed, fmt.Errorf("failed to read %s: %w", f.path, err)
		}
		switch {
		case f.was == nil && cur != nil:
			if err := os.Remove(f.path); err != nil {
				return changed, fmt.Errorf("failed to remove %s: %w", f.path, err)
			}
			changed = true
		case f.was != nil && (cur == nil || *cur != *f.was):
			if err := atomicfile.WriteFile(f.path, []byte(*f.was), 0o644); err != nil {
				return changed, fmt.Errorf("failed to restore %s: %w", f.path, err)
			}
			changed = true
		}
	}
	if r.DropinDirCreated {
		// Only if empty: a drop-in of someone else stays, with its directory.
		_ = os.Remove(filepath.Dir(hostFile))
	}
	if err := os.Remove(e.Record); err != nil && !errors.Is(err, os.ErrNotExist) {
		return changed, fmt.Errorf("failed to remove the record of the switch: %w", err)
	}
	return changed, nil
}

// configDirFlagBlanks is configDirFlag with the blanks around it: one of them is taken out with it.
var configDirFlagBlanks = regexp.MustCompile(`[ \t]?--config-dir[= ]("[^"]*"|[^\s"]+)[ \t]?`)

// unswitchFlags takes the switch's edits out of kubeadm's flags file cur, orig being the file before
// the switch and dir the drop-in directory: the --config-dir=dir it added (where orig had none), and
// the endpoint flags as orig had them.
func unswitchFlags(cur, orig []byte, dir string) []byte {
	out := cur
	if ConfigDir(orig) == nil {
		out = configDirFlagBlanks.ReplaceAllFunc(out, func(m []byte) []byte {
			v := flagValue(configDirFlag, m)
			switch {
			case v == nil || filepath.Clean(*v) != filepath.Clean(dir):
				return m
			case (m[0] == ' ' || m[0] == '\t') && (m[len(m)-1] == ' ' || m[len(m)-1] == '\t'):
				return []byte{' '}
			}
			return nil
		})
	}
	if v := flagValue(runtimeEndpointFlag, orig); v != nil {
		out, _ = EditKubeadmFlags(out, *v, "")
	}
	image := "remove"
	if v := flagValue(imageEndpointFlag, orig); v != nil {
		image = *v
	}
	out, _ = EditKubeadmFlags(out, "", image)
	return out
}

// writeRecord writes r to path.
func writeRecord(path string, r record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("failed to record the switch: %w", err)
	}
	if err := atomicfile.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("failed to record the switch: %w", err)
	}
	return nil
}

// Effective is the kubelet's configuration as a kubelet started with --config-dir dir merges it:
// config.yaml, then every *.conf under dir (subdirectories included) in lexical order, each applied as
// a JSON merge patch (RFC 7386: maps merged key by key, null removes a key). dir "" or missing: the
// configuration file alone. A drop-in without apiVersion kubelet.config.k8s.io/v1beta1 and kind
// KubeletConfiguration is an error, as it is for the kubelet (cmd/kubelet/app/server.go,
// mergeKubeletConfigurations, 1.37.2).
func Effective(config, dir string) (map[string]any, error) {
	data, err := os.ReadFile(config)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("%s: not a kubelet configuration: %w", config, err)
	}
	if cfg == nil {
		cfg = map[string]any{}
	}
	if dir == "" {
		return cfg, nil
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return cfg, nil
	}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || filepath.Ext(d.Name()) != ".conf" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var patch map[string]any
		if err := yaml.Unmarshal(data, &patch); err != nil {
			return fmt.Errorf("%s: not a kubelet configuration: %w", path, err)
		}
		// As the kubelet (1.37) refuses it, and then does not start.
		if patch["apiVersion"] != "kubelet.config.k8s.io/v1beta1" || patch["kind"] != "KubeletConfiguration" {
			return fmt.Errorf("%s: apiVersion %v, kind %v: the kubelet wants kubelet.config.k8s.io/v1beta1 KubeletConfiguration in every drop-in", path, orNone(patch["apiVersion"]), orNone(patch["kind"]))
		}
		cfg = mergePatch(cfg, patch)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("the kubelet's drop-in directory: %w", err)
	}
	return cfg, nil
}

// mergePatch applies patch to doc as a JSON merge patch (RFC 7386) and returns doc.
func mergePatch(doc, patch map[string]any) map[string]any {
	for k, v := range patch {
		if v == nil {
			delete(doc, k)
			continue
		}
		if pm, ok := v.(map[string]any); ok {
			dm, _ := doc[k].(map[string]any)
			if dm == nil {
				dm = map[string]any{}
			}
			doc[k] = mergePatch(dm, pm)
			continue
		}
		doc[k] = v
	}
	return doc
}

// checkDropin is Check for a switch through the drop-in directory: the kubelet's --config-dir in
// kubeadm's flags file is e.DropinDir, and its effective configuration (config.yaml and the drop-ins
// of the directory it reads) and flags are the switch's.
func checkDropin(config, flags string, e Edit, image, flagImage string) ([]string, error) {
	fdata, err := readFlags(flags)
	if err != nil {
		return nil, err
	}
	var drift []string
	dir := ""
	switch d := ConfigDir(fdata); {
	case d == nil:
		drift = append(drift, fmt.Sprintf("%s: --config-dir is unset, want %s (the kubelet reads no drop-in)", flags, e.DropinDir))
	default:
		dir = *d
		if filepath.Clean(dir) != filepath.Clean(e.DropinDir) {
			drift = append(drift, fmt.Sprintf("%s: --config-dir is %s, want %s", flags, dir, e.DropinDir))
		}
	}
	hostDir := ""
	if dir != "" {
		hostDir = filepath.Join(e.HostRoot, dir)
	}
	cfg, err := Effective(config, hostDir)
	if err != nil {
		return nil, err
	}
	where := config
	if hostDir != "" {
		where += " with " + hostDir + "/*.conf"
	}
	drift = append(drift, settingsDrift(where, cfg, e, image)...)
	return append(drift, flagsDrift(flags, fdata, e, flagImage)...), nil
}

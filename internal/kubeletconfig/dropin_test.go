package kubeletconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

const (
	containerdSock = "unix:///run/containerd/containerd.sock"
	plegSock       = "unix:///run/pleg-nri/cri.sock"
	dropinDir      = "/etc/kubernetes/kubelet.conf.d"
)

// dropinNode is a kubelet's files under a host root: config.yaml and kubeadm-flags.env as kubeadm
// writes them, and pleg-nri's record.
type dropinNode struct {
	root, config, flags, record string
}

func newDropinNode(t *testing.T, flags string) dropinNode {
	t.Helper()
	root := t.TempDir()
	n := dropinNode{root: root, config: filepath.Join(root, "var/lib/kubelet/config.yaml"),
		flags: filepath.Join(root, "var/lib/kubelet/kubeadm-flags.env"), record: filepath.Join(root, "etc/pleg-nri/kubelet-switched")}
	testutil.WriteFile(t, n.config, kubeadmConfig)
	if flags != "" {
		testutil.WriteFile(t, n.flags, flags)
	}
	return n
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// switchEdit is the chart's switch through the drop-in directory.
func (n dropinNode) switchEdit() Edit {
	return Edit{Endpoint: plegSock, ImageEndpoint: containerdSock, EventedPLEG: "true", Record: n.record, DropinDir: dropinDir, HostRoot: n.root}
}

// undoEdit is the chart's restore (node.sh kubelet_restore), which names no drop-in directory when
// kubelet.dropinDir was turned off since.
func (n dropinNode) undoEdit(dir string) Edit {
	return Edit{Endpoint: containerdSock, ImageEndpoint: "restore", EventedPLEG: "remove", Record: n.record, DropinDir: dir, HostRoot: n.root}
}

// TestDropinSwitch (issue 60): the switch through the drop-in directory writes 90-pleg-nri.conf and
// adds --config-dir to KUBELET_KUBEADM_ARGS, leaving config.yaml alone; the kubelet's effective
// settings are the switch's, and stay so after kubeadm upgrade node rewrites config.yaml; a re-apply
// changes nothing; the undo puts back every file byte for byte (the directory it made removed), with
// or without --dropin-dir; the check then reports the drift.
func TestDropinSwitch(t *testing.T) {
	for _, tc := range []struct{ name, flags, wantFlags string }{
		{"kubeadm 1.35", "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2 --node-labels=\"\n",
			"KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2 --node-labels= --config-dir=" + dropinDir + "\"\n"},
		{"runtime endpoint flag", "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=" + containerdSock + " --node-ip=172.18.0.2\"\n",
			"KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=" + plegSock + " --image-service-endpoint=" + containerdSock + " --node-ip=172.18.0.2 --config-dir=" + dropinDir + "\"\n"},
		{"empty args", "KUBELET_KUBEADM_ARGS=\"\"\n", "KUBELET_KUBEADM_ARGS=\"--config-dir=" + dropinDir + "\"\n"},
		{"no args line", "# nothing\n", "# nothing\nKUBELET_KUBEADM_ARGS=\"--config-dir=" + dropinDir + "\"\n"},
		{"config-dir already", "KUBELET_KUBEADM_ARGS=\"--config-dir=" + dropinDir + " --node-ip=172.18.0.2\"\n",
			"KUBELET_KUBEADM_ARGS=\"--config-dir=" + dropinDir + " --node-ip=172.18.0.2\"\n"},
	} {
		for _, undoDir := range []string{dropinDir, ""} {
			t.Run(tc.name+"/undo dir "+undoDir, func(t *testing.T) {
				n := newDropinNode(t, tc.flags)
				sw := n.switchEdit()
				if drift, err := Check(n.config, n.flags, sw); err != nil || len(drift) == 0 {
					t.Errorf("check before the switch: no drift (%v)", err)
				}
				if changed, err := Apply(n.config, n.flags, sw); err != nil || !changed {
					t.Fatalf("switch: %v %v", changed, err)
				}
				if got := readFile(t, n.config); got != kubeadmConfig {
					t.Errorf("config.yaml changed:\n%s", got)
				}
				if got := readFile(t, n.flags); got != tc.wantFlags {
					t.Errorf("kubeadm-flags.env:\n%s\nwant\n%s", got, tc.wantFlags)
				}
				file := filepath.Join(n.root, dropinDir, DropinName)
				var dropin map[string]any
				if err := yaml.Unmarshal([]byte(readFile(t, file)), &dropin); err != nil {
					t.Fatal(err)
				}
				want := map[string]any{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
					"containerRuntimeEndpoint": plegSock, "imageServiceEndpoint": containerdSock, "featureGates": map[string]any{"EventedPLEG": true}}
				if diff := cmp.Diff(want, dropin); diff != "" {
					t.Errorf("the drop-in (-want +got):\n%s", diff)
				}
				if drift, err := Check(n.config, n.flags, sw); err != nil || len(drift) != 0 {
					t.Errorf("check after the switch: %v %v", drift, err)
				}
				// kubeadm upgrade node: config.yaml moved away and written anew from the ConfigMap.
				testutil.WriteFile(t, n.config, kubeadmConfig+"cgroupDriver: systemd\n")
				if drift, err := Check(n.config, n.flags, sw); err != nil || len(drift) != 0 {
					t.Errorf("check after kubeadm upgrade node: %v %v", drift, err)
				}
				if changed, err := Apply(n.config, n.flags, sw); err != nil || changed {
					t.Errorf("switch again: %v %v", changed, err)
				}
				testutil.WriteFile(t, n.config, kubeadmConfig)
				if changed, err := Apply(n.config, n.flags, n.undoEdit(undoDir)); err != nil || !changed {
					t.Fatalf("undo: %v %v", changed, err)
				}
				if got := readFile(t, n.flags); got != tc.flags {
					t.Errorf("kubeadm-flags.env after the undo:\n%s\nwant\n%s", got, tc.flags)
				}
				if got := readFile(t, n.config); got != kubeadmConfig {
					t.Errorf("config.yaml after the undo:\n%s", got)
				}
				if _, err := os.Stat(filepath.Join(n.root, dropinDir)); !os.IsNotExist(err) {
					t.Errorf("the drop-in directory the switch made is still there: %v", err)
				}
				if _, err := os.Stat(n.record); !os.IsNotExist(err) {
					t.Errorf("the record is still there: %v", err)
				}
				drift, err := Check(n.config, n.flags, sw)
				if err != nil || len(drift) == 0 {
					t.Errorf("check after the undo: no drift (%v)", err)
				}
			})
		}
	}
}

// TestDropinKeepsOthers: a drop-in of the same name there before the switch, and the directory with
// another drop-in, are put back as they were.
func TestDropinKeepsOthers(t *testing.T) {
	const flags = "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2\"\n"
	n := newDropinNode(t, flags)
	old, other := filepath.Join(n.root, dropinDir, DropinName), filepath.Join(n.root, dropinDir, "10-other.conf")
	testutil.WriteFile(t, old, "# an old one\nkind: KubeletConfiguration\nmaxPods: 50\n")
	testutil.WriteFile(t, other, "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 20\n")
	if _, err := Apply(n.config, n.flags, n.switchEdit()); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(n.config, n.flags, n.undoEdit(dropinDir)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, old); got != "# an old one\nkind: KubeletConfiguration\nmaxPods: 50\n" {
		t.Errorf("the drop-in before the switch: %q", got)
	}
	if got := readFile(t, other); got != "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 20\n" {
		t.Errorf("the other drop-in: %q", got)
	}
	if got := readFile(t, n.flags); got != flags {
		t.Errorf("kubeadm-flags.env: %q", got)
	}
}

// TestDropinCheckEffective: the check merges the drop-ins over config.yaml as the kubelet does
// (lexical order, subdirectories, null removes), and only those of the kubelet's --config-dir.
func TestDropinCheckEffective(t *testing.T) {
	for _, tc := range []struct {
		name      string
		drop      map[string]string // under dropinDir
		wantDrift []string          // substrings, one per drift
	}{
		{"later wins", map[string]string{"95-later.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: " + containerdSock + "\n"},
			[]string{"containerRuntimeEndpoint is " + containerdSock}},
		{"earlier loses", map[string]string{"10-earlier.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: " + containerdSock + "\n"}, nil},
		{"gate merged key by key", map[string]string{"95-gates.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfeatureGates:\n  Foo: true\n"}, nil},
		{"gate off later", map[string]string{"99-gates.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfeatureGates:\n  EventedPLEG: false\n"},
			[]string{"featureGates.EventedPLEG is false, want true"}},
		{"null removes", map[string]string{"99-null.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimageServiceEndpoint: null\n"},
			[]string{"imageServiceEndpoint is unset"}},
		{"subdirectory in order", map[string]string{"zz/1.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///x.sock\n"},
			[]string{"containerRuntimeEndpoint is unix:///x.sock"}},
		{"not .conf", map[string]string{"99-x.yaml": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///x.sock\n"}, nil},
		{"no apiVersion", map[string]string{"50-bad.conf": "kind: KubeletConfiguration\nmaxPods: 10\n"}, []string{"apiVersion unset, kind KubeletConfiguration: the kubelet wants kubelet.config.k8s.io/v1beta1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newDropinNode(t, "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2\"\n")
			if _, err := Apply(n.config, n.flags, n.switchEdit()); err != nil {
				t.Fatal(err)
			}
			for name, data := range tc.drop {
				testutil.WriteFile(t, filepath.Join(n.root, dropinDir, name), data)
			}
			drift, err := Check(n.config, n.flags, n.switchEdit())
			if err != nil {
				drift = []string{"error: " + err.Error()}
			}
			if len(drift) != len(tc.wantDrift) {
				t.Fatalf("drift %q, want %d", drift, len(tc.wantDrift))
			}
			for i, w := range tc.wantDrift {
				if !strings.Contains(drift[i], w) {
					t.Errorf("drift %q, want %q", drift[i], w)
				}
			}
		})
	}
	// The kubelet reads no drop-in without --config-dir (taken out of kubeadm's flags file): the drift
	// says so, and config.yaml's settings count.
	n := newDropinNode(t, "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2\"\n")
	if _, err := Apply(n.config, n.flags, n.switchEdit()); err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, n.flags, "KUBELET_KUBEADM_ARGS=\"--node-ip=172.18.0.2\"\n")
	drift, err := Check(n.config, n.flags, n.switchEdit())
	if err != nil || len(drift) != 4 || !strings.Contains(drift[0], "--config-dir is unset") || !strings.Contains(drift[1], "containerRuntimeEndpoint is "+containerdSock) {
		t.Errorf("without --config-dir: %q %v", drift, err)
	}
}

// TestDropinRefusals: another --config-dir, a switch in place recorded, a missing flags file, a
// relative directory are refused before anything is written.
func TestDropinRefusals(t *testing.T) {
	for _, tc := range []struct{ name, flags, record, dir, want string }{
		{"other config-dir", "KUBELET_KUBEADM_ARGS=\"--config-dir=/etc/other.d\"\n", "", dropinDir, "--config-dir is /etc/other.d already"},
		{"in place recorded", "KUBELET_KUBEADM_ARGS=\"\"\n", `{"imageServiceEndpoint":null,"kubeadmFlagImageServiceEndpoint":null}`, dropinDir, "in place"},
		{"no flags file", "", "", dropinDir, "--kubeadm-flags"},
		{"relative", "KUBELET_KUBEADM_ARGS=\"\"\n", "", "kubelet.conf.d", "absolute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newDropinNode(t, tc.flags)
			if tc.record != "" {
				testutil.WriteFile(t, n.record, tc.record)
			}
			e := n.switchEdit()
			e.DropinDir = tc.dir
			if _, err := Apply(n.config, n.flags, e); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want %q", err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(n.root, dropinDir)); !os.IsNotExist(err) {
				t.Errorf("the drop-in directory was made")
			}
			if tc.flags != "" {
				if got := readFile(t, n.flags); got != tc.flags {
					t.Errorf("kubeadm-flags.env changed: %q", got)
				}
			}
			if tc.record != "" {
				if got := readFile(t, n.record); got != tc.record {
					t.Errorf("the record changed: %q", got)
				}
			} else if _, err := os.Stat(n.record); !os.IsNotExist(err) {
				t.Errorf("a record was written")
			}
		})
	}
	// The same --config-dir as the kubelet's, written differently, is the kubelet's.
	n := newDropinNode(t, "KUBELET_KUBEADM_ARGS=\"--config-dir="+dropinDir+"/\"\n")
	if _, err := Apply(n.config, n.flags, n.switchEdit()); err != nil {
		t.Errorf("the kubelet's own --config-dir: %v", err)
	}
}

// TestDropinUndoKeepsKubeadmsChange: kubeadm-flags.env rewritten after the switch (kubeadm upgrade
// dropping a flag it no longer wants, RemoveKubeletArgsFromFile: the other flags, --config-dir included,
// rewritten sorted) is not put back to the copy from before the switch, which would bring the dropped
// flag back; the undo takes out only the switch's own edits. A re-apply over such a file records that
// file without the switch's edits as what the undo puts back.
func TestDropinUndoKeepsKubeadmsChange(t *testing.T) {
	const before = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=" + containerdSock + " --node-ip=172.18.0.2 --pod-infra-container-image=registry.k8s.io/pause:3.10\"\n"
	n := newDropinNode(t, before)
	if _, err := Apply(n.config, n.flags, n.switchEdit()); err != nil {
		t.Fatal(err)
	}
	// kubeadm's rewrite, without --pod-infra-container-image.
	const rewritten = "KUBELET_KUBEADM_ARGS=\"--config-dir=" + dropinDir + " --container-runtime-endpoint=" + plegSock +
		" --image-service-endpoint=" + containerdSock + " --node-ip=172.18.0.2\"\n"
	testutil.WriteFile(t, n.flags, rewritten)
	if drift, err := Check(n.config, n.flags, n.switchEdit()); err != nil || len(drift) != 0 {
		t.Errorf("check after kubeadm's rewrite: %v %v", drift, err)
	}
	if _, err := Apply(n.config, n.flags, n.undoEdit(dropinDir)); err != nil {
		t.Fatal(err)
	}
	const want = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=" + containerdSock + " --node-ip=172.18.0.2\"\n"
	if got := readFile(t, n.flags); got != want {
		t.Errorf("kubeadm-flags.env after the undo:\n%s\nwant\n%s", got, want)
	}

	// Switched over kubeadm's rewrite (a re-apply): the undo right after restores byte for byte.
	n = newDropinNode(t, before)
	if _, err := Apply(n.config, n.flags, n.switchEdit()); err != nil {
		t.Fatal(err)
	}
	const dropped = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=" + containerdSock + " --node-ip=172.18.0.2\"\n"
	testutil.WriteFile(t, n.flags, dropped)
	if changed, err := Apply(n.config, n.flags, n.switchEdit()); err != nil || !changed {
		t.Fatalf("re-apply: %v %v", changed, err)
	}
	if _, err := Apply(n.config, n.flags, n.undoEdit(dropinDir)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, n.flags); got != dropped {
		t.Errorf("kubeadm-flags.env after an undo right after the re-apply:\n%s\nwant kubeadm's\n%s", got, dropped)
	}
}

// TestUnswitchFlags: the switch's --config-dir taken out wherever it is, with one blank; another
// directory's, or one the file had before the switch, kept; the endpoint flags as they were.
func TestUnswitchFlags(t *testing.T) {
	const orig = `KUBELET_KUBEADM_ARGS="--node-ip=1"` + "\n"
	for _, tc := range []struct{ name, cur, orig, want string }{
		{"first", `KUBELET_KUBEADM_ARGS="--config-dir=/d --node-ip=1"` + "\n", orig, orig},
		{"middle", `KUBELET_KUBEADM_ARGS="--a=1 --config-dir=/d --node-ip=1"` + "\n", orig, `KUBELET_KUBEADM_ARGS="--a=1 --node-ip=1"` + "\n"},
		{"last", `KUBELET_KUBEADM_ARGS="--node-ip=1 --config-dir=/d/"` + "\n", orig, orig},
		{"only", `KUBELET_KUBEADM_ARGS="--config-dir=/d"` + "\n", orig, `KUBELET_KUBEADM_ARGS=""` + "\n"},
		{"another directory", `KUBELET_KUBEADM_ARGS="--config-dir=/other --node-ip=1"` + "\n", orig, `KUBELET_KUBEADM_ARGS="--config-dir=/other --node-ip=1"` + "\n"},
		{"had it before", `KUBELET_KUBEADM_ARGS="--config-dir=/d --node-ip=2"` + "\n", `KUBELET_KUBEADM_ARGS="--config-dir=/d"` + "\n",
			`KUBELET_KUBEADM_ARGS="--config-dir=/d --node-ip=2"` + "\n"},
		{"endpoints", `KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=` + plegSock + ` --image-service-endpoint=` + containerdSock + ` --node-ip=2"` + "\n",
			`KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=` + containerdSock + `"` + "\n",
			`KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=` + containerdSock + ` --node-ip=2"` + "\n"},
	} {
		if got := string(unswitchFlags([]byte(tc.cur), []byte(tc.orig), "/d")); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

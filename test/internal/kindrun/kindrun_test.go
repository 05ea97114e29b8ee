package kindrun

import (
	"os"
	"path/filepath"
	"testing"
)

func TestFreezerDir(t *testing.T) {
	cg := "12:memory:/docker/abc\n6:freezer:/docker/abc/kubelet.slice\n1:name=systemd:/docker/abc\n"
	if got := freezerDir(cg); got != "/docker/abc/kubelet.slice" {
		t.Fatalf("freezerDir = %q", got)
	}
	if got := freezerDir("0::/system.slice/docker.service\n"); got != "" {
		t.Fatalf("cgroup v2: freezerDir = %q, want none", got)
	}
}

func TestThawTree(t *testing.T) {
	root := t.TempDir()
	states := map[string]string{
		"freezer.state":                     "THAWED\n",
		"kubelet.slice/freezer.state":       "THAWED\n",
		"kubelet.slice/pod1/freezer.state":  "FROZEN\n",
		"kubelet.slice/pod2/freezer.state":  "FREEZING\n",
		"kubelet.slice/pod2/c1/other.state": "FROZEN\n",
	}
	for p, s := range states {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := thawTree(root)
	if err != nil || n != 2 {
		t.Fatalf("thawTree = %d, %v; want 2", n, err)
	}
	for _, p := range []string{"kubelet.slice/pod1/freezer.state", "kubelet.slice/pod2/freezer.state"} {
		if b, _ := os.ReadFile(filepath.Join(root, p)); string(b) != "THAWED" {
			t.Errorf("%s = %q, want THAWED", p, b)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, "kubelet.slice/pod2/c1/other.state")); string(b) != "FROZEN\n" {
		t.Errorf("a file not named freezer.state was written: %q", b)
	}
	if n, err := thawTree(filepath.Join(root, "gone")); err != nil || n != 0 {
		t.Fatalf("missing dir: %d, %v", n, err)
	}
}

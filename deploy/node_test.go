package deploy

// deploy/node.sh (the Helm chart's node agent) is run here on a /proc-like tree of its own: which host
// processes it counts as this install's, to stop them on uninstall and on a switch of mode. The rest
// of node.sh runs against a real systemd node in test/deploy (make test-deploy).

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeProc is one process of a fake /proc: its exe link's target ("" for none, as a kernel thread),
// its argv and its cgroup file.
type fakeProc struct {
	pid, exe string
	argv     []string
	cgroup   string
}

// TestNodeProcesses (issue 56): node.sh finds this install's cores and fronts of both modes, those
// still running a binary an upgrade replaced ("PATH (deleted)", which uninstall used to miss) included,
// and leaves other binaries, other paths and pods' processes alone.
func TestNodeProcesses(t *testing.T) {
	proc := t.TempDir()
	for _, p := range []fakeProc{
		{"100", "/opt/nri/plugins/10-pleg-nri (deleted)", []string{"/opt/nri/plugins/10-pleg-nri"}, "0::/system.slice/containerd.service\n"},
		{"101", "/opt/nri/plugins/10-pleg-nri (deleted)", []string{"/opt/nri/plugins/10-pleg-nri", "front", "--listen", "unix:///run/pleg-nri/cri.sock"}, "0::/system.slice/containerd.service\n"},
		{"102", "/usr/local/bin/pleg-nri", []string{"/usr/local/bin/pleg-nri", "--config", "/etc/pleg-nri/config.yaml"}, "0::/system.slice/pleg-nri.service\n"},
		{"103", "/usr/local/bin/pleg-nri (deleted)", []string{"/usr/local/bin/pleg-nri", "front", "--run-dir", "/run/pleg-nri"}, "0::/system.slice/pleg-nri.service\n"},
		{"104", "/opt/nri/plugins/10-pleg-nri", []string{"/opt/nri/plugins/10-pleg-nri"}, "0::/system.slice/containerd.service\n"},
		{"200", "/usr/bin/containerd", []string{"/usr/bin/containerd"}, "0::/system.slice/containerd.service\n"},
		{"201", "/usr/local/bin/pleg-nri", []string{"/usr/local/bin/pleg-nri", "version"}, "0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-abc.scope\n"},
		{"202", "/usr/local/bin/pleg-nri-old", []string{"/usr/local/bin/pleg-nri-old"}, "0::/\n"},
		{"203", "", nil, ""},
		{"204", "/usr/local/bin/pleg-nri (deleted)", []string{"/usr/local/bin/pleg-nri", "events"}, "12:memory:/kubepods/burstable/pod1/abc\n"},
	} {
		dir := filepath.Join(proc, p.pid)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if p.exe != "" {
			if err := os.Symlink(p.exe, filepath.Join(dir, "exe")); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(strings.Join(p.argv, "\x00")+"\x00"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(p.cgroup), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("sh", "node.sh", "processes")
	cmd.Env = append(os.Environ(), "PLEG_NRI_PROC="+proc)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node.sh processes: %v\n%s", err, out)
	}
	want := `100 core /opt/nri/plugins/10-pleg-nri
101 front /opt/nri/plugins/10-pleg-nri
102 core /usr/local/bin/pleg-nri
103 front /usr/local/bin/pleg-nri
104 core /opt/nri/plugins/10-pleg-nri
`
	if string(out) != want {
		t.Errorf("node.sh processes:\n%s\nwant:\n%s", out, want)
	}
}

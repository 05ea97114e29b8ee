package containerd

import (
	"path/filepath"
	"testing"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

func TestCgroupDir(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/kubepods/burstable/pod1/abc", "/kubepods/burstable/pod1/abc"},
		{"/k8s.io/abc", "/k8s.io/abc"},
		{"kubepods-burstable-pod1.slice:cri-containerd:abc", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope"},
		{"kubepods-pod2.slice:cri-containerd:def", "/kubepods.slice/kubepods-pod2.slice/cri-containerd-def.scope"},
		{":cri-containerd:abc", "/system.slice/cri-containerd-abc.scope"},
		{"-.slice::x.slice", "/x.slice"},
	} {
		got, err := cgroupDir(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("cgroupDir(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"relative/path", "a:b", "a.scope:p:n", "a--b.slice:p:n", "a:b:c:d"} {
		if got, err := cgroupDir(bad); err == nil {
			t.Errorf("cgroupDir(%q) = %q, want an error", bad, got)
		}
	}
}

// TestCgroupOOMKilled reads the oom_kill count as the kernel writes it, in a cgroup v1 memory hierarchy
// (memory.oom_control) and a cgroup v2 one (memory.events).
func TestCgroupOOMKilled(t *testing.T) {
	v1, v2 := t.TempDir(), t.TempDir()
	testutil.WriteFile(t, filepath.Join(v1, "memory/k8s.io/killed/memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
	testutil.WriteFile(t, filepath.Join(v1, "memory/k8s.io/fine/memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
	testutil.WriteFile(t, filepath.Join(v1, "memory/k8s.io/old-kernel/memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\n")
	testutil.WriteFile(t, filepath.Join(v2, "cgroup.controllers"), "cpu memory pids\n")
	testutil.WriteFile(t, filepath.Join(v2, "kubepods.slice/kubepods-pod1.slice/cri-containerd-killed.scope/memory.events"),
		"low 0\nhigh 0\nmax 12\noom 1\noom_kill 2\noom_group_kill 0\n")
	testutil.WriteFile(t, filepath.Join(v2, "kubepods.slice/kubepods-pod1.slice/cri-containerd-fine.scope/memory.events"),
		"low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
	for _, tc := range []struct {
		root, path string
		want, ok   bool
	}{
		{v1, "/k8s.io/killed", true, true},
		{v1, "/k8s.io/fine", false, true},
		{v1, "/k8s.io/old-kernel", false, false},
		{v1, "/k8s.io/gone", false, false},
		{v2, "kubepods-pod1.slice:cri-containerd:killed", true, true},
		{v2, "kubepods-pod1.slice:cri-containerd:fine", false, true},
		{v2, "kubepods-pod1.slice:cri-containerd:gone", false, false},
	} {
		got, err := cgroupOOMKilled(tc.root, tc.path)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("cgroupOOMKilled(%s) = %v, %v; want %v (ok %v)", tc.path, got, err, tc.want, tc.ok)
		}
	}
}

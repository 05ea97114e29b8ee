package e2eimages

import "testing"

func TestSplitRegistry(t *testing.T) {
	for _, c := range []struct {
		name, host, rest string
		ok               bool
	}{
		{"registry.k8s.io/e2e-test-images/agnhost:2.62", "registry.k8s.io", "e2e-test-images/agnhost:2.62", true},
		{"localhost:5000/pause:testing", "localhost:5000", "pause:testing", true},
		{"busybox:1.37", "", "", false},
		{"library/busybox:1.37", "", "", false},
	} {
		host, rest, ok := SplitRegistry(c.name)
		if host != c.host || rest != c.rest || ok != c.ok {
			t.Errorf("SplitRegistry(%q) = %q, %q, %v; want %q, %q, %v", c.name, host, rest, ok, c.host, c.rest, c.ok)
		}
	}
}

func TestHostsTOML(t *testing.T) {
	want := "server = \"https://registry.k8s.io\"\n\n[host.\"http://172.18.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
	if got := HostsTOML("registry.k8s.io", "172.18.0.1:5000"); got != want {
		t.Errorf("HostsTOML = %q, want %q", got, want)
	}
}

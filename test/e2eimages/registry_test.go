package e2eimages

import (
	"strings"
	"testing"
)

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

func TestPush(t *testing.T) {
	r := &Registry{Addr: "10.0.0.1:5000"}
	var calls []string
	ctr := func(args ...string) error {
		calls = append(calls, strings.Join(args, " "))
		return nil
	}
	hosts, pushed, err := r.Push([]Result{
		{Name: "registry.k8s.io/e2e-test-images/busybox:1.37.0-1", Built: true},
		{Name: "registry.k8s.io/pause:3.10", Built: true},
		{Name: "gcr.io/k8s-authenticated-test/agnhost:2.6"},
		{Name: "busybox:1.37", Built: true},
	}, ctr)
	if err != nil || pushed != 2 || strings.Join(hosts, ",") != "registry.k8s.io" {
		t.Fatalf("Push = %q, %d, %v; want [registry.k8s.io], 2, nil", hosts, pushed, err)
	}
	want := []string{
		"images tag --force registry.k8s.io/e2e-test-images/busybox:1.37.0-1 10.0.0.1:5000/e2e-test-images/busybox:1.37.0-1",
		"images push --plain-http 10.0.0.1:5000/e2e-test-images/busybox:1.37.0-1",
		"images rm 10.0.0.1:5000/e2e-test-images/busybox:1.37.0-1",
		"images tag --force registry.k8s.io/pause:3.10 10.0.0.1:5000/pause:3.10",
		"images push --plain-http 10.0.0.1:5000/pause:3.10",
		"images rm 10.0.0.1:5000/pause:3.10",
	}
	if strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("ctr calls:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
}

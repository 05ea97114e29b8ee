package e2eimages

import (
	"testing"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// TestWithEveryAppletInBin: an applet Debian links outside /bin gets a /bin link too; one in /bin, and
// files that are not applets, are left as they are.
func TestWithEveryAppletInBin(t *testing.T) {
	link := func(name string) harness.File {
		return harness.File{Name: name, Mode: 0o777, Type: harness.Symlink, Link: "/bin/busybox"}
	}
	in := []harness.File{
		{Name: "bin/busybox", Mode: 0o755, Type: harness.Reg},
		link("bin/sh"), link("usr/bin/top"), link("sbin/ip"), link("bin/pidof"),
		{Name: "usr/bin/other", Mode: 0o777, Type: harness.Symlink, Link: "/elsewhere"},
	}
	got := map[string]int{}
	for _, f := range withEveryAppletInBin(in) {
		got[f.Name]++
	}
	for _, want := range []string{"bin/busybox", "bin/sh", "usr/bin/top", "bin/top", "sbin/ip", "bin/ip", "bin/pidof", "usr/bin/other"} {
		if got[want] != 1 {
			t.Errorf("%s: %d entries, want 1 (all: %v)", want, got[want], got)
		}
	}
	if got["bin/other"] != 0 || len(got) != 8 {
		t.Errorf("entries %v, want the 6 given and bin/top, bin/ip", got)
	}
}

package nodebench

import (
	"os"
	"strings"
	"testing"
)

func TestReportPath(t *testing.T) {
	for _, c := range []struct {
		path string
		pods int
		want string
	}{
		{"docs/kubelet-node-cost-v1.37.2.md", 100, "docs/kubelet-node-cost-v1.37.2.md"},
		{"docs/kubelet-node-cost-v1.37.2.md", 250, "docs/kubelet-node-cost-v1.37.2-250pods.md"},
		{"/tmp/x.y/report", 10, "/tmp/x.y/report-10pods"},
	} {
		if got := ReportPath(c.path, c.pods, 100); got != c.want {
			t.Errorf("ReportPath(%q, %d) = %q, want %q", c.path, c.pods, got, c.want)
		}
	}
}

func TestMakeCommand(t *testing.T) {
	got := MakeCommand("bench-storm", "v1.36.3", 250, 100, map[string]string{"B": "20s", "A": "1", "C": ""})
	if want := "A=1 B=20s make bench-storm KUBELET_VERSION=v1.36.3 NODE_PODS=250"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := MakeCommand("bench-node", "v1.37.2", 100, 100, nil), "make bench-node KUBELET_VERSION=v1.37.2"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestCostCells(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	c := Cost{KubeletCPU: 4, ContainerdCPU: 8}
	if core, front, rss := c.PlegNRICells(); c.Node() != 12 || core != "-" || front != "-" || rss != "-" {
		t.Errorf("without pleg-nri: node %g, cells %q %q %q", c.Node(), core, front, rss)
	}
	c.PlegNRICPU, c.FrontCPU, c.PlegNRIRSSMiB, c.FrontRSSMiB = f(0.25), f(0.5), f(35.04), f(12)
	if core, front, rss := c.PlegNRICells(); c.Node() != 12.75 || core != "0.25" || front != "0.50" || rss != "35.0 + 12.0 MiB" {
		t.Errorf("with pleg-nri: node %g, cells %q %q %q", c.Node(), core, front, rss)
	}
}

func TestOpenFilesLimit(t *testing.T) {
	const limits = `Limit                     Soft Limit           Hard Limit           Units
Max processes             95000                95000                processes
Max open files            20000                1048576              files
Max locked memory         8388608              8388608              bytes
`
	if n, err := OpenFilesLimit(limits); err != nil || n != 20000 {
		t.Errorf("got %d, %v; want 20000", n, err)
	}
	if n, err := OpenFilesLimit("Max open files            unlimited            unlimited            files\n"); err != nil || n != -1 {
		t.Errorf("unlimited: got %d, %v; want -1", n, err)
	}
	if _, err := OpenFilesLimit("Max processes 1 1 processes\n"); err == nil {
		t.Error("no open files line: no error")
	}
	if _, err := OpenFilesLimit("Max open files            many                 1                    files\n"); err == nil {
		t.Error("bad number: no error")
	}
	// This process's own, as ReadLimits reads every process's.
	data, err := os.ReadFile("/proc/self/limits")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	if n, err := OpenFilesLimit(string(data)); err != nil || n == 0 {
		t.Errorf("/proc/self/limits: got %d, %v", n, err)
	}
}

func TestInotifyWatches(t *testing.T) {
	const fdinfo = `pos:	0
flags:	02004000
mnt_id:	15
ino:	1057
inotify wd:2 ino:1a2 sdev:800001 mask:fc6 ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:a201000000000000
inotify wd:1 ino:2 sdev:800001 mask:fc6 ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:0200000000000000
`
	if n := InotifyWatches(fdinfo); n != 2 {
		t.Errorf("got %d watches, want 2", n)
	}
}

func TestLimitsTight(t *testing.T) {
	l := Limits{ContainerdFDs: 600, ContainerdFDLimit: 1024, KubeletFDs: 100, KubeletFDLimit: 1024, Tasks: 5000, PIDMax: 32768,
		InotifyInstances: 70, InotifyInstanceLimit: 128, InotifyWatches: 10, InotifyWatchLimit: 8192}
	got := strings.Join(l.Tight(), "; ")
	if want := "containerd's open files 600 of 1024; inotify instances (fs.inotify.max_user_instances) 70 of 128"; got != want {
		t.Errorf("Tight() = %q, want %q", got, want)
	}
	if !strings.Contains(l.String(), "threads 5000 of pid_max 32768") {
		t.Errorf("String() = %q", l.String())
	}
	if got := (Limits{ContainerdFDs: 5, ContainerdFDLimit: -1}).Tight(); len(got) != 0 {
		t.Errorf("an unlimited limit is tight: %q", got)
	}
}

package cadvisorlag

import (
	"slices"
	"strings"
	"testing"
)

const (
	idA = "a529c643b8de47ff5eee60f64142876b27e3df955e5403f616db78e8c12558d2"
	idB = "2d4535d7439db8077a2fbe33bfca2d4bca12b0fed138c9bd57ee3ea57da4a513"
	idC = "e1c044662840d4981e0423209acf2bc656f68e3f64fce35eb8a5fe83b6435c3b"
)

// The lines are kubelet v1.37.2's, as make e2e-node logged them (shortened).
func TestRead(t *testing.T) {
	log := strings.Join([]string{
		`I1128 19:00:10.000000    6040 pod_workers.go:796] "Pod is being synced for the first time" pod="p/r" podUID="e6fdb2d0-355c-470d-ab7f-fccb74d6dac1" updateType="create"`,
		`I1128 19:00:31.300000    6040 manager.go:905] Added container: "/kubepods/burstable/pode6fdb2d0-355c-470d-ab7f-fccb74d6dac1" (aliases: [], namespace: "")`,
		`I1128 19:00:20.000000    6040 cpu_manager.go:314] "Added Container" pod="p/r" podUID="v" containerName="c1" containerID="` + idA + `"`,
		`I1128 19:00:29.900000    6040 manager.go:905] Added container: "/kubepods/burstable/pod5516/` + idA + `" (aliases: [y], namespace: "containerd")`,
		`I1128 19:00:30.000000    6040 manager.go:905] Added container: "/kubepods/burstable/pod5516/` + idA + `" (aliases: [y], namespace: "containerd")`,
		`I1128 19:00:31.527026    6040 manager.go:953] Destroyed container: "/kubepods/besteffort/pod2d91/` + idB + `" (aliases: [x], namespace: "containerd")`,
		`I1128 19:00:31.567256    6040 kuberuntime_container.go:921] "Container exited normally" pod="p/q" podUID="u" containerName="c" containerID="containerd://` + idB + `"`,
		`I1128 19:00:35.873261    6040 kuberuntime_container.go:921] "Container exited normally" pod="p/r" podUID="v" containerName="c1" containerID="containerd://` + idA + `"`,
		`E1128 19:00:35.973261    6040 kuberuntime_manager.go:926] "Allocated pod resize is not currently feasible" err="unable to read memory usage for pod \"r_p(v)\"" pod="p/r"`,
		`E1128 19:00:35.973300    6040 pod_workers.go:1338] "Error syncing pod, skipping" err="failed to \"ResizePodInPlace\" with ResizePodInPlaceError: \"unable to read memory usage for pod\"" pod="p/r"`,
		`I1128 19:00:36.000000    6040 kuberuntime_container.go:921] "Container exited normally" pod="p/s" podUID="w" containerName="c2" containerID="containerd://` + idC + `"`,
		`not a klog line, Destroyed container: "/x/` + idC + `"`,
		`I1128 19:00:39.933368    6040 manager.go:953] Destroyed container: "/kubepods/burstable/pod5516/` + idA + `" (aliases: [y], namespace: "containerd")`,
	}, "\n")
	l, err := Read(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{21300}; !slices.Equal(l.PodsMs, want) {
		t.Errorf("PodsMs = %v, want %v", l.PodsMs, want)
	}
	if want := []int64{9900}; !slices.Equal(l.CreatedMs, want) {
		t.Errorf("CreatedMs = %v, want %v (the first of cAdvisor's two lines)", l.CreatedMs, want)
	}
	if want := []int64{-40, 4060}; !slices.Equal(l.StoppedMs, want) {
		t.Errorf("StoppedMs = %v, want %v (idC has no destruction in a klog line: not counted)", l.StoppedMs, want)
	}
	if l.Late() != 1 || l.UnableToRead != 1 {
		t.Errorf("Late = %d, UnableToRead = %d, want 1 and 1", l.Late(), l.UnableToRead)
	}
	got := l.String()
	for _, w := range []string{"pods 1, p50 21300 ms", "created 1, p50 9900 ms", "stopped 2, p50 -40 ms, p90 4060 ms, max 4060 ms",
		"destroyed after the stop returned: 1", "unable to read memory usage 1"} {
		if !strings.Contains(got, w) {
			t.Errorf("String() = %q, want it to contain %q", got, w)
		}
	}

	l.Add(Lags{CreatedMs: []int64{5, 20000}, StoppedMs: []int64{-100}, UnableToRead: 2})
	if !slices.Equal(l.CreatedMs, []int64{5, 9900, 20000}) || !slices.Equal(l.StoppedMs, []int64{-100, -40, 4060}) || l.UnableToRead != 3 {
		t.Errorf("after Add: %+v", l)
	}
	if got, want := SummarySeconds(l.CreatedMs), "3, 9.90 / 20.00 / 20.00 s"; got != want {
		t.Errorf("SummarySeconds = %q, want %q", got, want)
	}
	if got := SummarySeconds(nil); got != "none" {
		t.Errorf("SummarySeconds(nil) = %q, want none", got)
	}
}

func TestReadEmpty(t *testing.T) {
	l, err := Read(strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.String(), "pods none; created none; stopped none (destroyed after the stop returned: 0); unable to read memory usage 0"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

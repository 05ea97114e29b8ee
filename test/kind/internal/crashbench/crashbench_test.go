package crashbench

import (
	"strings"
	"testing"
	"time"
)

func TestManifest(t *testing.T) {
	p := Plan{Namespace: "crash-x", Nodes: []string{"a", "b"}, PerNode: 3, FirstExit: 10 * time.Second, Spacing: Spacing, Image: "busybox:t"}
	m, err := p.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(m, "kind: Pod\n"); n != 6 {
		t.Errorf("%d pods, want 6:\n%s", n, m)
	}
	for _, want := range []string{"name: crash-0-00\n", "name: crash-1-02\n", "nodeName: b\n", "until [ -e /release/go ]; do sleep 1; done; sleep 11.060; exit 1", "image: busybox:t",
		"path: /run/crashbench/crash-x\n"} {
		if !strings.Contains(m, want) {
			t.Errorf("the manifest has no %q:\n%s", want, m)
		}
	}
}

func ctr(uid, name string, attempt int, state string) Container {
	c := Container{ID: uid + name, State: state, Labels: map[string]string{
		"io.kubernetes.pod.uid": uid, "io.kubernetes.pod.name": "p" + uid, "io.kubernetes.pod.namespace": "ns"}}
	c.Metadata.Name, c.Metadata.Attempt = name, attempt
	return c
}

func TestDuplicates(t *testing.T) {
	ok := []Container{ctr("1", "c", 0, "CONTAINER_EXITED"), ctr("1", "c", 1, "CONTAINER_RUNNING"), ctr("2", "c", 0, "CONTAINER_RUNNING")}
	if d := Duplicates(ok); len(d) != 0 {
		t.Errorf("Duplicates of a clean list: %v", d)
	}
	bad := append(ok, ctr("1", "c", 1, "CONTAINER_EXITED"), ctr("2", "c", 1, "CONTAINER_RUNNING"))
	d := Duplicates(bad)
	want := []string{"ns/p1 container c: 2 containers of attempt 1", "ns/p2 container c: 2 running at once"}
	if strings.Join(d, "|") != strings.Join(want, "|") {
		t.Errorf("Duplicates = %q, want %q", d, want)
	}
}

func TestStatsAndWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var s []Sample
	for i := 0; i < 10; i++ {
		e := t0.Add(time.Duration(i) * time.Second)
		s = append(s, Sample{Node: []string{"a", "b"}[i%2], Exited: e, Created: e.Add(time.Duration(i+1) * 10 * time.Millisecond),
			Started: e.Add(time.Duration(i+1) * 20 * time.Millisecond)})
	}
	st := Of(s)
	if st.N != 10 || st.CreatedP50 < 50 || st.CreatedP50 > 60 || st.StartedP90 < 180 || st.StartedP90 > 200 {
		t.Errorf("Of = %+v", st)
	}
	if got := Between(s, t0.Add(2*time.Second), t0.Add(4*time.Second)); len(got) != 3 {
		t.Errorf("Between kept %d samples, want 3", len(got))
	}
	if by := ByNode(s); len(by["a"]) != 5 || len(by["b"]) != 5 {
		t.Errorf("ByNode = %d, %d", len(by["a"]), len(by["b"]))
	}
	if Of(nil).String() != "no samples" {
		t.Errorf("Of(nil) = %s", Of(nil))
	}
}

func attempt(exit int, started, finished time.Time) times {
	var t times
	t.Status.ExitCode, t.Status.StartedAt, t.Status.FinishedAt = exit, started, finished
	return t
}

func TestCrashAndReplacement(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ran := func(exit int) times { return attempt(exit, t0, t0.Add(time.Second)) }
	running := attempt(0, t0.Add(2*time.Second), time.Time{})
	neverRan := attempt(128, time.Time{}, t0)       // runc failed to start it
	epochStart := attempt(128, time.Unix(0, 0), t0) // as crictl may print a start that never was
	for _, c := range []struct {
		name      string
		as        map[int]times
		wantCrash int
		found     int
	}{
		{"crash then replacement", map[int]times{0: ran(1), 1: running}, 0, replacementStarted},
		{"a start that failed before the crash", map[int]times{0: neverRan, 1: ran(1), 2: running}, 1, replacementStarted},
		{"a start at the epoch failed before the crash", map[int]times{0: epochStart, 1: ran(1), 2: running}, 1, replacementStarted},
		{"no replacement yet", map[int]times{0: ran(1)}, 0, noCrash},
		{"no planned crash", map[int]times{0: ran(137), 1: running}, 0, noCrash},
		{"the replacement failed to start", map[int]times{0: ran(1), 1: neverRan, 2: running}, 0, startFailed},
		{"the crash removed after a failed start", map[int]times{1: epochStart, 2: running}, 0, startFailed},
		{"only a failed start", map[int]times{0: neverRan, 1: running}, 0, startFailed},
		{"the crash removed by the kubelet's GC", map[int]times{1: running}, 0, crashRemoved},
		{"no crash, the first attempt running", map[int]times{0: running}, 0, noCrash},
	} {
		crash, next, found := crashAndReplacement(c.as)
		if found != c.found {
			t.Errorf("%s: found %d, want %d", c.name, found, c.found)
			continue
		}
		if found == replacementStarted && (crash != c.as[c.wantCrash] || next != c.as[c.wantCrash+1]) {
			t.Errorf("%s: picked %+v then %+v", c.name, crash, next)
		}
	}
}

func TestReplaced(t *testing.T) {
	for _, c := range []struct {
		exit, reason, restarts, running string
		want                            bool
	}{
		{"1", "Error", "1", "2026-11-26T22:00:00Z", true},
		{"1", "Error", "1", "", false},
		{"128", "StartError", "2", "2026-11-26T22:00:00Z", true},
		{"128", "StartError", "1", "2026-11-26T22:00:00Z", false}, // the first start failed; the crash is still to come
		{"", "", "0", "2026-11-26T22:00:00Z", false},
		// The crashed attempt removed by the kubelet's container GC: no last termination after a restart.
		{"", "", "1", "2026-11-26T22:00:00Z", true},
		{"", "", "1", "", false},
	} {
		if got := replaced(c.exit, c.reason, c.restarts, c.running); got != c.want {
			t.Errorf("replaced(%q, %q, %q, %q) = %v, want %v", c.exit, c.reason, c.restarts, c.running, got, c.want)
		}
	}
}

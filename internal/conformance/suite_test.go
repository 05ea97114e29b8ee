package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/dial"
)

// testOptions runs the suite against the fake quickly: a dropped event costs EventWait.
func testOptions(endpoint string, checks ...string) Options {
	return Options{Endpoint: endpoint, Image: "busybox", Checks: checks, Load: 5, SlowPods: 20,
		EventWait: time.Second, Quiet: 50 * time.Millisecond, ProbeWait: 200 * time.Millisecond,
		// The fake's pids are made up: never signal a real process.
		Kill: func(int, string) error { return syscall.EPERM }}
}

func run(t *testing.T, fr *fakeRuntime, opts Options) *Report {
	t.Helper()
	rep, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Cleanup != "" {
		t.Errorf("cleanup: %s", rep.Cleanup)
	}
	if n := fr.podCount(); n != 0 {
		t.Errorf("%d pods left behind", n)
	}
	return rep
}

// TestPauseKilled: the sandbox's STOPPED once after its pause process is killed passes; twice fails;
// a pause process the suite cannot kill skips.
func TestPauseKilled(t *testing.T) {
	for _, tc := range []struct {
		twice, cannot bool
		want          Outcome
	}{{false, false, Pass}, {true, false, Fail}, {false, true, Skip}} {
		fr, endpoint := newFake(t, faults{pauseStopTwice: tc.twice})
		opts := testOptions(endpoint, "once/pause-killed")
		opts.Kill = fr.kill
		if tc.cannot {
			opts.Kill = func(int, string) error { return syscall.EPERM }
		}
		rep := run(t, fr, opts)
		if r, _ := rep.Result("once/pause-killed"); r.Outcome != tc.want {
			t.Errorf("twice %v cannot %v: %+v, want %s", tc.twice, tc.cannot, r, tc.want)
		}
	}
}

// TestRuntimeRestart: a stream that ends at the restart passes, as one that stays open and carries
// what happened while the runtime was down and after; one that stays open and silent fails, as does
// one that stays open but never carries what happened while the runtime was down, and a runtime whose
// relist does not show it.
func TestRuntimeRestart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		f      faults
		want   Outcome
		figure string // of a pass; of a fail: the failure
	}{
		{"ends", faults{}, Pass, "ended with Unavailable; a new one stays open; ListContainers said EXITED"},
		{"survives", faults{restart: restartSurvives}, Pass, "stayed open; it carried the STOPPED of the container killed while the runtime was down"},
		{"hangs", faults{restart: restartHangs}, Fail, "did not carry the STOPPED of the container killed while the runtime was down"},
		{"survives but forgets", faults{restart: restartSurvivesForgetful}, Fail, "did not carry the STOPPED of the container killed while the runtime was down"},
		{"the relist misses it", faults{forgetWhileDown: true}, Fail, "ListContainers after the restart: it says the container killed while the runtime was down is CONTAINER_RUNNING"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fr, endpoint := newFake(t, tc.f)
			opts := testOptions(endpoint, "runtime-restart")
			opts.RestartRuntime, opts.Kill = fr.restart, fr.kill
			rep := run(t, fr, opts)
			r, _ := rep.Result("runtime-restart")
			got := r.Figure
			if tc.want == Fail {
				got = r.Failure
			}
			if r.Outcome != tc.want || !strings.Contains(got, tc.figure) {
				t.Errorf("%+v, want %s with %q", r, tc.want, tc.figure)
			}
		})
	}
	// A process the suite cannot kill from here skips the check.
	fr, endpoint := newFake(t, faults{})
	opts := testOptions(endpoint, "runtime-restart")
	opts.RestartRuntime = fr.restart
	if r, _ := run(t, fr, opts).Result("runtime-restart"); r.Outcome != Skip || !strings.Contains(r.Failure, "cannot kill") {
		t.Errorf("a process that cannot be killed: %+v", r)
	}
}

// TestLateSubscriber: a late subscriber's stream passes when it serves and replays well-formed
// events, as the endpoint declares; it fails when it replays otherwise, out of order, twice, goes
// silent after its replay, or when the runtime logs a line per event sent to nobody.
func TestLateSubscriber(t *testing.T) {
	for _, tc := range []struct {
		name   string
		f      faults
		expect Replay
		want   Outcome
		text   string // in the figure of a pass, the failure of a fail
	}{
		{"no replay, undeclared", faults{}, ReplayUndeclared, Pass, "replayed 0 of the 24 events"},
		{"no replay, as declared", faults{}, ReplayNone, Pass, "replayed 0 of the 24 events"},
		{"a replay, as declared", faults{holdUnheard: true}, ReplayAll, Pass, "replayed 24 of the 24 events sent while nobody listened (6 of 6 objects whole"},
		{"no replay, declared all", faults{}, ReplayAll, Fail, "got 0 of the 24 events sent while nobody listened, and the endpoint is said to replay them all"},
		{"a replay, declared none", faults{holdUnheard: true}, ReplayNone, Fail, "got 24 of the 24 events sent while nobody listened, and the endpoint is said to replay none"},
		{"a replay sent twice", faults{holdUnheard: true, replayTwice: true}, ReplayUndeclared, Fail, "came twice"},
		{"a replay newest first", faults{holdUnheard: true, replayReversed: true}, ReplayUndeclared, Fail, "created_at"},
		{"silent after its replay", faults{holdUnheard: true, lateHang: true}, ReplayUndeclared, Fail, "did not carry the STARTED of a pod run after it subscribed"},
		{"a log line per event sent to nobody", faults{logUnheard: true}, ReplayUndeclared, Fail, "a log line per event sent to nobody"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fr, endpoint := newFake(t, tc.f)
			opts := testOptions(endpoint, "late-subscriber")
			opts.ExpectReplay, opts.LogLines = tc.expect, fr.logLines
			rep := run(t, fr, opts)
			r, _ := rep.Result("late-subscriber")
			got := r.Figure
			if tc.want == Fail {
				got = r.Failure
			}
			if r.Outcome != tc.want || !strings.Contains(got, tc.text) {
				t.Errorf("%+v, want %s with %q", r, tc.want, tc.text)
			}
		})
	}
}

// TestCorrectStreamPasses: a stream that keeps the contract passes every check built, so a failure
// below is the fault's doing.
func TestCorrectStreamPasses(t *testing.T) {
	fr, endpoint := newFake(t, faults{})
	opts := testOptions(endpoint)
	opts.Kill, opts.RestartRuntime, opts.LogLines = fr.kill, fr.restart, fr.logLines
	rep := run(t, fr, opts)
	if len(rep.Results) != len(specs) {
		t.Fatalf("%d results, want %d", len(rep.Results), len(specs))
	}
	for _, r := range rep.Results {
		if r.Outcome != Pass {
			t.Errorf("%s: %s (%s; figure %q), want %s", r.ID, r.Outcome, r.Failure, r.Figure, Pass)
		}
	}
	if rep.Failed() {
		t.Error("the report says failed")
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !hasRow(buf.String(), "PASS", "once/exit-0") || !strings.Contains(buf.String(), fmt.Sprintf("%d passed, 0 failed, 0 skipped", len(specs))) {
		t.Errorf("table:\n%s", buf.String())
	}
	t.Logf("\n%s", buf.String())
}

// TestBrokenStreamsFail: each way of breaking the stream makes the check about it fail (the suite's
// own test: drop an event, reorder two, leave a status out, block a consumer, ...).
func TestBrokenStreamsFail(t *testing.T) {
	name := func(n string) func(string, runtimeapi.ContainerEventType) bool {
		return func(got string, typ runtimeapi.ContainerEventType) bool { return got == n && typ == stopped }
	}
	for _, tc := range []struct {
		name   string
		f      faults
		check  string
		reason string
	}{
		{"a STOPPED dropped", faults{drop: name(caseExit0)}, "once/exit-0", "STOPPED was received 0 times"},
		{"a STOPPED sent twice", faults{duplicate: name(caseExitNon0)}, "once/exit-nonzero", "STOPPED was received 2 times"},
		{"a StopContainer's STOPPED dropped", faults{drop: name(caseStop)}, "once/stop-container", "received 0 times"},
		{"an OOM kill's STOPPED dropped", faults{drop: name(caseOOM)}, "once/oom-kill", "received 0 times"},
		{"a StopPodSandbox's STOPPED dropped", faults{drop: name(casePodStop)}, "once/stop-pod", "received 0 times"},
		{"a failed start's DELETED dropped", faults{drop: func(n string, typ runtimeapi.ContainerEventType) bool { return n == caseStartFail && typ == deleted }}, "once/start-fails", "DELETED was received 0 times"},
		{"a sandbox STOPPED dropped", faults{drop: name("sandbox")}, "once/sandbox", "STOPPED was received 0 times"},
		{"CREATED and STARTED reordered", faults{reorder: caseExitNon0}, "order/container", "CREATED came after its STARTED"},
		{"the sandbox stopped before its containers", faults{sandboxStopFirst: true}, "order/pod", "came after the sandbox's STOPPED"},
		{"created_at in seconds", faults{seconds: true}, "order/created-at", "not nanoseconds"},
		{"no pod status", faults{nilPodStatus: true}, "content/pod-status", "no pod_sandbox_status"},
		{"a sandbox event with another id", faults{sandboxIDPrefix: "x"}, "content/sandbox-id", "no event has the sandbox id"},
		{"exited containers left out", faults{leaveOutExited: true}, "content/all-containers", "does not list"},
		{"a wrong reason", faults{wrongReason: true}, "content/stopped-status", `reason "Completed", want "Error"`},
		{"a timestamp without statuses", faults{timestampAlone: true}, "content/status-timestamp", "no containers_statuses"},
		{"ListContainers stale after a STOPPED", faults{staleList: true}, "read-after-event", "ListContainers says container"},
		{"a load container's DELETED dropped", faults{drop: func(n string, typ runtimeapi.ContainerEventType) bool { return n == "load-3" && typ == deleted }}, "load", "container load-3's DELETED was received 0 times"},
		{"a blocked consumer loses events silently", faults{queue: 100, delay: 2 * time.Millisecond}, "slow-consumer", "events lost silently"},
		{"a stream that ends at once", faults{endAtOnce: true}, "unsupported", "ended at once with EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fr, endpoint := newFake(t, tc.f)
			opts := testOptions(endpoint, tc.check)
			opts.SlowPods = 50 // 400 events: far more than the window and the fault's queue hold
			rep := run(t, fr, opts)
			r, ok := rep.Result(tc.check)
			if !ok {
				t.Fatalf("no result for %s: %+v", tc.check, rep.Results)
			}
			if r.Outcome != Fail || !strings.Contains(r.Failure, tc.reason) {
				t.Errorf("%s: %s %q (figure %q), want fail with %q", tc.check, r.Outcome, r.Failure, r.Figure, tc.reason)
			}
			if !rep.Failed() {
				t.Error("the report does not say failed")
			}
		})
	}
}

// TestUnsupportedStream: a runtime that says it does not serve events passes the check, and every
// other check skips saying why.
func TestUnsupportedStream(t *testing.T) {
	for _, code := range []codes.Code{codes.Unimplemented, codes.FailedPrecondition} {
		t.Run(code.String(), func(t *testing.T) {
			fr, endpoint := newFake(t, faults{subscribeErr: status.Error(code, "events are disabled")})
			rep := run(t, fr, testOptions(endpoint, "unsupported", "once/exit-0"))
			if r, _ := rep.Result("unsupported"); r.Outcome != Pass || !strings.Contains(r.Figure, "not served") {
				t.Errorf("unsupported: %+v", r)
			}
			if r, _ := rep.Result("once/exit-0"); r.Outcome != Skip || !strings.Contains(r.Failure, "does not serve events") {
				t.Errorf("once/exit-0: %+v", r)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Support
	}{
		{nil, Supported},
		{io.EOF, EndsAtOnce},
		{status.Error(codes.Unimplemented, ""), SaysUnsupported},
		{status.Error(codes.FailedPrecondition, ""), SaysUnsupported},
		{status.Error(codes.Unavailable, ""), EndsAtOnce},
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// TestInterruptedRunCleansUp: a run cancelled while its first pod runs skips the rest and removes
// every pod it made.
func TestInterruptedRunCleansUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fr, endpoint := newFake(t, faults{onRunPod: cancel})
	rep, err := Run(ctx, testOptions(endpoint))
	if err != nil {
		t.Fatal(err)
	}
	if n := fr.podCount(); n != 0 {
		t.Errorf("%d pods left behind", n)
	}
	if rep.Count(Pass) != 1 { // the probe's check ran before the first pod
		t.Errorf("%d checks passed, want 1 (unsupported)", rep.Count(Pass))
	}
	if r, _ := rep.Result("once/exit-0"); r.Outcome != Skip || !strings.Contains(r.Failure, "interrupted") {
		t.Errorf("the check the interrupt cut short: %+v, want a skip", r)
	}
	if r, _ := rep.Result("load"); r.Outcome != Skip || !strings.Contains(r.Failure, "interrupted") {
		t.Errorf("load after the interrupt: %+v", r)
	}
}

func TestOptions(t *testing.T) {
	if _, err := Run(context.Background(), Options{}); err == nil || !strings.Contains(err.Error(), "no image") {
		t.Errorf("no image: %v", err)
	}
	if _, err := Run(context.Background(), Options{Image: "x", Checks: []string{"nope"}}); err == nil || !strings.Contains(err.Error(), `no check is named "nope"`) {
		t.Errorf("unknown check: %v", err)
	}
	sock := "unix:///nonexistent/pleg-nri-conformance.sock"
	if _, err := Run(context.Background(), Options{Image: "x", Endpoint: sock}); err == nil || !strings.Contains(err.Error(), "cannot reach the CRI endpoint "+sock) {
		t.Errorf("no endpoint: %v", err)
	}
	o := Options{Image: "x"}
	if err := o.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if o.Endpoint != DefaultEndpoint || o.Namespace != DefaultNamespace || len(o.RunID) != 8 || o.Load != DefaultLoad {
		t.Errorf("defaults: %+v", o)
	}
	if got := selected([]string{"once", "load"}); len(got) != 9 || got[8].id != "load" {
		t.Errorf("once and load select %d checks", len(got))
	}
	if !matches("order/", "order/pod") || matches("order", "orderly") {
		t.Error("matches")
	}
}

// hasRow reports whether the table has a row of outcome and check.
func hasRow(table, outcome, check string) bool {
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == outcome && f[1] == check {
			return true
		}
	}
	return false
}

func TestReportJSON(t *testing.T) {
	rep := &Report{Endpoint: "e", RunID: "r", Results: []Result{{ID: "a", Outcome: Pass}, {ID: "b", Outcome: Fail, Failure: "x\ny"}}, Cleanup: "left"}
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil || len(back.Results) != 2 || back.Results[1].Failure != "x\ny" {
		t.Errorf("round trip: %v %+v", err, back)
	}
	buf.Reset()
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !hasRow(buf.String(), "FAIL", "b") || !strings.Contains(buf.String(), "x y") || !strings.Contains(buf.String(), "cleanup failed: left") {
		t.Errorf("table:\n%s", buf.String())
	}
	if !rep.Failed() {
		t.Error("a failed cleanup is a failed run")
	}
}

func TestKillChecksTheCgroup(t *testing.T) {
	if err := killInCgroup(os.Getpid(), "not-this-sandbox"); err == nil || !strings.Contains(err.Error(), "not in not-this-san's cgroup") {
		t.Errorf("killInCgroup of a process outside the sandbox: %v", err)
	}
	if err := killInCgroup(-5, "x"); err == nil {
		t.Error("killInCgroup of no process succeeded")
	}
}

// TestReadAfterRemoval: a read after a STOPPED that finds the object gone is stale, unless the suite
// had begun to remove it (a STOPPED that comes just before the removal, as pleg-nri's for a failed
// start: seen once on the harness).
func TestReadAfterRemoval(t *testing.T) {
	_, endpoint := newFake(t, faults{})
	opts := testOptions(endpoint)
	if err := opts.setDefaults(); err != nil {
		t.Fatal(err)
	}
	conn, err := dial.CRI(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	s := &suite{opts: opts, rt: rt, drv: newDriver(rt, &opts, opts.RunID)}
	s.drv.remember("removed-container", nil)
	ev := received{ev: &runtimeapi.ContainerEventResponse{ContainerId: "removed-container", ContainerEventType: stopped,
		PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: "removed-pod"}}}
	for _, removing := range []bool{false, true} {
		if removing {
			s.drv.removing("removed-container")
		}
		log := &readLog{}
		s.readAfter(context.Background(), ev, log)
		if removing != (len(log.violations) == 0) || log.checked != 1 {
			t.Errorf("removing %v: %d reads checked, violations %q", removing, log.checked, log.violations)
		}
	}
}

// TestReadAfterRemovalBetweenReads: a container removed between ContainerStatus and ListContainers
// (which then lists none of its id) is gone, not a stale read, once the suite has begun to remove it;
// a container the suite is not removing that vanishes so is one.
func TestReadAfterRemovalBetweenReads(t *testing.T) {
	for _, removing := range []bool{false, true} {
		fr, endpoint := newFake(t, faults{removedAfterStatus: true})
		fr.mu.Lock()
		fr.ctrs["vanishing"] = &fakeCtr{id: "vanishing", podID: "", state: runtimeapi.ContainerState_CONTAINER_EXITED,
			cfg: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "vanishing"}}}
		fr.mu.Unlock()
		opts := testOptions(endpoint)
		if err := opts.setDefaults(); err != nil {
			t.Fatal(err)
		}
		conn, err := dial.CRI(endpoint)
		if err != nil {
			t.Fatal(err)
		}
		rt := runtimeapi.NewRuntimeServiceClient(conn)
		s := &suite{opts: opts, rt: rt, drv: newDriver(rt, &opts, opts.RunID)}
		s.drv.remember("vanishing", nil)
		if removing {
			s.drv.removing("vanishing")
		}
		log := &readLog{}
		s.readAfter(context.Background(), received{ev: &runtimeapi.ContainerEventResponse{ContainerId: "vanishing", ContainerEventType: stopped}}, log)
		_ = conn.Close()
		if removing != (len(log.violations) == 0) {
			t.Errorf("removing %v: violations %q", removing, log.violations)
		}
	}
}

// TestSystemdCgroupParent: on a runtime whose cgroup driver is systemd (it refuses a sandbox without a
// parent slice, as runc does on a kind node) the default pods get systemdSlice and the checks pass;
// on a cgroupfs runtime they get no parent; a PodConfig of the caller's is left as it is.
func TestSystemdCgroupParent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		systemd bool
		config  func(string) *runtimeapi.PodSandboxConfig
		want    Outcome
		parent  string
	}{
		{"systemd", true, nil, Pass, systemdSlice},
		{"cgroupfs", false, nil, Pass, ""},
		{"the caller's config on systemd", true, func(string) *runtimeapi.PodSandboxConfig {
			return &runtimeapi.PodSandboxConfig{Linux: &runtimeapi.LinuxPodSandboxConfig{CgroupParent: "/mine"}}
		}, Fail, "/mine"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fr, endpoint := newFake(t, faults{systemd: tc.systemd})
			opts := testOptions(endpoint, "once/exit-0")
			opts.PodConfig = tc.config
			r, _ := run(t, fr, opts).Result("once/exit-0")
			if r.Outcome != tc.want {
				t.Errorf("once/exit-0: %+v, want %s", r, tc.want)
			}
			fr.mu.Lock()
			parents := slices.Clone(fr.parents)
			fr.mu.Unlock()
			if len(parents) == 0 {
				t.Fatal("no RunPodSandbox")
			}
			for _, p := range parents {
				if p != tc.parent {
					t.Errorf("a pod's cgroup parent is %q, want %q", p, tc.parent)
				}
			}
		})
	}
}

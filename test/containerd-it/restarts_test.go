package containerdit

// Restarts of pleg-nri and of containerd under one subscriber of pleg-nri's CRI endpoint. The endpoint
// belongs to the front, which the restarts of the core (the `pleg-nri` process a service manager runs)
// do not touch: the subscriber's stream stays open across all of them, and holds every transition
// exactly once, but for the events the checkpoint allows again after a SIGKILL (at-least-once), which
// the test names.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/internal/testutil/plegnribin"
	"github.com/pleg-nri/pleg-nri/pleg"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// coreSocket is the core's event socket (beside the front's CRI socket).
func (p *plegNRI) coreSocket() string { return filepath.Join(p.RunDir, "core.sock") }

// frontPID returns the front's pid, failing the test if no front answers.
func (p *plegNRI) frontPID(t testing.TB) int {
	t.Helper()
	pid, err := p.FrontPID()
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// killPoint is a SIGKILL of the core: what its checkpoint held, and how many events the subscriber had
// when the core died and when the next one was ready.
type killPoint struct {
	step       string
	base       map[string]pleg.Phase
	at, resume int
}

// TestRestartsKeepStream: one subscriber of pleg-nri's endpoint, opened before anything, while pods
// churn and, in each step, a container exits while the restarted process is down: the core stopped
// (SIGTERM) and started, killed (SIGKILL) and started, upgraded to a different binary and back, and
// containerd stopped and killed and started again. The stream never ends; every exit in a gap comes as a
// STOPPED on it; the front is the same process all along; the calls forwarded through it never fail
// while only the core restarts (UNAVAILABLE only while containerd is down); and against containerd's
// final state the stream holds every transition, each once, except events the checkpoint had not
// recorded when a SIGKILL came, which are named.
func TestRestartsKeepStream(t *testing.T) {
	logOnFailure(t)
	upgraded := plegnribin.Binary(t, plegnribin.Upgraded)
	logStart := env.LogSize()
	prefix := "restarts-" + randomSuffix()
	p := startPlegNRI(t)
	front := p.frontPID(t)
	ours := recordEvents(t, p.Socket)
	calls := startPoller(t, p.Socket)
	direct := newFastCRI(t)
	gapPod, gapCfg := direct.runPod(prefix + "-gap")
	ch := startChurn(t, prefix, 2)
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	pause := func() { time.Sleep(time.Duration(200+r.IntN(600)) * time.Millisecond) }

	steps := []string{"core SIGTERM", "core SIGKILL", "core upgrade", "containerd SIGTERM", "core SIGKILL",
		"containerd SIGKILL", "core downgrade"}
	var kills []killPoint
	// containerd's outages: from the signal to the first forwarded call that succeeds after it is back.
	var outages []outage
	for i, step := range steps {
		time.Sleep(time.Duration(500+r.IntN(1000)) * time.Millisecond)
		// A container that exits while the process is down.
		gap := direct.startRetrying(t, gapPod, gapCfg, containerConfig(fmt.Sprintf("gap-%d", i), "sleep 3600"))
		pid := containerPid(t, gap)
		// It exits while the process is down.
		exit := func() {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("%s: kill the gap container's process %d: %v", step, pid, err)
			}
		}
		switch step {
		case "core SIGTERM":
			p.stop()
			exit()
			pause()
			p.start(t)
		case "core SIGKILL":
			p.kill()
			ck, err := pleg.ReadCheckpoint(filepath.Join(p.stateDir(), "checkpoint"))
			if err != nil {
				t.Fatalf("%s: the checkpoint: %v", step, err)
			}
			k := killPoint{step: step, base: map[string]pleg.Phase{}, at: len(ours.Events())}
			for _, o := range ck.Objects {
				k.base[o.ID] = o.Phase
			}
			exit()
			pause()
			p.start(t)
			k.resume = len(ours.Events())
			kills = append(kills, k)
		case "core upgrade", "core downgrade":
			p.stop()
			if step == "core upgrade" {
				p.SetBinary(upgraded)
			} else {
				p.SetBinary(plegNRIBinary)
			}
			exit()
			p.start(t)
		case "containerd SIGTERM", "containerd SIGKILL":
			o := outage{down: time.Now()}
			stop := env.Stop
			if step == "containerd SIGKILL" {
				stop = env.Kill
			}
			if err := stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			exit()
			pause()
			if err := env.Start(context.Background()); err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			o.up = time.Now()
			outages = append(outages, o)
		}
		ev := ours.wait(t, gap, evStopped)
		// containerd reports an exit it did not see (it was down) as 255, reason Unknown.
		if st := statusOf(ev, gap); strings.HasPrefix(step, "core") && st.GetExitCode() != 137 {
			t.Errorf("%s: the STOPPED of the container that exited in the gap: %v", step, st)
		}
		if now := p.frontPID(t); now != front {
			t.Fatalf("%s: the front is pid %d, was %d: it must outlive every restart", step, now, front)
		}
		if err := ours.Err(); err != nil {
			t.Fatalf("%s: the subscriber's stream ended: %v", step, err)
		}
		t.Logf("step %d (%s): done; %d events so far", i+1, step, len(ours.Events()))
	}
	if v, err := p.Metric("pleg_nri_subscribers"); err != nil || v != 1 {
		t.Errorf("the last core has %v subscribers (%v), want 1: the front's", v, err)
	}
	time.Sleep(time.Second)
	ch.halt()
	calls.halt()
	t.Logf("churn: %s", ch)

	uncertain := ch.uncertain()
	if n := sandboxesUnknown(logStart, uncertain); n > 0 {
		t.Logf("containerd could not load the status of %d sandboxes at a restart (reported NOTREADY, then READY again)", n)
	}
	rec := func() map[string]map[runtimeapi.ContainerEventType]int { return counts(ours.Events(), prefix) }
	rs := func() runtimeState { return readRuntime(t, prefix, uncertain) }
	// The checkpoint's known loss after a SIGKILL: an object whose CREATED came after the checkpoint's
	// last write and that was gone before the next core ran; nobody can tell its end. Such gone objects
	// are not checked (present ones always are), and are counted.
	unseen := map[string]bool{}
	for _, kp := range kills {
		evs := ours.Events()
		later := map[string]bool{}
		for _, ev := range evs[kp.resume:] {
			later[ev.ContainerId] = true
		}
		deleted := map[string]bool{}
		for _, ev := range evs[:kp.resume] {
			if ev.ContainerEventType == evDeleted {
				deleted[ev.ContainerId] = true
			}
		}
		for _, ev := range evs[:kp.resume] {
			if _, known := kp.base[ev.ContainerId]; !known && !later[ev.ContainerId] && !deleted[ev.ContainerId] {
				unseen[ev.ContainerId] = true
			}
		}
	}
	if problems := waitLives(t, rec, rs, false, unseen); len(problems) > 0 {
		t.Errorf("the stream against containerd's final state (%d problems):\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	if err := ours.Err(); err != nil {
		t.Errorf("the subscriber's stream ended: %v", err)
	}

	// Every duplicate must be one the checkpoint allows: its first copy came before a SIGKILL's new
	// core was ready, and that kill's checkpoint did not hold it.
	evs := ours.Events()
	type key struct {
		id  string
		typ runtimeapi.ContainerEventType
	}
	first := map[key]int{}
	var dups []string
	interruptedRemoval := map[string]bool{}
	for id, types := range ch.uncertain() {
		interruptedRemoval[id] = slices.Contains(types, evDeleted)
	}
	for i, ev := range evs {
		if !strings.HasPrefix(ev.GetPodSandboxStatus().GetMetadata().GetName(), prefix) {
			continue
		}
		k := key{ev.ContainerId, ev.ContainerEventType}
		f, seen := first[k]
		if !seen {
			first[k] = i
			continue
		}
		// A corrected STOPPED (containerd's final answer differs from the exit's fast facts in what the
		// kubelet reads, e.g. 255/Unknown for a container that exited while containerd was down: issue
		// 11) is not a duplicate: counts (faults_test.go) does not count it either.
		if k.typ == evStopped && k.id != ev.GetPodSandboxStatus().GetId() &&
			exitFieldsDiffer(statusOf(evs[f], k.id), statusOf(ev, k.id)) {
			dups = append(dups, fmt.Sprintf("%s of %s (events %d and %d): a corrected STOPPED, not a duplicate", k.typ, short(k.id), f, i))
			first[k] = i
			continue
		}
		explained := ""
		for _, kp := range kills {
			if f < kp.resume && i >= kp.at && eventPhase(k.typ) > kp.base[k.id] {
				explained = fmt.Sprintf("received before the %s (event %d), after its checkpoint's last write (it held %s)", kp.step, kp.at, kp.base[k.id])
				break
			}
		}
		// containerd tells NRI of a removal before it deletes the object from its store: killed in
		// between (the churn's removal call failed), it lists the object again once it is back, and
		// pleg-nri, which had sent its DELETED, reports it again from CREATED on.
		if explained == "" && interruptedRemoval[k.id] && deletedBetween(evs, k.id, f, i) {
			explained = "containerd was killed during its removal, after it told NRI: it listed the container again after its restart"
		}
		if explained == "" {
			t.Errorf("%s of %s twice (events %d and %d), which no checkpoint allows", k.typ, short(k.id), f, i)
			continue
		}
		dups = append(dups, fmt.Sprintf("%s of %s (events %d and %d): %s", k.typ, short(k.id), f, i, explained))
	}
	untold := 0
	final := rs()
	for id := range unseen {
		if _, present := final.want[id]; !present && rec()[id][evDeleted] == 0 {
			untold++
		}
	}
	t.Logf("events on the stream: %d; at-least-once duplicates after SIGKILLs: %d; objects gone with their end untold (created after a SIGKILLed core's last checkpoint write, gone before the next core): %d",
		len(evs), len(dups), untold)
	for _, d := range dups {
		t.Logf("  duplicate: %s", d)
	}

	// Forwarded calls: only containerd's outages may fail them (UNAVAILABLE, or a deadline while it
	// starts); the core's restarts do not touch them.
	calls.mu.Lock()
	fails, oks := calls.fails, calls.oks
	t.Logf("forwarded calls through the front: %d, %d failed", calls.calls, calls.failures)
	for i := range outages {
		for _, at := range oks {
			if !at.Before(outages[i].up) {
				outages[i].recovered = at
				break
			}
		}
	}
	for _, f := range fails {
		in := false
		for _, o := range outages {
			if !f.at.Before(o.down) && (o.recovered.IsZero() || !f.start.After(o.recovered)) {
				in = true
			}
		}
		if !in || (f.code != codes.Unavailable && f.code != codes.DeadlineExceeded) {
			t.Errorf("a forwarded call failed outside containerd's outages (%s): %s", f.code, f.err)
		}
	}
	calls.mu.Unlock()
}

// TestFrontTakeover: a front that must be replaced (here by `pleg-nri front --takeover`, what a core
// does with a front of another protocol) hands its listening socket to its successor: the socket never
// goes away (a client dialing all along never fails to connect), the old front's open stream ends once
// (with UNAVAILABLE), a stream opened on the new front gets the events, and the old front exits.
func TestFrontTakeover(t *testing.T) {
	logOnFailure(t)
	p := startPlegNRI(t)
	old := p.frontPID(t)
	before := recordEvents(t, p.Socket)
	// Dial all along: the socket must always accept.
	stopDial := make(chan struct{})
	dialFails := make(chan error, 1)
	var dialWG sync.WaitGroup
	dialWG.Add(1)
	go func() {
		defer dialWG.Done()
		for {
			select {
			case <-stopDial:
				return
			case <-time.After(2 * time.Millisecond):
			}
			c, err := net.Dial("unix", p.Socket)
			if err != nil {
				select {
				case dialFails <- err:
				default:
				}
				continue
			}
			c.Close()
		}
	}()
	// Started as a core starts a front: detached, its output to the front's log once it serves.
	successor := exec.Command(plegNRIBinary, "front", "--listen", "unix://"+p.Socket, "--runtime-endpoint", "unix://"+env.Address,
		"--run-dir", p.RunDir, "--takeover", "--log-file", filepath.Join(p.RunDir, "front.log"))
	successor.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := successor.Start(); err != nil {
		t.Fatalf("start the successor: %v", err)
	}
	// Reaped when it ends (the test's cleanup stops it).
	reaped := make(chan struct{})
	go func() { _ = successor.Wait(); close(reaped) }()
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
		<-reaped
	})
	newPID := 0
	err := harness.WaitFor(context.Background(), 20*time.Second, "a new front to answer after the takeover", func() (bool, error) {
		pid, err := p.FrontPID()
		newPID = pid
		return err == nil && pid != old, err
	})
	if err != nil {
		t.Fatalf("%v; log:\n%s", err, p.FrontLog())
	}
	if err := testutil.WaitGone(context.Background(), old, 20*time.Second); err != nil {
		t.Fatalf("the old front still runs after the takeover: %v", err)
	}
	close(stopDial)
	dialWG.Wait()
	select {
	case err := <-dialFails:
		t.Errorf("a connection to the socket failed during the takeover: %v", err)
	default:
	}
	err = harness.WaitFor(context.Background(), 10*time.Second, "the old front's stream to end", func() (bool, error) {
		return before.Err() != nil, nil
	})
	if err != nil || status.Code(before.Err()) != codes.Unavailable {
		t.Errorf("the old front's stream: %v, want it ended with UNAVAILABLE (the one cost of a takeover)", before.Err())
	}
	after := recordEvents(t, p.Socket)
	c := newCRI(t, p.Socket)
	podID, podCfg := c.runPod("takeover-" + randomSuffix())
	ctr := c.create(podID, podCfg, containerConfig("app", "exit 3"))
	c.start(ctr)
	after.wait(t, ctr, evStopped)
	c.stopPod(podID)
	c.removePod(podID)
	after.wait(t, podID, evDeleted)
	t.Logf("front pid %d took the socket over from pid %d", newPID, old)
}

// BenchmarkFrontProxy measures forwarded unary calls (Version, ListContainers) two ways, interleaved:
// direct to containerd and through the front (the kubelet's endpoint). (Until 2026-12-06 a third side
// went through the core's socket, which then forwarded with the same proxy: it forwards nothing now,
// see corelink.Core; docs/restarts.md keeps those figures.)
func BenchmarkFrontProxy(b *testing.B) {
	p := startPlegNRI(b, benchPlegFlags...)
	sides := []struct {
		name string
		rt   runtimeapi.RuntimeServiceClient
		us   []float64
	}{
		{name: "direct", rt: benchRuntime(b, env.Address)},
		{name: "front", rt: benchRuntime(b, p.Socket)},
	}
	id, cfg := benchRunPod(b, sides[0].rt, "bench-front-"+randomSuffix())
	for j := range 3 {
		c := harness.ContainerConfig(fmt.Sprintf("sleeper-%d", j), "sleep 3600")
		resp, err := sides[0].rt.CreateContainer(b.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: id, Config: c, SandboxConfig: cfg})
		if err != nil {
			b.Fatalf("CreateContainer: %v", err)
		}
		if _, err := sides[0].rt.StartContainer(b.Context(), &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			b.Fatalf("StartContainer: %v", err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	for _, method := range []string{"Version", "ListContainers"} {
		call := func(rt runtimeapi.RuntimeServiceClient) float64 {
			start := time.Now()
			var err error
			if method == "Version" {
				_, err = rt.Version(b.Context(), &runtimeapi.VersionRequest{})
			} else {
				_, err = rt.ListContainers(b.Context(), &runtimeapi.ListContainersRequest{})
			}
			if err != nil {
				b.Fatalf("%s: %v", method, err)
			}
			return float64(time.Since(start).Nanoseconds()) / 1e3
		}
		for i := range sides {
			sides[i].us = nil
		}
		for range proxyWarmup {
			for _, s := range sides {
				call(s.rt)
			}
		}
		for i := range proxyCalls {
			// Rotate the order, so that no side always follows another.
			for k := range sides {
				s := &sides[(i+k)%len(sides)]
				s.us = append(s.us, call(s.rt))
			}
		}
		d50 := benchreport.Median(sides[0].us)
		f50 := benchreport.Median(sides[1].us)
		b.ReportMetric(f50-d50, method+"-front-added-p50-us")
		b.Logf("%s (%d calls each, interleaved): direct p50 %.0f µs; front p50 %.0f µs (+%.0f)", method, proxyCalls, d50, f50, f50-d50)
	}
	b.ReportMetric(0, "ns/op")
}

// deletedBetween says whether evs holds a DELETED of id after event from and before event to.
func deletedBetween(evs []*runtimeapi.ContainerEventResponse, id string, from, to int) bool {
	for _, ev := range evs[from+1 : to] {
		if ev.ContainerId == id && ev.ContainerEventType == evDeleted {
			return true
		}
	}
	return false
}

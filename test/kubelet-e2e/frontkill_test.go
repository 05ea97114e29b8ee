package kubelete2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
)

// frontKills is how many times TestFrontKillsUnderKubelet kills the front: each costs the kubelet one
// end of its event stream (its connection was the dead process's), and the kubelet gives up on events
// for good after 5 in its life.
const frontKills = 4

// TestFrontKillsUnderKubelet (issue 56) SIGKILLs pleg-nri's front, the process that serves every CRI
// call of the node, frontKills times under a running kubelet (setup 3), with a container exiting right
// after each kill. The core starts a new front on the same socket at once: the kubelet's calls recover
// (it restarts the container that exited, within restartLagLimit), each kill costs it exactly one stream
// end (evented_pleg_connection_error_count rises by one, never more), the kubelet reconnects, and at the
// end it still takes events from pleg-nri. (A call in flight at the kill fails: the pods all run before
// the kills, so that none is.) Before the front supervisor the first kill took the node's
// runtime endpoint away for good: the container was never restarted.
func TestFrontKillsUnderKubelet(t *testing.T) {
	n := startNode(t, setupEventedPlegNRI)
	for i := range frontKills + 1 {
		if err := n.k.WritePod(gapPod(fmt.Sprintf("fkill%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// Every pod runs before the first kill: a call in flight when the front dies fails (the kubelet's
	// StartContainer then reads EOF, and the kubelet stops and starts that container again, one more
	// restart), which is the cost of a front's death, not what this test counts.
	for i := range frontKills + 1 {
		n.waitPod(fmt.Sprintf("fkill%d", i), "running", running)
	}
	before := n.plegMetrics()
	t.Logf("before the kills: %s", before)
	var lags []time.Duration
	for i := range frontKills {
		name := fmt.Sprintf("fkill%d", i)
		p := n.waitPod(name, "running", running)
		pid := n.waiterPID(p)
		front, err := n.p.FrontPID()
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(front, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		n.triggerExit(p, pid)
		n.waitPod(name, "waiter restarted once and running", restartedTo("waiter", 1))
		lags = append(lags, time.Since(killed))
		if now, err := n.p.FrontPID(); err != nil || now == front {
			t.Errorf("kill %d: the front is pid %d (%v), the killed one was %d", i+1, now, err, front)
		}
		m := n.streamBackAfterFrontKill(i+1, before, i+1)
		t.Logf("kill %d: container restarted %s after the kill; %s", i+1, lags[i].Round(time.Millisecond), m)
	}

	// The kubelet still acts on pleg-nri's events.
	after := n.plegMetrics()
	last := n.waitPod(fmt.Sprintf("fkill%d", frontKills), "running", running)
	n.triggerExit(last, n.waiterPID(last))
	n.waitPod(fmt.Sprintf("fkill%d", frontKills), "waiter restarted once and running", restartedTo("waiter", 1))
	final := n.plegMetrics()
	t.Logf("after the kills: %s", final)
	if final.EventsReceived <= after.EventsReceived {
		t.Errorf("the kubelet received no event after the kills: %s, then %s", after, final)
	}
	if final.ConnError != before.ConnError+frontKills {
		t.Errorf("the kubelet's stream errors went from %g to %g in %d kills, want one per kill", before.ConnError, final.ConnError, frontKills)
	}
	if c := n.k.CountLog("disabling container-termination fast path"); c > 0 {
		t.Errorf("the kubelet disabled its container-termination fast path")
	}
	t.Logf("front SIGKILL to the exited container's restart: %v", lags)
}

// TestFrontHungUnderKubelet freezes pleg-nri's front (SIGSTOP: alive, its control connection to the
// core open, serving nothing) under a running kubelet (setup 3), with a container exiting right after.
// Every CRI call of the kubelet waits in the frozen front; the core finds it silent on the endpoint,
// kills it after 10 s and starts the next: the kubelet's calls recover, it restarts the container
// that exited (within restartLagLimit of the freeze), its event stream ended once and it reconnected,
// and it still takes events from pleg-nri. Before the core checked the front, every call waited until
// the kubelet's own 2 min timeout, and again after it, for as long as the front stayed frozen.
func TestFrontHungUnderKubelet(t *testing.T) {
	n := startNode(t, setupEventedPlegNRI)
	for _, name := range []string{"fhung0", "fhung1"} {
		if err := n.k.WritePod(gapPod(name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"fhung0", "fhung1"} {
		n.waitPod(name, "running", running)
	}
	before := n.plegMetrics()
	p := n.waitPod("fhung0", "running", running)
	pid := n.waiterPID(p)
	front, err := n.p.FrontPID()
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(front, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	t.Cleanup(func() { _ = syscall.Kill(front, syscall.SIGCONT) })
	n.triggerExit(p, pid)
	n.waitPod("fhung0", "waiter restarted once and running", restartedTo("waiter", 1))
	lag := time.Since(frozen)
	if lag > restartLagLimit {
		t.Errorf("the container that exited while the front was frozen was restarted %s after the freeze, want within %s", lag.Round(time.Millisecond), restartLagLimit)
	}
	if now, err := n.p.FrontPID(); err != nil || now == front {
		t.Errorf("the front is pid %d (%v), the frozen one was %d", now, err, front)
	}
	m := n.streamBackAfterFrontKill(1, before, 1)
	t.Logf("front frozen: the container restarted %s after the freeze; %s", lag.Round(time.Millisecond), m)

	// The kubelet still acts on pleg-nri's events.
	last := n.waitPod("fhung1", "running", running)
	n.triggerExit(last, n.waiterPID(last))
	n.waitPod("fhung1", "waiter restarted once and running", restartedTo("waiter", 1))
	if final := n.plegMetrics(); final.EventsReceived <= m.EventsReceived {
		t.Errorf("the kubelet received no event after the front's replacement: %s, then %s", m, final)
	}
}

// streamBackAfterFrontKill checks the kubelet's event stream after the kill-th front kill of a test,
// the kills-th of this kubelet's life since before: it was ended once per kill (no more), and it
// connected again (within restartLagLimit). It returns the kubelet's metrics then.
func (n *node) streamBackAfterFrontKill(kill int, before plegMetrics, kills int) plegMetrics {
	n.t.Helper()
	err := testutil.Poll(context.Background(), restartLagLimit, "the kubelet to reconnect its event stream", func() (bool, error) {
		return n.plegMetrics().ConnSuccess >= before.ConnSuccess+float64(kills), nil
	})
	m := n.plegMetrics()
	if err != nil {
		n.t.Errorf("kill %d: %v: %s", kill, err, m)
	}
	if m.ConnError != before.ConnError+float64(kills) {
		n.t.Errorf("kill %d: the kubelet's stream errors went from %g to %g in %d kills of this kubelet's life, want one per kill",
			kill, before.ConnError, m.ConnError, kills)
	}
	return m
}

// coreGraceInTest is the core-grace TestCoreGoneUnderKubelet gives pleg-nri (20 s by default): short,
// so that the test is, and still well above the time a core takes to restart.
const coreGraceInTest = 3 * time.Second

// TestCoreGoneUnderKubelet (issue 56): pleg-nri's core is SIGKILLed and nothing restarts it (a
// pre-registered plugin whose containerd never relaunches it), then a container exits. The front ends
// the kubelet's event stream with UNAVAILABLE once no core has served it for core-grace: a 1.35/1.36
// kubelet relists at each stream error and so restarts the container within the grace and a relist
// (not at its 300 s evented relist); a 1.37 kubelet relists every second anyway. The stream ended, and
// the kubelet reconnected. Before core-grace a 1.36 kubelet's stream stayed open and silent, and the
// exit waited for its 300 s relist.
func TestCoreGoneUnderKubelet(t *testing.T) {
	n := startNode(t, setupEventedPlegNRI, nodeOptions{plegNRIFlags: []string{"--core-grace", coreGraceInTest.String()}})
	if err := n.k.WritePod(gapPod("coregone")); err != nil {
		t.Fatal(err)
	}
	p := n.waitPod("coregone", "running", running)
	before := n.plegMetrics()
	n.p.Kill()
	killed := time.Now()
	n.triggerExit(p, n.waiterPID(p))
	n.waitPod("coregone", "waiter restarted once and running", restartedTo("waiter", 1))
	lag := time.Since(killed)
	after := n.plegMetrics()
	t.Logf("core SIGKILL, then an exit: the container restarted %s after the kill (core-grace %s); before %s; after %s",
		lag.Round(time.Millisecond), coreGraceInTest, before, after)
	if !eventsTriggerRelist() && lag > coreGraceInTest+restartLagLimit {
		t.Errorf("the kubelet restarted the container %s after the core's end, more than core-grace %s and %s", lag.Round(time.Millisecond), coreGraceInTest, restartLagLimit)
	}
	// The stream ends after the grace whatever the kubelet's version.
	err := testutil.Poll(context.Background(), coreGraceInTest+restartLagLimit, "the kubelet's stream to end", func() (bool, error) {
		return n.plegMetrics().ConnError > before.ConnError, nil
	})
	if err != nil {
		t.Errorf("%v: %s", err, n.plegMetrics())
	}
	// The core back: the kubelet's stream carries events again.
	if err := n.p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestSoakFrontKillsUnderKubelet (PLEG_NRI_SOAK=1, issue 56) is TestFrontKillsUnderKubelet at the
// issue's size and at random moments: PLEG_NRI_SOAK_KILLS (10) SIGKILLs of the front, each at a random
// moment from 400 ms before to 600 ms after a container's exit (so that some land while the kubelet
// stops and starts that container, some while the exit is on its way), while a crasher pod
// crash-loops beside. A kubelet gives up on events after 5 stream ends in its life and a front's death
// costs one, so the kubelet is restarted after every frontKills kills (a kubelet restart is how an
// operator resets it: KubeletEventedPLEGGaveUp). Per kill: the container restarted (a call in flight
// at the kill fails, and the kubelet may restart that container once more or back off: counted, not
// failed), a new front, exactly one stream end, the stream back.
func TestSoakFrontKillsUnderKubelet(t *testing.T) {
	kills := soakKills(t)
	n := startNode(t, setupEventedPlegNRI)
	crasher := kubelet.Pod{Name: "crasher", Containers: []kubelet.Container{{Name: "crash", Script: "sleep 1; exit 1"}}}
	if err := n.k.WritePod(crasher); err != nil {
		t.Fatal(err)
	}
	for i := range kills {
		if err := n.k.WritePod(gapPod(fmt.Sprintf("fsoak%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range kills {
		n.waitPod(fmt.Sprintf("fsoak%d", i), "running", running)
	}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, seed>>7))
	t.Logf("random moments from seed %d", seed)

	ctx := context.Background()
	before, life, lives := n.plegMetrics(), 0, 1
	var lags []time.Duration
	var extraRestarts int32
	for i := range kills {
		if life == frontKills {
			// A new kubelet life: its metrics start from nothing.
			n.k.Stop()
			if err := n.k.Start(ctx); err != nil {
				t.Fatal(err)
			}
			err := testutil.Poll(ctx, restartLagLimit, "the restarted kubelet's event stream", func() (bool, error) {
				return n.metric(metricConnSuccess) >= 1, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			before, life = n.plegMetrics(), 0
			lives++
		}
		name := fmt.Sprintf("fsoak%d", i)
		p := n.waitPod(name, "running", running)
		pid := n.waiterPID(p)
		front, err := n.p.FrontPID()
		if err != nil {
			t.Fatal(err)
		}
		kill := func() time.Time {
			if err := syscall.Kill(front, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			return time.Now()
		}
		offset := time.Duration(rng.IntN(1000)-400) * time.Millisecond
		var killed, exited time.Time
		if offset < 0 {
			killed = kill()
			time.Sleep(-offset)
			n.triggerExit(p, pid)
			exited = time.Now()
		} else {
			n.triggerExit(p, pid)
			exited = time.Now()
			time.Sleep(offset)
			killed = kill()
		}
		var restarts int32
		n.waitPod(name, "waiter restarted and running", func(p *kubelet.PodStatus) (bool, error) {
			c := p.Container("waiter")
			if c == nil || c.State.Running == nil || c.RestartCount < 1 {
				return false, nil
			}
			restarts = c.RestartCount
			return true, nil
		})
		lags = append(lags, time.Since(exited))
		extraRestarts += restarts - 1
		// A new front: the kubelet may have restarted the container before the kill (an exit before
		// it), so the new front may still be starting.
		var now int
		err = testutil.Poll(ctx, restartLagLimit, "a new front", func() (bool, error) {
			now, err = n.p.FrontPID()
			return err == nil && now != front, nil
		})
		if err != nil {
			t.Errorf("kill %d: %v: the front is pid %d, the killed one was %d", i+1, err, now, front)
		}
		m := n.streamBackAfterFrontKill(i+1, before, life+1)
		t.Logf("kill %d (kubelet life %d, the exit %s after the kill): container restarted %s after its exit, %d restarts; %s",
			i+1, lives, exited.Sub(killed).Round(time.Millisecond), lags[i].Round(time.Millisecond), restarts, m)
		life++
	}
	if c := n.k.CountLog("disabling container-termination fast path"); c > 0 {
		t.Errorf("the kubelet disabled its container-termination fast path")
	}
	sorted := slices.Clone(lags)
	slices.Sort(sorted)
	t.Logf("%d front SIGKILLs in %d kubelet lives: the exited container restarted after its exit: min %s, median %s, max %s; %d restarts beyond one (a call in flight at a kill)",
		kills, lives, sorted[0].Round(time.Millisecond), sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond), extraRestarts)
}

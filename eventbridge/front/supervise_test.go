package front

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/promutil"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// supervisorLog records what a Supervisor tells its hooks.
type supervisorLog struct {
	mu   sync.Mutex
	seen []string
}

func (l *supervisorLog) add(s string) { l.mu.Lock(); l.seen = append(l.seen, s); l.mu.Unlock() }

func (l *supervisorLog) FrontUp(up bool) {
	if up {
		l.add("up")
	} else {
		l.add("down")
	}
}
func (l *supervisorLog) FrontGone()      { l.add("gone") }
func (l *supervisorLog) FrontRespawned() { l.add("respawned") }
func (l *supervisorLog) FrontHung()      { l.add("hung") }

func (l *supervisorLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.seen)
}

// TestSupervisorReplacesAKilledFront (issue 56, here as a unit test of the supervisor with real
// processes: the front is this test binary, see TestMain): a SIGKILLed front is replaced by a new one
// on the same socket, whose file never goes away; a call made while no front runs waits in the kept
// socket's backlog and is answered; the hooks hear the front go and come back.
func TestSupervisorReplacesAKilledFront(t *testing.T) {
	n := newNode(t)
	ctx, cfg, first, s, hooks := startSupervised(t, n, nil)

	// The socket file is watched every millisecond from the kill until a new front answers.
	sock := filepath.Join(n.dir, "cri.sock")
	var missing []time.Duration
	watchDone := make(chan struct{})
	stopWatch := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(watchDone)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(time.Millisecond):
			}
			if _, err := os.Lstat(sock); err != nil {
				missing = append(missing, time.Since(start))
			}
		}
	}()
	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Made at once: it waits for the next front if it comes before the kill took effect's end.
	if err := listAcross(ctx, cfg); err != nil {
		t.Errorf("a call across the kill: %v; want the runtime's answer", err)
	}
	next := nextFront(t, ctx, cfg, s, first)
	close(stopWatch)
	<-watchDone
	if len(missing) > 0 {
		t.Errorf("the socket file was missing %d times after the kill (first at %s)", len(missing), missing[0])
	}
	if testutil.Alive(first.PID) {
		t.Errorf("the killed front %d still runs", first.PID)
	}
	if got, want := hooks.snapshot(), []string{"up", "gone", "down", "respawned", "up"}; !slices.Equal(got, want) {
		t.Errorf("the hooks heard %q, want %q", got, want)
	}
	t.Logf("front %d killed, front %d serving %s after", first.PID, next.PID, time.Since(start).Round(time.Millisecond))
}

// startSupervised starts a core on n, a front, and a supervisor of that front (changed by tune before
// it runs, if not nil), and waits until the supervisor watches the front. Everything stops when the
// test ends.
func startSupervised(t *testing.T, n *node, tune func(*Supervisor)) (context.Context, Config, Info, *Supervisor, *supervisorLog) {
	t.Helper()
	n.startCore(t)
	cfg := n.config()
	ctx, cancel := context.WithCancel(context.Background())
	if err := Ensure(ctx, cfg, false); err != nil {
		t.Fatal(err)
	}
	first, err := Query(cfg.RunDir, "info")
	if err != nil {
		t.Fatal(err)
	}
	hooks := &supervisorLog{}
	s := NewSupervisor(cfg, false, hooks)
	if tune != nil {
		tune(s)
	}
	select {
	case <-s.Watching():
		t.Fatal("Watching is closed before the supervisor runs")
	default:
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := Stop(cfg.RunDir); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	select {
	case <-s.Watching():
	case <-time.After(waitTimeout):
		t.Fatal("the supervisor did not watch the front")
	}
	if !s.Up() {
		t.Fatal("Watching is closed but the supervisor says no front is up")
	}
	return ctx, cfg, first, s, hooks
}

// listAcross calls ListContainers on cfg's endpoint, on a new connection, within waitTimeout (a call
// across a front's fault), and fails unless the runtime's answer (one container) comes back.
func listAcross(ctx context.Context, cfg Config) error {
	conn, err := dial.CRI(cfg.Listen)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	list, err := runtimeapi.NewRuntimeServiceClient(conn).ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err == nil && len(list.GetContainers()) != 1 {
		err = fmt.Errorf("answered %v", list)
	}
	return err
}

// nextFront waits until a front other than first serves cfg's endpoint and s says it is up, and
// returns it.
func nextFront(t *testing.T, ctx context.Context, cfg Config, s *Supervisor, first Info) Info {
	t.Helper()
	var next Info
	if err := testutil.Poll(ctx, waitTimeout, "a new front", func() (bool, error) {
		var err error
		next, err = Query(cfg.RunDir, "info")
		return err == nil && next.PID != first.PID && s.Up(), err
	}); err != nil {
		t.Fatal(err)
	}
	return next
}

// TestSupervisorKillsAHungFront: a front that stops answering on the kubelet's endpoint (here frozen
// with SIGSTOP: its control connection stays open) is killed once it has been silent for hangTimeout
// and replaced on the same socket; a call made while it was frozen is answered by the next front. A
// front that serves is never killed, however often it is checked.
func TestSupervisorKillsAHungFront(t *testing.T) {
	n := newNode(t)
	const hang = time.Second
	ctx, cfg, first, s, hooks := startSupervised(t, n, func(s *Supervisor) {
		s.probeInterval, s.probeTimeout, s.hangTimeout = 50*time.Millisecond, 200*time.Millisecond, hang
	})
	// Serving: checked 60 times in 3 hang timeouts, never killed.
	time.Sleep(3 * hang)
	if got := hooks.snapshot(); !slices.Equal(got, []string{"up"}) {
		t.Fatalf("a serving front: the hooks heard %q, want only %q", got, "up")
	}
	if !testutil.Alive(first.PID) {
		t.Fatalf("the serving front %d was killed", first.PID)
	}

	if err := syscall.Kill(first.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Cleanup(func() { _ = syscall.Kill(first.PID, syscall.SIGCONT) })
	// The call must reach the frozen front, not one of its threads still running: a connection the
	// front accepted is reset when it is killed (the kubelet's calls on it fail once and are retried).
	if err := testutil.Poll(ctx, waitTimeout, "the front's threads to stop", func() (bool, error) {
		return testutil.Stopped(first.PID), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := listAcross(ctx, cfg); err != nil {
		t.Fatalf("a call to the frozen front: %v; want the runtime's answer from the next front", err)
	}
	answered := time.Since(stopped)
	if answered < hang {
		t.Errorf("the call was answered %s after the front froze, before the supervisor could have found it hung (%s)", answered, hang)
	}
	next := nextFront(t, ctx, cfg, s, first)
	if err := testutil.WaitGone(ctx, first.PID, waitTimeout); err != nil {
		t.Errorf("the frozen front: %v", err)
	}
	if got, want := hooks.snapshot(), []string{"up", "hung", "gone", "down", "respawned", "up"}; !slices.Equal(got, want) {
		t.Errorf("the hooks heard %q, want %q", got, want)
	}
	t.Logf("front %d frozen, the call answered by front %d %s after", first.PID, next.PID, answered.Round(time.Millisecond))
}

// TestSupervisorMetrics: the supervisor's hooks are the core's metrics of the front.
func TestSupervisorMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewSupervisorMetrics(reg)
	m.FrontUp(true)
	m.FrontGone()
	m.FrontRespawned()
	m.FrontHung()
	m.FrontUp(false)
	var b strings.Builder
	if err := promutil.Write(&b, reg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pleg_nri_front_up 0", "pleg_nri_front_respawns_total 1", "pleg_nri_front_hung_kills_total 1"} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Errorf("the metrics lack %s:\n%s", want, b.String())
		}
	}
}

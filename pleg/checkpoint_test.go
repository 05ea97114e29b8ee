package pleg

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// ckptMetrics records the checkpoint's metrics on top of countingMetrics.
type ckptMetrics struct {
	*countingMetrics
	mu       sync.Mutex
	loaded   []string // results of CheckpointLoaded
	restored int
	writes   int
	errs     int
	dropped  int
	emitted  map[Source]int
}

func newCkptMetrics() *ckptMetrics {
	return &ckptMetrics{countingMetrics: newCountingMetrics(), emitted: map[Source]int{}}
}

func (m *ckptMetrics) CheckpointLoaded(n int, result string) {
	m.mu.Lock()
	m.loaded = append(m.loaded, result)
	m.restored = n
	m.mu.Unlock()
}

func (m *ckptMetrics) CheckpointWritten(_, _ int, _ time.Duration, err error) {
	m.mu.Lock()
	m.writes++
	if err != nil {
		m.errs++
	}
	m.mu.Unlock()
}

func (m *ckptMetrics) StartupReplayDropped() { m.mu.Lock(); m.dropped++; m.mu.Unlock() }

func (m *ckptMetrics) EventEmitted(t runtimeapi.ContainerEventType, k Kind, src Source, d time.Duration) {
	m.countingMetrics.EventEmitted(t, k, src, d)
	m.mu.Lock()
	m.emitted[src]++
	m.mu.Unlock()
}

const testScope = "unix:///run/containerd/containerd.sock"

// newProcess is one pleg-nri process of a restart test: a PLEG with a checkpoint at path, on a runtime
// (cri) and a clock that outlive it. Unlike newHarness it makes no relist: the first one is the test's
// startup reconciliation.
func newProcess(t testing.TB, cri *fakeCRI, clock *testutil.Clock, path string, mod ...func(*Config)) (*harness, *ckptMetrics) {
	t.Helper()
	m := newCkptMetrics()
	h := &harness{t: t, ctx: context.Background(), clock: clock, cri: cri, metrics: m.countingMetrics}
	cfg := Config{Status: cri, Lister: cri, Clock: clock.Now, Metrics: m, SubscriberQueue: 1 << 16,
		SubscriberStallTimeout: -1, CheckpointPath: path, CheckpointScope: testScope} // as newHarness
	for _, f := range mod {
		f(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.p = p
	h.sub = p.Subscribe()
	return h, m
}

// nriSync delivers what NRI's Synchronize reports after a (re)connect: every sandbox, and every
// container not exited.
func (h *harness) nriSync() {
	sbs, _ := h.cri.ListPodSandbox(h.ctx)
	ctrs, _ := h.cri.ListContainers(h.ctx)
	now := h.clock.Now()
	for _, sb := range sbs {
		ph := PhaseNone
		if sb.State == runtimeapi.PodSandboxState_SANDBOX_READY {
			ph = PhaseRunning
		}
		o := nriSandbox(sb.Id, ph, now)
		o.Source = SourceNRISync
		h.p.Observe(o)
	}
	for _, c := range ctrs {
		if ph := containerStatePhase(c.State); ph == PhaseCreated || ph == PhaseRunning {
			o := nriContainer(c.Id, c.PodSandboxId, ph, now)
			o.Source = SourceNRISync
			h.p.Observe(o)
		}
	}
	h.p.drain(h.ctx)
}

// restart is a restarted pleg-nri's startup: NRI's Synchronize, the startup reconciliation, the status
// calls. It returns the events.
func (h *harness) restart() []Event {
	h.t.Helper()
	h.nriSync()
	if _, err := h.p.Relist(h.ctx); err != nil {
		h.t.Fatal(err)
	}
	h.settle()
	return h.events()
}

func (h *harness) mustWriteCheckpoint() {
	h.t.Helper()
	h.p.writeCheckpoint(h.ctx)
	if _, err := os.Stat(h.p.cfg.CheckpointPath); err != nil {
		h.t.Fatalf("no checkpoint written: %v", err)
	}
}

// TestRestartFromCheckpoint: a pleg-nri restarted from its checkpoint emits exactly what changed while
// it was down, with exact statuses, and nothing for what did not change (no status call either).
func TestRestartFromCheckpoint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "checkpoint")
	clock, cri := testutil.NewClock(), newFakeCRI()
	h, _ := newProcess(t, cri, clock, path)
	if _, err := h.p.Relist(h.ctx); err != nil {
		t.Fatal(err)
	}
	before := h.startPod("s1", "c1", "c2", "c3", "c4")
	before = append(before, h.startPod("s2", "c5")...)
	before = append(before, h.startPod("s3", "c7")...)
	// c4 exited and was seen exiting; c8 is only created.
	h.clock.Advance(time.Millisecond)
	h.cri.exitContainer("c4", 0, h.clock.Now())
	h.observe(nriExit("c4", "s1", 0, h.clock.Now(), h.clock.Now()))
	h.settle()
	h.clock.Advance(time.Millisecond)
	cri.createContainer("c8", "s3", clock.Now()) // created on the runtime, never started
	h.observe(nriContainer("c8", "s3", PhaseCreated, clock.Now()))
	h.settle()
	inv := checkStream(t, nil, append(before, h.events()...))
	h.mustWriteCheckpoint()
	inv.restart(checkpointBaseline(path))

	// pleg-nri is down. The runtime goes on.
	clock.Advance(time.Minute)
	now := clock.Now()
	cri.exitContainer("c1", 3, now)      // exits: STOPPED with its exit code
	cri.removeContainer("c2")            // vanishes while running: STOPPED (255 Unknown), DELETED
	cri.startContainer("c8", now)        // starts: STARTED
	cri.createContainer("c6", "s1", now) // new: CREATED, STARTED
	cri.startContainer("c6", now.Add(time.Millisecond))
	cri.exitContainer("c5", 137, now) // a whole pod goes away
	cri.stopSandbox("s2")
	cri.removeContainer("c5")
	cri.removeSandbox("s2")

	h2, m2 := newProcess(t, cri, clock, path)
	if got := m2.loaded; !slices.Equal(got, []string{CheckpointRestored}) || m2.restored != 10 {
		t.Fatalf("checkpoint load: %v, %d objects restored", got, m2.restored)
	}
	calls := cri.statusCalls()
	evs := h2.restart()
	want := []string{"STARTED c8", "STOPPED c5", "DELETED c5", "STOPPED s2", "DELETED s2", "STOPPED c2", "DELETED c2", "STOPPED c1", "CREATED c6", "STARTED c6"}
	if d := cmp.Diff(sorted(want), sorted(summary(evs))); d != "" {
		t.Fatalf("events after the restart (-want +got):\n%s\nall: %v", d, summary(evs))
	}
	// The status calls: c1 (exit code), c6 (new), c8 (start time): none for the unchanged objects.
	if n := cri.statusCalls() - calls; n != 3 {
		t.Errorf("%d status calls after the restart, want 3 (c1, c6, c8)", n)
	}
	for _, ev := range evs {
		r := ev.Response
		// The contract goes on across the restart: created_at after the pod's last event before it,
		// nothing the checkpoint holds emitted again, the restored containers in every status list.
		if msg := inv.check(ev); msg != "" {
			t.Errorf("%s: %s", summary([]Event{ev})[0], msg)
		}
		if ev.Source != SourceStartup && ev.Source != SourceNRISync {
			t.Errorf("%s: source %s, want startup or nri_sync", summary([]Event{ev})[0], ev.Source)
		}
		switch r.ContainerId {
		case "c1":
			if d := diffProto(cri.container("c1"), statusOf(ev, "c1")); d != "" {
				t.Errorf("c1 STOPPED status (-cri +event):\n%s", d)
			}
		case "c2":
			if r.ContainerEventType == runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
				if st := statusOf(ev, "c2"); st.GetExitCode() != exitCodeUnknown || st.GetReason() != reasonUnknown {
					t.Errorf("c2 vanished while running: %v", st)
				}
			}
		}
		// Every event of s1 lists its restored containers, with the statuses they had (c4 exited).
		if r.PodSandboxStatus.Id == "s1" && statusOf(ev, "c4").GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Errorf("%s does not carry the restored c4: %v", summary([]Event{ev})[0], r.ContainersStatuses)
		}
	}
	if n := len(h2.metrics.repairs); n != 0 {
		t.Errorf("the startup reconciliation counted relist repairs: %v", h2.metrics.repairs)
	}
	// A second relist is quiet.
	if _, err := h2.p.Relist(h2.ctx); err != nil {
		t.Fatal(err)
	}
	h2.settle()
	if evs := h2.events(); len(evs) != 0 {
		t.Errorf("relist after the restart: %v", summary(evs))
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestRestartUnchanged: nothing changed while pleg-nri was down: no event at all, and the relist makes
// no status call.
func TestRestartUnchanged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint")
	clock, cri := testutil.NewClock(), newFakeCRI()
	h, _ := newProcess(t, cri, clock, path)
	h.startPod("s1", "c1", "c2")
	h.startPod("s2")
	h.clock.Advance(time.Millisecond)
	h.cri.exitContainer("c2", 1, h.clock.Now())
	h.observe(nriExit("c2", "s1", 1, h.clock.Now(), h.clock.Now()))
	h.settle()
	h.events()
	h.mustWriteCheckpoint()
	h2, _ := newProcess(t, cri, clock, path)
	calls := cri.statusCalls()
	if evs := h2.restart(); len(evs) != 0 {
		t.Errorf("events after a restart with nothing changed: %v", summary(evs))
	}
	if n := cri.statusCalls() - calls; n != 0 {
		t.Errorf("%d status calls", n)
	}
	// The restored state carries on: the next event has every container's status.
	clock.Advance(time.Millisecond)
	cri.exitContainer("c1", 0, clock.Now())
	h2.observe(taskExit("c1", 0, clock.Now()))
	h2.settle()
	evs := h2.events()
	if d := cmp.Diff([]string{"STOPPED c1"}, summary(evs)); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	if d := diffProto([]*runtimeapi.ContainerStatus{cri.container("c1"), cri.container("c2")}, evs[0].Response.ContainersStatuses); d != "" {
		t.Errorf("statuses (-cri +event):\n%s", d)
	}
}

// TestCheckpointDeliveryWatermark: the checkpoint records only what every subscriber received: an
// event still queued when pleg-nri dies is emitted again by the next one (at-least-once), a deleted
// object stays in the checkpoint until its DELETED is received.
func TestCheckpointDeliveryWatermark(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint")
	clock, cri := testutil.NewClock(), newFakeCRI()
	h, _ := newProcess(t, cri, clock, path)
	h.startPod("s1", "c1", "c2")
	h.mustWriteCheckpoint()
	read := func() map[string]Phase {
		t.Helper()
		c, err := ReadCheckpoint(path)
		if err != nil {
			t.Fatal(err)
		}
		if c.Scope != testScope {
			t.Errorf("scope %q", c.Scope)
		}
		out := map[string]Phase{}
		for _, o := range c.Objects {
			out[o.ID] = o.Phase
		}
		return out
	}
	if d := cmp.Diff(map[string]Phase{"s1": PhaseRunning, "c1": PhaseRunning, "c2": PhaseRunning}, read()); d != "" {
		t.Fatalf("checkpoint (-want +got):\n%s", d)
	}
	// c1 exits, c2 is removed: their events wait in the subscriber's queue.
	clock.Advance(time.Millisecond)
	cri.exitContainer("c1", 2, clock.Now())
	h.observe(nriExit("c1", "s1", 2, clock.Now(), clock.Now()))
	h.settle()
	cri.exitContainer("c2", 0, clock.Now())
	h.observe(nriExit("c2", "s1", 0, clock.Now(), clock.Now()))
	h.settle()
	cri.removeContainer("c2")
	h.observe(nriContainer("c2", "s1", PhaseRemoved, clock.Now()))
	h.settle()
	h.mustWriteCheckpoint()
	if d := cmp.Diff(map[string]Phase{"s1": PhaseRunning, "c1": PhaseRunning, "c2": PhaseRunning}, read()); d != "" {
		t.Fatalf("checkpoint with the events queued (-want +got):\n%s", d)
	}
	// Killed now: the next pleg-nri emits them again.
	h2, _ := newProcess(t, cri, clock, path)
	if d := cmp.Diff(sorted([]string{"STOPPED c1", "STOPPED c2", "DELETED c2"}), sorted(summary(h2.restart()))); d != "" {
		t.Errorf("events after a restart with events queued (-want +got):\n%s", d)
	}
	// Once received, they are recorded (and c2 is gone from the checkpoint).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := h.sub.Next(ctx); err != nil { // STOPPED c1
		t.Fatal(err)
	}
	h.mustWriteCheckpoint()
	if d := cmp.Diff(map[string]Phase{"s1": PhaseRunning, "c1": PhaseExited, "c2": PhaseRunning}, read()); d != "" {
		t.Errorf("checkpoint after one event received (-want +got):\n%s", d)
	}
	h.events()
	h.mustWriteCheckpoint()
	if d := cmp.Diff(map[string]Phase{"s1": PhaseRunning, "c1": PhaseExited}, read()); d != "" {
		t.Errorf("checkpoint after every event received (-want +got):\n%s", d)
	}
	if len(h.p.st.unacked) != 0 {
		t.Errorf("deleted objects still kept: %d", len(h.p.st.unacked))
	}
	// A subscriber that goes away does not hold the checkpoint back.
	late := h.p.Subscribe()
	h.startPod("s4")
	h.events()
	h.mustWriteCheckpoint()
	if read()["s4"] != PhaseNone {
		t.Errorf("s4 recorded while a subscriber has not received it")
	}
	late.Close()
	h.mustWriteCheckpoint()
	if read()["s4"] != PhaseRunning {
		t.Errorf("s4 not recorded after the lagging subscriber left")
	}
}

// TestCheckpointStopping: once pleg-nri is stopping, an event its subscribers did not take is not
// recorded as received: one still queued when the stream ended, and one emitted after it (an NRI
// callback still in flight). The next pleg-nri emits both. (A fresh-clone make test lost a CREATED
// emitted after the core's stream had ended on an upgrade: the checkpoint recorded it, with no subscriber
// left to hold it back.)
func TestCheckpointStopping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint")
	clock, cri := testutil.NewClock(), newFakeCRI()
	h, _ := newProcess(t, cri, clock, path)
	h.startPod("s1", "c1")
	h.mustWriteCheckpoint()

	h.p.Stopping()
	clock.Advance(time.Millisecond)
	cri.exitContainer("c1", 2, clock.Now())
	h.observe(nriExit("c1", "s1", 2, clock.Now(), clock.Now()))
	h.settle()
	h.sub.Close() // the stream ends with STOPPED c1 queued
	h.startPod("s2", "c2")
	h.mustWriteCheckpoint()

	c, err := ReadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Phase{}
	for _, o := range c.Objects {
		got[o.ID] = o.Phase
	}
	if d := cmp.Diff(map[string]Phase{"s1": PhaseRunning, "c1": PhaseRunning}, got); d != "" {
		t.Errorf("checkpoint written while stopping (-want +got):\n%s", d)
	}
	h2, _ := newProcess(t, cri, clock, path)
	want := []string{"STOPPED c1", "CREATED s2", "STARTED s2", "CREATED c2", "STARTED c2"}
	if d := cmp.Diff(sorted(want), sorted(summary(h2.restart()))); d != "" {
		t.Errorf("events of the next pleg-nri (-want +got):\n%s", d)
	}
}

// TestCheckpointUnusable: a checkpoint that cannot be used is set aside and ignored: pleg-nri starts as
// without one (every object is new) and never fails.
func TestCheckpointUnusable(t *testing.T) {
	clock, cri := testutil.NewClock(), newFakeCRI()
	good := filepath.Join(t.TempDir(), "checkpoint")
	h, _ := newProcess(t, cri, clock, good)
	h.startPod("s1", "c1")
	h.mustWriteCheckpoint()
	valid, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	version := bytes.Clone(valid)
	binary.LittleEndian.PutUint32(version[8:], checkpointVersion+1)
	flipped := bytes.Clone(valid)
	flipped[len(flipped)/2] ^= 0x40
	for name, data := range map[string][]byte{
		"empty":     {},
		"garbage":   []byte("this is not a checkpoint, not at all"),
		"truncated": valid[:len(valid)-7],
		"flipped":   flipped,
		"version":   version,
		"header":    valid[:checkpointHeader],
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "checkpoint")
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			checkFresh(t, cri, clock, path)
		})
	}
	t.Run("other runtime", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "checkpoint")
		if err := os.WriteFile(path, valid, 0o600); err != nil {
			t.Fatal(err)
		}
		m := newCkptMetrics()
		p, err := New(Config{Status: cri, Lister: cri, Clock: clock.Now, Metrics: m, CheckpointPath: path, CheckpointScope: "unix:///other.sock"})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(m.loaded, []string{CheckpointUnusable}) || len(p.st.objects) != 0 {
			t.Errorf("a checkpoint of another runtime was used: %v, %d objects", m.loaded, len(p.st.objects))
		}
	})
	t.Run("symlink", func(t *testing.T) {
		// A valid checkpoint, but through a symbolic link: not pleg-nri's own file, not used, and what
		// it names is left alone.
		target := filepath.Join(t.TempDir(), "elsewhere")
		if err := os.WriteFile(target, valid, 0o600); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "checkpoint")
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
		checkFresh(t, cri, clock, path)
		if got, err := os.ReadFile(target); err != nil || !bytes.Equal(got, valid) {
			t.Errorf("the file the link named changed: %v", err)
		}
	})
	t.Run("absent", func(t *testing.T) {
		_, m := newProcess(t, cri, clock, filepath.Join(t.TempDir(), "new", "checkpoint"))
		if !slices.Equal(m.loaded, []string{CheckpointAbsent}) {
			t.Errorf("loaded %v", m.loaded)
		}
	})
}

// checkFresh starts a PLEG on an unusable checkpoint and checks it behaves as on a first start.
// (A header with an empty payload decodes: an empty checkpoint of no scope, i.e. of another runtime.)
func checkFresh(t *testing.T, cri *fakeCRI, clock *testutil.Clock, path string) {
	t.Helper()
	h, m := newProcess(t, cri, clock, path)
	if !slices.Equal(m.loaded, []string{CheckpointUnusable}) {
		t.Fatalf("loaded %v, want unusable", m.loaded)
	}
	if _, err := os.Stat(path + ".unusable"); err != nil {
		t.Errorf("the unusable checkpoint was not set aside: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the unusable checkpoint is still in place: %v", err)
	}
	if d := cmp.Diff(sorted([]string{"CREATED s1", "STARTED s1", "CREATED c1", "STARTED c1"}), sorted(summary(h.restart()))); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
	h.mustWriteCheckpoint()
	if _, err := ReadCheckpoint(path); err != nil {
		t.Errorf("the checkpoint written after an unusable one: %v", err)
	}
}

// TestCheckpointRoundTrip: every field survives encoding and decoding, and the restored state is the
// state that was written.
func TestCheckpointRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint")
	clock, cri := testutil.NewClock(), newFakeCRI()
	h, _ := newProcess(t, cri, clock, path)
	h.startPod("s1", "c1", "c2")
	h.startPod("s2", "c3")
	clock.Advance(time.Millisecond)
	// c2: OOM-killed, the OOM known after the STOPPED: a corrected STOPPED.
	cri.exitContainer("c2", 137, clock.Now())
	h.observe(nriExit("c2", "s1", 137, clock.Now(), clock.Now()))
	h.settle()
	cri.oomContainer("c2")
	h.observe(taskOOM("c2", clock.Now()))
	h.settle()
	cri.stopSandbox("s2")
	h.observe(nriSandbox("s2", PhaseExited, clock.Now()))
	h.settle()
	h.events()
	h.mustWriteCheckpoint()
	h2, _ := newProcess(t, cri, clock, path)
	if len(h.p.st.objects) != len(h2.p.st.objects) || len(h2.p.st.objects) != 5 {
		t.Fatalf("%d objects restored, %d written", len(h2.p.st.objects), len(h.p.st.objects))
	}
	for id, o := range h.p.st.objects {
		r := h2.p.st.objects[id]
		if r == nil {
			t.Errorf("%s not restored", id)
			continue
		}
		type view struct {
			Kind                       Kind
			Pod                        string
			Phase, Emitted             Phase
			Started, Exited, Corrected bool
			Created                    int64
			StoppedReason              string
		}
		v := func(o *object) view {
			return view{o.kind, o.pod.id, o.phase, o.emitted, o.started, o.exited, o.corrected, o.created, o.stoppedReason}
		}
		if d := cmp.Diff(v(o), v(r)); d != "" {
			t.Errorf("%s (-written +restored):\n%s", id, d)
		}
		if d := diffProto(o.ctrSent, r.ctrSent); d != "" {
			t.Errorf("%s container status (-written +restored):\n%s", id, d)
		}
		if d := diffProto(o.sbSent, r.sbSent); d != "" {
			t.Errorf("%s sandbox status (-written +restored):\n%s", id, d)
		}
	}
	for id, p := range h.p.st.pods {
		r := h2.p.st.pods[id]
		if r == nil || r.lastEvent != p.lastEvent || len(r.listed) != len(p.listed) {
			t.Errorf("pod %s: restored %+v", id, r)
			continue
		}
		for i := range p.listed {
			if p.listed[i].id != r.listed[i].id {
				t.Errorf("pod %s: listed %s, restored %s", id, p.listed[i].id, r.listed[i].id)
			}
		}
	}
	if !h2.p.st.objects["c2"].corrected || h2.p.st.objects["c2"].stoppedReason != reasonOOMKilled {
		t.Errorf("c2's correction not restored")
	}
}

// TestCheckpointWriter: Run writes the checkpoint after changes (at most once per interval) and once
// more when it ends; a failing write is retried.
func TestCheckpointWriter(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint")
	cri := newFakeCRI()
	m := newCkptMetrics()
	p, err := New(Config{Status: cri, Lister: cri, Metrics: m, RelistPeriod: time.Hour, CheckpointPath: path,
		CheckpointScope: testScope, CheckpointInterval: 5 * time.Millisecond, VerifyDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	defer stop()
	phases := func() map[string]Phase {
		c, err := ReadCheckpoint(path)
		if err != nil {
			return nil
		}
		out := map[string]Phase{}
		for _, o := range c.Objects {
			out[o.ID] = o.Phase
		}
		return out
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, what, cond)
	}
	now := time.Now()
	cri.runSandbox("s1", now)
	p.Observe(nriSandbox("s1", PhaseRunning, now))
	waitFor("s1 in the checkpoint", func() bool { return phases()["s1"] == PhaseRunning })
	// A write that fails (the directory is gone) is retried.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	cri.createContainer("c1", "s1", now)
	p.Observe(nriContainer("c1", "s1", PhaseCreated, now))
	waitFor("a failed write", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.errs > 0 })
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	waitFor("c1 in the checkpoint", func() bool { return phases()["c1"] == PhaseCreated })
	// The last write of a clean shutdown.
	cri.startContainer("c1", now)
	o := nriContainer("c1", "s1", PhaseRunning, now)
	o.StartedAt = now
	p.Observe(o)
	stop()
	if got := phases()["c1"]; got != PhaseRunning {
		t.Errorf("after a clean shutdown the checkpoint says c1 %s", got)
	}
}

// TestNewCheckpointDirUnusable: a checkpoint path whose directory cannot be made is an error of New.
func TestNewCheckpointDirUnusable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Status: newFakeCRI(), CheckpointPath: filepath.Join(file, "checkpoint")}); err == nil {
		t.Error("New accepted a checkpoint under a file")
	}
}

// TestStartupReplay: a subscriber that subscribes within StartupReplay after the startup reconciliation
// gets every event since the start, then the new ones; after that window only the new ones.
func TestStartupReplay(t *testing.T) {
	clock, cri := testutil.NewClock(), newFakeCRI()
	m := newCkptMetrics()
	p, err := New(Config{Status: cri, Lister: cri, Clock: clock.Now, Metrics: m, StartupReplay: time.Minute, SubscriberQueue: 8})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, ctx: context.Background(), clock: clock, cri: cri, metrics: m.countingMetrics, p: p}
	cri.runSandbox("s1", clock.Now())
	cri.createContainer("c1", "s1", clock.Now())
	if _, err := p.Relist(h.ctx); err != nil { // the startup reconciliation finds them
		t.Fatal(err)
	}
	h.settle()
	first := p.Subscribe()
	want := []string{"CREATED s1", "STARTED s1", "CREATED c1"}
	if d := cmp.Diff(want, summary(pending(first))); d != "" {
		t.Errorf("first subscriber within the window (-want +got):\n%s", d)
	}
	clock.Advance(30 * time.Second)
	cri.startContainer("c1", clock.Now())
	o := nriContainer("c1", "s1", PhaseRunning, clock.Now())
	o.StartedAt = clock.Now()
	h.observe(o)
	second := p.Subscribe()
	if d := cmp.Diff(append(want, "STARTED c1"), summary(pending(second))); d != "" {
		t.Errorf("second subscriber within the window (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"STARTED c1"}, summary(pending(first))); d != "" {
		t.Errorf("first subscriber after it subscribed (-want +got):\n%s", d)
	}
	clock.Advance(31 * time.Second)
	p.drain(h.ctx)
	if p.fan.replay.open.Load() {
		t.Fatal("the replay is kept after its window")
	}
	if evs := pending(p.Subscribe()); len(evs) != 0 {
		t.Errorf("subscriber after the window got %v", summary(evs))
	}
	first.Close()
	second.Close()
}

// TestStartupReplayOverflow: a replay full of distinct pods is dropped, with a metric; one with several
// events of a pod is coalesced first.
func TestStartupReplayOverflow(t *testing.T) {
	clock, cri := testutil.NewClock(), newFakeCRI()
	m := newCkptMetrics()
	p, err := New(Config{Status: cri, Lister: cri, Clock: clock.Now, Metrics: m, StartupReplay: time.Minute, SubscriberQueue: 4})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, ctx: context.Background(), clock: clock, cri: cri, metrics: m.countingMetrics, p: p}
	h.sub = p.Subscribe()  // from the start: takes an empty replay, which goes on
	h.startPod("s1", "c1") // 4 events of one pod: the queue is full
	h.startPod("s2")       // coalesced: s1's newest and s2's two... then full of distinct pods
	if m.dropped != 0 {
		t.Fatalf("replay dropped too early")
	}
	s := p.Subscribe()
	if d := cmp.Diff([]string{"STARTED c1", "CREATED s2", "STARTED s2"}, summary(pending(s))); d != "" {
		t.Errorf("coalesced replay (-want +got):\n%s", d)
	}
	s.Close()
	h.startPod("s3")
	h.startPod("s4")
	h.startPod("s5")
	if m.dropped != 1 || p.fan.replay.open.Load() {
		t.Errorf("replay of 5 distinct pods in 4 places: dropped %d, open %v", m.dropped, p.fan.replay.open.Load())
	}
	if evs := pending(p.Subscribe()); len(evs) != 0 {
		t.Errorf("subscriber after the replay was dropped got %v", summary(evs))
	}
}

// TestStartupReplayHoldsCheckpoint: events kept for subscribers yet to come are not recorded as
// received until one subscriber got them.
func TestStartupReplayHoldsCheckpoint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint")
	clock, cri := testutil.NewClock(), newFakeCRI()
	m := newCkptMetrics()
	p, err := New(Config{Status: cri, Lister: cri, Clock: clock.Now, Metrics: m, StartupReplay: time.Minute,
		CheckpointPath: path, CheckpointScope: testScope})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, ctx: context.Background(), clock: clock, cri: cri, metrics: m.countingMetrics, p: p}
	cri.runSandbox("s1", clock.Now())
	h.observe(nriSandbox("s1", PhaseRunning, clock.Now()))
	h.settle()
	h.mustWriteCheckpoint()
	if c, err := ReadCheckpoint(path); err != nil || len(c.Objects) != 0 {
		t.Fatalf("checkpoint with the replay untaken: %v, %v", c, err)
	}
	s := p.Subscribe()
	h.mustWriteCheckpoint()
	if c, _ := ReadCheckpoint(path); len(c.Objects) != 0 {
		t.Errorf("checkpoint with the replay queued for a subscriber: %v", c.Objects)
	}
	pending(s)
	h.mustWriteCheckpoint()
	if c, _ := ReadCheckpoint(path); len(c.Objects) != 1 || c.Objects[0].Phase != PhaseRunning {
		t.Errorf("checkpoint after the replay was received: %v", c.Objects)
	}
	s.Close()
}

// BenchmarkCheckpoint measures the checkpoint of 1000 containers (250 pods of 4): the snapshot under
// the lock, the encoding (cold: every status marshalled; warm: unchanged statuses reused) and the
// durable write.
func BenchmarkCheckpoint(b *testing.B) {
	clock, cri := testutil.NewClock(), newFakeCRI()
	h, _ := newProcess(b, cri, clock, filepath.Join(b.TempDir(), "checkpoint"))
	for i := range 250 {
		sb := fmt.Sprintf("sandbox-%03d-%s", i, "0123456789abcdef0123456789abcdef0123456789abcdef")
		var ctrs []string
		for j := range 4 {
			ctrs = append(ctrs, fmt.Sprintf("container-%03d-%d-%s", i, j, "0123456789abcdef0123456789abcdef0123456789ab"))
		}
		h.startPod(sb, ctrs...)
	}
	snap := func() *checkpoint {
		h.p.mu.Lock()
		defer h.p.mu.Unlock()
		return h.p.st.snapshot(h.p.fan.delivered(), testScope, clock.Now())
	}
	c := snap()
	if c.objects() != 1250 {
		b.Fatalf("%d objects", c.objects())
	}
	data, cache, err := encodeCheckpoint(c, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("snapshot", func(b *testing.B) {
		for b.Loop() {
			snap()
		}
	})
	b.Run("encode-cold", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := encodeCheckpoint(c, nil); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(data)), "bytes")
	})
	b.Run("encode-warm", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := encodeCheckpoint(c, cache); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("write", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "checkpoint")
		for b.Loop() {
			if err := writeCheckpointFile(path, data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode-restore", func(b *testing.B) {
		for b.Loop() {
			c, err := decodeCheckpoint(data)
			if err != nil {
				b.Fatal(err)
			}
			st := newState(clock.Now, NopMetrics{}, newFetcher(clock.Now), newFanout(4, NopMetrics{}), -1)
			st.restore(c)
		}
	})
}

// TestNewRemovesCheckpointTemps: the temporary files a crash left beside the checkpoint (a write
// that did not reach its rename) are removed when a core starts; other files are left alone.
func TestNewRemovesCheckpointTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint")
	ours := []string{".checkpoint.tmp-123456", ".checkpoint.tmp-"}
	others := []string{"checkpoint.unusable", ".other.tmp-1", "checkpoint.tmp-1", StateLockName}
	for _, name := range append(append([]string{}, ours...), others...) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := New(Config{Status: newFakeCRI(), CheckpointPath: path, CheckpointScope: testScope}); err != nil {
		t.Fatal(err)
	}
	var left []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	sort.Strings(left)
	want := append([]string{}, others...)
	sort.Strings(want)
	if !reflect.DeepEqual(left, want) {
		t.Errorf("left in the state directory: %v, want %v", left, want)
	}
}

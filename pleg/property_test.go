package pleg

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// chooser drives a world: a seeded rand (property test) or the fuzzer's bytes.
type chooser interface {
	intn(n int) int
}

type randChooser struct{ r *rand.Rand }

func (c randChooser) intn(n int) int { return c.r.IntN(n) }

// byteChooser reads choices from the fuzzer's input; once exhausted it always answers 0 (which
// finishes the world deterministically).
type byteChooser struct {
	b []byte
	i int
}

func (c *byteChooser) intn(n int) int {
	if c.i >= len(c.b) {
		return 0
	}
	v := int(c.b[c.i])
	c.i++
	return v % n
}

// world is a containerd model (the fake CRI) whose lifecycle steps feed the NRI and task event inputs.
// Each input delivers in its own order; inputs interleave arbitrarily, lose observations (lossy
// worlds), status answers are delayed (they see the CRI at call time and are applied later), relists
// happen at any point.
type world struct {
	h       *harness
	c       chooser
	lossy   bool       // inputs miss observations
	relists bool       // relists run mid-way, possibly ahead of the inputs
	steps   [][]func() // per pod, the runtime steps left, in order
	nri     []Observation
	task    []Observation
	flight  []fetchResult // status answers not yet applied
	started map[string]bool
	exited  map[string]bool
	sandbox map[string]string // container -> sandbox
	code    map[string]int32  // container -> exit code

	// Restart worlds (restart_property_test.go).
	crash bool // pleg-nri is killed and restarted from its checkpoint
	kills int  // restarts so far
	// unseenEnds counts the objects whose end no process could tell (see checkRestarts).
	unseenEnds int
	// redelivered counts the events a process emitted again (received after the last checkpoint).
	redelivered int
	ckptData    []byte            // the last checkpoint written, on disk once the process is killed
	segments    []*restartSegment // what each pleg-nri process did
}

func newWorld(t testing.TB, c chooser, mode int) *world {
	w := &world{h: newWorldHarness(t, mode), c: c, lossy: mode&1 == 1, relists: mode&2 == 2, crash: mode&4 == 4, started: map[string]bool{}, exited: map[string]bool{}, sandbox: map[string]string{}, code: map[string]int32{}}
	pods := 1 + c.intn(3)
	for i := range pods {
		w.steps = append(w.steps, w.podScript(fmt.Sprintf("p%d", i), 1+c.intn(3)))
	}
	return w
}

func (w *world) now() time.Time { return w.h.clock.Now() }

func (w *world) emit(stream *[]Observation, o Observation) {
	if w.lossy && w.c.intn(8) == 0 {
		return // this input missed it
	}
	*stream = append(*stream, o)
}

func (w *world) exit(sb, id string) {
	cri := w.h.cri
	if !w.started[id] || cri.container(id) == nil || cri.container(id).State == runtimeapi.ContainerState_CONTAINER_EXITED {
		return
	}
	code := []int32{0, 1, 137}[w.c.intn(3)]
	w.code[id] = code
	w.exited[id] = true
	oom := code == 137 && w.c.intn(2) == 0
	oomFirst := w.c.intn(2) == 0
	if oom && oomFirst {
		cri.oomContainer(id)
		w.emit(&w.task, taskOOM(id, w.now()))
	}
	fin := w.now()
	cri.exitContainer(id, code, fin)
	w.emit(&w.task, taskExit(id, code, fin))
	n := nriExit(id, sb, code, fin, w.now())
	if oom && oomFirst {
		n.Reason = reasonOOMKilled
		n.OOMKilled = true
	}
	w.emit(&w.nri, n)
	if oom && !oomFirst {
		cri.oomContainer(id)
		w.emit(&w.task, taskOOM(id, w.now()))
	}
}

func (w *world) podScript(sb string, n int) []func() {
	cri := w.h.cri
	var ctrs []string
	for j := range n {
		ctrs = append(ctrs, fmt.Sprintf("%sc%d", sb, j))
	}
	steps := []func(){func() {
		cri.runSandbox(sb, w.now())
		w.emit(&w.nri, nriSandbox(sb, PhaseRunning, w.now()))
	}}
	for _, id := range ctrs {
		w.sandbox[id] = sb
		steps = append(steps, func() {
			cri.createContainer(id, sb, w.now())
			w.emit(&w.nri, nriContainer(id, sb, PhaseCreated, w.now()))
		})
		if w.c.intn(5) != 0 {
			steps = append(steps, func() {
				at := w.now()
				cri.startContainer(id, at)
				w.started[id] = true
				o := nriContainer(id, sb, PhaseRunning, at)
				o.StartedAt = at
				w.emit(&w.nri, o)
				w.emit(&w.task, Observation{Source: SourceTaskEvent, ID: id, Phase: PhaseRunning, StartedAt: at, SourceTime: at})
			})
			if w.c.intn(2) == 0 {
				steps = append(steps, func() { w.exit(sb, id) })
			}
		}
	}
	if w.c.intn(4) == 0 {
		return steps // the pod stays up
	}
	steps = append(steps, func() {
		for _, id := range ctrs {
			w.exit(sb, id)
		}
		cri.stopSandbox(sb)
		w.emit(&w.task, Observation{Source: SourceTaskEvent, ID: sb, Phase: PhaseExited, HasExitCode: true, ExitCode: 137, FinishedAt: w.now(), SourceTime: w.now()})
		w.emit(&w.nri, nriSandbox(sb, PhaseExited, w.now()))
	})
	if w.c.intn(4) == 0 {
		return steps // stopped, not removed
	}
	for _, id := range ctrs {
		steps = append(steps, func() {
			cri.removeContainer(id)
			w.emit(&w.nri, nriContainer(id, sb, PhaseRemoved, w.now()))
		})
	}
	return append(steps, func() {
		cri.removeSandbox(sb)
		w.emit(&w.nri, nriSandbox(sb, PhaseRemoved, w.now()))
	})
}

// callFetches makes the queued status calls now (in a random order) and keeps the answers in flight.
func (w *world) callFetches() {
	w.h.p.drain(w.h.ctx)
	batch, _ := w.h.p.fetch.take(w.now(), w.c.intn(2) == 0)
	for len(batch) > 0 {
		i := w.c.intn(len(batch))
		w.flight = append(w.flight, w.h.p.callStatus(w.h.ctx, batch[i]))
		batch = slices.Delete(batch, i, i+1)
	}
}

func (w *world) deliver(stream *[]Observation) {
	if len(*stream) > 0 {
		w.h.p.Observe((*stream)[0])
		*stream = (*stream)[1:]
	}
}

func (w *world) pendingSteps() bool {
	for _, s := range w.steps {
		if len(s) > 0 {
			return true
		}
	}
	return false
}

func (w *world) run() []Event {
	h := w.h
	for range 400 {
		if w.crash {
			w.crashStep()
			h = w.h
		}
		switch w.c.intn(10) {
		case 0, 1:
			var live []int
			for i, s := range w.steps {
				if len(s) > 0 {
					live = append(live, i)
				}
			}
			if len(live) > 0 {
				i := live[w.c.intn(len(live))]
				w.steps[i][0]()
				w.steps[i] = w.steps[i][1:]
			}
		case 2:
			w.deliver(&w.nri)
		case 3:
			w.deliver(&w.task)
		case 4:
			h.p.drain(h.ctx)
		case 5:
			w.callFetches()
		case 6:
			if len(w.flight) > 0 {
				i := w.c.intn(len(w.flight))
				res := w.flight[i] // a copy: Delete shifts the array
				h.p.enqueue(input{res: &res})
				w.flight = slices.Delete(w.flight, i, i+1)
			}
		case 7:
			if w.relists && w.c.intn(3) == 0 {
				if _, err := h.p.Relist(h.ctx); err != nil {
					h.t.Fatal(err)
				}
			}
		default:
			h.clock.Advance(time.Duration(1+w.c.intn(50)) * time.Millisecond)
		}
	}
	// Finish: the runtime completes its scripts, every input delivers, everything settles, and two
	// relists repair what lossy inputs missed.
	for w.pendingSteps() {
		for i := range w.steps {
			if len(w.steps[i]) > 0 {
				w.steps[i][0]()
				w.steps[i] = w.steps[i][1:]
			}
		}
	}
	for len(w.nri) > 0 || len(w.task) > 0 {
		w.deliver(&w.nri)
		w.deliver(&w.task)
	}
	for i := range w.flight {
		h.p.enqueue(input{res: &w.flight[i]})
	}
	w.flight = nil
	for range 2 {
		h.settle()
		h.clock.Advance(time.Second)
		if _, err := h.p.Relist(h.ctx); err != nil {
			h.t.Fatal(err)
		}
		h.settle()
	}
	if w.crash {
		w.endSegments()
		return nil
	}
	return h.events()
}

// checkEvents checks the contract on a stream (eventChecker), then that every object that appeared had a
// complete life: DELETED when the runtime removed it, STOPPED after any STARTED, and, when the inputs
// saw everything, STARTED and STOPPED exactly as the runtime's container did.
func checkEvents(t testing.TB, w *world, evs []Event) {
	t.Helper()
	c := checkStream(t, w.sandbox, evs)
	for id, o := range c.objects {
		removed := w.h.cri.container(id) == nil && w.h.cri.sandbox(id) == nil
		if o.count[evStarted] > 0 && len(o.stopped) == 0 && removed {
			t.Errorf("%s: STARTED, removed, never STOPPED: %v", id, summary(evs))
		}
		if deleted := o.count[evDeleted] > 0; deleted != removed {
			t.Errorf("%s: DELETED emitted %v, removed from the runtime %v: %v", id, deleted, removed, summary(evs))
		}
		if !w.lossy && !w.relists && w.sandbox[id] != "" {
			// Every input saw everything, and no relist ran ahead of them (a relist that finds a
			// container gone while the state only knows it created gives CREATED, DELETED): STARTED
			// exactly when the container started, STOPPED when it exited.
			s := o.count[evStarted] > 0
			if s != w.started[id] || (len(o.stopped) > 0) != w.exited[id] {
				t.Errorf("%s: started %v exited %v, STARTED %v, STOPPED %v: %v", id, w.started[id], w.exited[id], s, o.stopped, summary(evs))
			}
			if o.count[evStopped] > 0 {
				if st := statusOf(evs[o.first[evStopped]], id); st.ExitCode != w.code[id] {
					t.Errorf("%s: STOPPED with exit code %d, exited with %d", id, st.ExitCode, w.code[id])
				}
			}
		}
	}
	// Nothing held for good: what no object claimed expires.
	if !w.lossy {
		for id, h := range w.h.p.st.held {
			t.Errorf("%s held in a world without loss: %v", id, h.obs)
		}
	}
	w.h.clock.Advance(heldTTL + sweepPeriod)
	w.h.p.drain(w.h.ctx)
	for id, h := range w.h.p.st.held {
		t.Errorf("%s still held: %v", id, h.obs)
	}
}

func TestPropertyInterleavings(t *testing.T) {
	iterations := 2000
	if testing.Short() {
		iterations = 300
	}
	var worlds, kills, redelivered, unseen int
	defer func() {
		t.Logf("restart worlds: %d, kills: %d, events emitted again after a kill: %d, objects whose end no process could tell: %d",
			worlds, kills, redelivered, unseen)
	}()
	for seed := range iterations {
		w := newWorld(t, randChooser{rand.New(rand.NewPCG(uint64(seed), 42))}, seed%8)
		evs := w.run()
		t.Run("", func(t *testing.T) {
			if t.Failed() {
				return
			}
		})
		if w.crash {
			checkRestarts(&seedTB{TB: t, seed: seed}, w)
			worlds, kills, redelivered, unseen = worlds+1, kills+w.kills, redelivered+w.redelivered, unseen+w.unseenEnds
		} else {
			checkEvents(&seedTB{TB: t, seed: seed}, w, evs)
		}
		if t.Failed() {
			t.Fatalf("seed %d failed", seed)
		}
	}
}

// seedTB prefixes failures with the seed.
type seedTB struct {
	testing.TB
	seed int
}

func (s *seedTB) Fatalf(format string, args ...any) {
	s.TB.Helper()
	s.TB.Fatalf("seed %d: "+format, append([]any{s.seed}, args...)...)
}

func (s *seedTB) Errorf(format string, args ...any) {
	s.TB.Helper()
	s.TB.Errorf("seed %d: "+format, append([]any{s.seed}, args...)...)
}

func FuzzInterleavings(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte("the quick brown fox jumps over the lazy dog, twice: the quick brown fox jumps over the lazy dog"))
	r := rand.New(rand.NewPCG(7, 7))
	for range 8 {
		b := make([]byte, 600)
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 {
			return
		}
		w := newWorld(t, &byteChooser{b: b[1:]}, int(b[0]&7))
		evs := w.run()
		if w.crash {
			checkRestarts(t, w)
		} else {
			checkEvents(t, w, evs)
		}
	})
}

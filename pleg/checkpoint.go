package pleg

// The checkpoint: what every subscriber had received when it was written, so that a pleg-nri that
// restarts (after a crash, a SIGKILL, an upgrade) emits only what changed while it was not running,
// instead of CREATED and STARTED for every object on the node.
//
// What is in it. For every pod whose sandbox CREATED was received and DELETED was not: the sandbox id,
// the created_at of the pod's last event, and for the sandbox and each container whose CREATED was
// received and DELETED was not: its id, the furthest phase whose events were received, the flags the
// state machine needs (started, exited, corrected), its created_at, the reason its STOPPED carried and
// the status its events carried (binary protobuf: a DELETED or STOPPED for an object that vanished
// while pleg-nri was down is built from it). Nothing about subscribers, held observations or
// tombstones.
//
// "Received" is the fan-out's delivery watermark (fanout.delivered): an event counts once every
// subscriber's Next has taken it (or it was coalesced away, or its subscriber is gone), and, while the
// startup replay is kept for subscribers yet to come, once the replay has been handed to one. An event
// still queued for a subscriber when pleg-nri is killed is therefore emitted again by the next pleg-nri:
// duplicates rather than losses (see "Crashes" below for what is left).
//
// When it is written. emit marks the state dirty; the writer goroutine of Run writes at most once per
// CheckpointInterval (and after a short settle delay, so a burst of events makes one write), again while
// the watermark lags the events emitted, at once when a subscriber takes the startup replay (a
// restart's repairs are then recorded without waiting), and once more when Run ends (a clean
// shutdown: from Stopping on, an event no subscriber takes is not received, so the next pleg-nri emits
// it). The NRI hooks and the event path never wait for it: the snapshot is taken under PLEG.mu
// (pointer copies of immutable statuses), the encoding and the write happen outside it. The write is
// atomic and durable: a temporary file in the same directory, fsync, rename over the checkpoint, fsync
// of the directory. Cost for 1000 containers in 250 pods (BenchmarkCheckpoint, a loaded 2-core VM):
// 2.1 MB; snapshot under the lock ~0.5 ms, encoding ~3 ms when the statuses are unchanged (~17 ms
// when all are new), write with fsyncs ~9 ms; reading and restoring it at startup ~25 ms.
//
// At startup (New) the checkpoint is the baseline of the state: its objects are known, in their
// recorded phase, with their recorded status, and no event is emitted for them. NRI's Synchronize and
// the startup reconciliation (the first relist, SourceStartup) then diff the runtime against it: a
// container that exited while pleg-nri was down gets its STOPPED (with the exact status, fetched), one
// that was removed gets STOPPED (exit 255, reason Unknown, as containerd reports an exit it did not
// see, when its exit was not received before) and DELETED, a new one CREATED (and STARTED, STOPPED as
// far as it got); unchanged objects get nothing and cost no status call.
//
// A missing checkpoint is a first start. A corrupt one, one of another format version, or one written
// for another runtime (Config.CheckpointScope) is logged, renamed to <path>.unusable, and ignored:
// pleg-nri starts as without one (every object is new), and never fails because of it.
//
// Crashes. Between an event and the next checkpoint write (at most CheckpointInterval plus the write,
// or longer while a subscriber lags) the checkpoint is behind: after a SIGKILL in that window the next
// pleg-nri emits again the transitions whose events were received after the last write (at-least-once).
// It never emits again what the checkpoint holds, and it never skips a transition that was not received
// before the last write. Two residual losses: (1) an event that Next had taken but the stream server had
// not yet written to its socket when pleg-nri died (microseconds; that subscriber's stream breaks, and
// a CRI client relists after a broken stream); (2) the end (STOPPED, DELETED) of an object whose
// CREATED was received after the last write and that is gone before the next pleg-nri has its status:
// the next pleg-nri never knew it (the CRI keeps no history of removed objects). (2) needs a kill within
// CheckpointInterval of the object's creation and its removal before pleg-nri is back (plus the few
// milliseconds of its first status call).
//
// The file format is in checkpoint_codec.go, reading and writing the file in checkpoint_file.go, the
// writer goroutine in checkpoint_writer.go; this file maps the state to a checkpoint and back.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containerd/log"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Object flags in the checkpoint.
const (
	ckptStarted   = 1 << 0
	ckptExited    = 1 << 1
	ckptCorrected = 1 << 2
)

// ckptObject is one object of a checkpoint.
type ckptObject struct {
	id            string
	phase         Phase // the furthest phase whose events were received
	flags         uint64
	created       int64
	stoppedReason string
	// One of these is set, by kind.
	container *runtimeapi.ContainerStatus
	sandbox   *runtimeapi.PodSandboxStatus
}

// ckptPod is one pod of a checkpoint.
type ckptPod struct {
	id         string
	lastEvent  int64
	sandbox    ckptObject
	containers []ckptObject
}

// checkpoint is the decoded content of a checkpoint file.
type checkpoint struct {
	scope     string
	writtenAt int64
	pods      []ckptPod
}

func (c *checkpoint) objects() int {
	n := 0
	for _, p := range c.pods {
		n += 1 + len(p.containers)
	}
	return n
}

// CheckpointObject is one object of a checkpoint file.
type CheckpointObject struct {
	ID string
	// SandboxID is the object's pod (its own id for a sandbox).
	SandboxID string
	Kind      Kind
	// Phase is the furthest phase whose events every subscriber had received when the checkpoint was
	// written: the next pleg-nri emits nothing up to it, and every transition after it.
	Phase Phase
}

// Checkpoint is what a checkpoint file holds, for tools and tests.
type Checkpoint struct {
	// Scope is the runtime the checkpoint belongs to (Config.CheckpointScope).
	Scope string
	// WrittenAt is when it was written.
	WrittenAt time.Time
	// Objects are its sandboxes and containers, each pod's sandbox first.
	Objects []CheckpointObject
}

// ReadCheckpoint reads a checkpoint file written by a PLEG with Config.CheckpointPath.
func ReadCheckpoint(path string) (*Checkpoint, error) {
	data, err := readCheckpointFile(path)
	if err != nil {
		return nil, err
	}
	c, err := decodeCheckpoint(data)
	if err != nil {
		return nil, err
	}
	out := &Checkpoint{Scope: c.scope, WrittenAt: time.Unix(0, c.writtenAt)}
	for _, p := range c.pods {
		out.Objects = append(out.Objects, CheckpointObject{ID: p.id, SandboxID: p.id, Kind: KindSandbox, Phase: p.sandbox.phase})
		for _, ct := range p.containers {
			out.Objects = append(out.Objects, CheckpointObject{ID: ct.id, SandboxID: p.id, Kind: KindContainer, Phase: ct.phase})
		}
	}
	return out, nil
}

// loadCheckpoint reads the checkpoint at path and makes it the baseline of the state, after removing
// the temporary files of writes a crash interrupted. It never fails: an unusable checkpoint is set
// aside and the state stays empty.
func (p *PLEG) loadCheckpoint(ctx context.Context) {
	path := p.cfg.CheckpointPath
	logger := log.G(ctx).WithField("checkpoint", path)
	// The state directory is this core's (LockStateDir): no write of another core is under way.
	if removed, err := removeCheckpointTemps(path); err != nil {
		logger.WithError(err).Warn("failed to remove the temporary files of interrupted checkpoint writes")
	} else if len(removed) > 0 {
		logger.WithField("files", removed).Info("removed the temporary files of interrupted checkpoint writes")
	}
	data, err := readCheckpointFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		logger.Info("no checkpoint: every sandbox and container found is new")
		p.metrics.CheckpointLoaded(0, CheckpointAbsent)
		return
	}
	var c *checkpoint
	if err == nil {
		c, err = decodeCheckpoint(data)
	}
	if err == nil && c.scope != p.cfg.CheckpointScope {
		err = fmt.Errorf("checkpoint of runtime %q, not of %q", c.scope, p.cfg.CheckpointScope)
	}
	if err != nil {
		aside := path + ".unusable"
		if rerr := os.Rename(path, aside); rerr != nil {
			logger.WithError(rerr).Warn("failed to set the unusable checkpoint aside")
		}
		logger.WithError(err).WithField("moved-to", aside).
			Warn("unusable checkpoint ignored: every sandbox and container found is treated as new")
		p.metrics.CheckpointLoaded(0, CheckpointUnusable)
		return
	}
	n := p.st.restore(c)
	logger.WithField("objects", n).WithField("written", time.Unix(0, c.writtenAt).Format(time.RFC3339Nano)).
		Info("state restored from the checkpoint: only what changed since is emitted")
	p.metrics.CheckpointLoaded(n, CheckpointRestored)
}

// restore makes a checkpoint the state's baseline: its objects are known in their recorded phase, with
// their recorded status, and nothing is pending. The state must be empty. It returns the number of
// objects restored.
func (s *state) restore(c *checkpoint) int {
	n := 0
	for i := range c.pods {
		cp := &c.pods[i]
		p := s.newPod(cp.id)
		p.lastEvent = cp.lastEvent
		sb := p.sandbox
		restoreObject(sb, &cp.sandbox)
		sb.sbAnswer, sb.sbSent = cp.sandbox.sandbox, cp.sandbox.sandbox
		sb.complete = true
		n++
		for j := range cp.containers {
			cc := &cp.containers[j]
			o := &object{id: cc.id, kind: KindContainer, pod: p, order: p.nextOrder}
			p.nextOrder++
			restoreObject(o, cc)
			o.ctrAnswer, o.ctrSent = cc.container, cc.container
			if o.phase >= PhaseExited {
				o.stoppedSt = o.ctrSent // what its last STOPPED carried, as received
			}
			o.complete = true
			p.containers[o.id] = o
			s.objects[o.id] = o
			s.list(p, o)
			n++
		}
	}
	return n
}

func restoreObject(o *object, c *ckptObject) {
	o.phase, o.emitted = c.phase, c.phase
	o.started = c.flags&ckptStarted != 0
	o.exited = c.flags&ckptExited != 0
	if o.kind == KindContainer && c.phase == PhaseCreated && !o.started {
		// The checkpoint can be older than a STARTED a subscriber already took (it records up to ~1 s
		// late): if this container turns out gone at startup, it may have run and exited meanwhile,
		// and a STOPPED must then not be missing. Whether it ran is lost with it, so its end is told
		// as an unobserved exit (255, Unknown), as for any running container that vanished; a
		// container that never started gets that one STOPPED too (at-least-once after a crash).
		o.exited = true
	}
	o.corrected = c.flags&ckptCorrected != 0
	o.created = c.created
	o.stoppedReason = c.stoppedReason
}

// received returns the furthest phase of o whose events were all received (sequence numbers up to w),
// PhaseNone when not even its CREATED was.
func received(o *object, w uint64) Phase {
	ph := PhaseNone
	for next := PhaseCreated; next <= o.emitted; next++ {
		if o.emitSeq[next] > w {
			break
		}
		ph = next
	}
	return ph
}

func snapshotObject(o *object, ph Phase) ckptObject {
	c := ckptObject{id: o.id, phase: ph, created: o.created, stoppedReason: o.stoppedReason,
		container: o.ctrSent, sandbox: o.sbSent}
	if o.started {
		c.flags |= ckptStarted
	}
	if o.exited {
		c.flags |= ckptExited
	}
	if o.corrected {
		c.flags |= ckptCorrected
	}
	return c
}

// snapshot returns the checkpoint of the state as received up to the sequence number w, and forgets
// the deleted objects whose DELETED was received. It runs under PLEG.mu.
func (s *state) snapshot(w uint64, scope string, now time.Time) *checkpoint {
	byPod := map[*pod]*ckptPod{}
	var order []*pod
	podOf := func(p *pod) *ckptPod {
		cp := byPod[p]
		if cp == nil {
			cp = &ckptPod{id: p.id, lastEvent: p.lastEvent}
			byPod[p] = cp
			order = append(order, p)
		}
		return cp
	}
	addContainer := func(o *object) {
		if ph := received(o, w); ph >= PhaseCreated && ph < PhaseRemoved && o.ctrSent != nil {
			cp := podOf(o.pod)
			if cp.containers == nil {
				cp.containers = make([]ckptObject, 0, len(o.pod.listed))
			}
			cp.containers = append(cp.containers, snapshotObject(o, ph))
		}
	}
	addSandbox := func(p *pod) bool {
		sb := p.sandbox
		ph := received(sb, w)
		if ph < PhaseCreated || ph == PhaseRemoved || sb.sbSent == nil {
			return false
		}
		podOf(p).sandbox = snapshotObject(sb, ph)
		return true
	}
	for _, p := range s.pods {
		if p.dropped || !addSandbox(p) {
			continue
		}
		for _, c := range p.listed {
			addContainer(c)
		}
	}
	// Deleted objects whose DELETED some subscriber has not received yet.
	keep := s.unacked[:0]
	for _, o := range s.unacked {
		if o.emitSeq[PhaseRemoved] <= w {
			continue
		}
		keep = append(keep, o)
		if o.kind == KindSandbox {
			addSandbox(o.pod)
		}
	}
	clear(s.unacked[len(keep):])
	s.unacked = keep
	for _, o := range s.unacked {
		if o.kind == KindContainer && byPod[o.pod] != nil {
			addContainer(o)
		}
	}
	c := &checkpoint{scope: scope, writtenAt: now.UnixNano()}
	slices.SortFunc(order, func(a, b *pod) int { return strings.Compare(a.id, b.id) })
	for _, p := range order {
		cp := byPod[p]
		if cp.sandbox.id == "" {
			continue // the sandbox's own events were not received: neither were its containers'
		}
		slices.SortFunc(cp.containers, func(a, b ckptObject) int { return containerOrder(a.created, b.created, a.id, b.id) })
		c.pods = append(c.pods, *cp)
	}
	return c
}

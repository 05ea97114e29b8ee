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
// shutdown). The NRI hooks and the event path never wait for it: the snapshot is taken under PLEG.mu
// (pointer copies of immutable statuses), the encoding and the write happen outside it. The write is
// atomic and durable: a temporary file in the same directory, fsync, rename over the checkpoint, fsync
// of the directory. Cost for 1000 containers in 250 pods (BenchmarkCheckpoint, a loaded 2-core VM):
// 2.1 MB; snapshot under the lock ~0.4 ms, encoding ~2 ms when the statuses are unchanged (~25 ms
// when all are new), write with fsyncs ~5-9 ms; reading and restoring it at startup ~20 ms.
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
// File format, version 1 (all integers little-endian):
//
//	offset  0: magic "plegnri\x00"
//	offset  8: uint32 format version
//	offset 12: uint32 CRC-32C (Castagnoli) of the payload
//	offset 16: payload, protobuf wire format:
//	  checkpoint: 1 scope (string), 2 written_at (varint, unix ns), 3 pod (message, repeated)
//	  pod:        1 id (string), 2 last_event (varint, ns), 3 sandbox (object), 4 container (object, repeated)
//	  object:     1 id (string), 2 phase (varint), 3 flags (varint: 1 started, 2 exited, 4 corrected),
//	              4 created (varint, ns), 5 stopped_reason (string), 6 status (bytes: a CRI
//	              PodSandboxStatus or ContainerStatus)
//
// Unknown fields are skipped (a later minor change can add some); a change that an older reader would
// misread bumps the version.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/log"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	checkpointMagic   = "plegnri\x00"
	checkpointVersion = 1
	checkpointHeader  = 16
	// maxCheckpointSize bounds what is read: 100k containers with large statuses stay far below it.
	maxCheckpointSize = 256 << 20
	// checkpointSettle is the least delay between a change and the write that records it, so a burst
	// of events makes one write.
	checkpointSettle = 20 * time.Millisecond
)

// Object flags in the checkpoint.
const (
	ckptStarted   = 1 << 0
	ckptExited    = 1 << 1
	ckptCorrected = 1 << 2
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errCheckpointVersion says the checkpoint has another format version.
var errCheckpointVersion = errors.New("unsupported checkpoint format version")

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

func readCheckpointFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCheckpointSize+1))
	if err != nil {
		return nil, fmt.Errorf("failed to read checkpoint %s: %w", path, err)
	}
	if len(data) > maxCheckpointSize {
		return nil, fmt.Errorf("checkpoint %s is larger than the %d bytes allowed", path, maxCheckpointSize)
	}
	return data, nil
}

// statusCache keeps the encoding of each status written, by pointer: statuses are immutable (a change
// makes a new one), so an unchanged object costs no marshal on the next write.
type statusCache map[proto.Message][]byte

// encodeCheckpoint encodes c; prev (may be nil) provides the statuses' encodings of the last write, and
// the encodings of this one are returned for the next. The file is built in one buffer of the exact
// size: an unchanged object costs a copy of its bytes.
func encodeCheckpoint(c *checkpoint, prev statusCache) ([]byte, statusCache, error) {
	next := make(statusCache, c.objects())
	// The statuses' encodings, in the order the objects are written.
	sts := make([][]byte, 0, c.objects())
	status := func(o *ckptObject) error {
		var m proto.Message = o.container
		if o.sandbox != nil {
			m = o.sandbox
		}
		b, ok := prev[m]
		if !ok {
			var err error
			if b, err = proto.Marshal(m); err != nil {
				return fmt.Errorf("failed to encode the status of %s: %w", o.id, err)
			}
		}
		next[m] = b
		sts = append(sts, b)
		return nil
	}
	objSize := func(o *ckptObject, st []byte) int {
		n := 1 + protowire.SizeBytes(len(o.id)) + 1 + protowire.SizeVarint(uint64(o.phase)) +
			1 + protowire.SizeVarint(o.flags) + 1 + protowire.SizeVarint(uint64(o.created)) +
			1 + protowire.SizeBytes(len(st))
		if o.stoppedReason != "" {
			n += 1 + protowire.SizeBytes(len(o.stoppedReason))
		}
		return n
	}
	// First pass: the statuses and the size of each pod.
	podSizes := make([]int, len(c.pods))
	size := 1 + protowire.SizeBytes(len(c.scope)) + 1 + protowire.SizeVarint(uint64(c.writtenAt))
	for i := range c.pods {
		p := &c.pods[i]
		k := len(sts)
		if err := status(&p.sandbox); err != nil {
			return nil, nil, err
		}
		for j := range p.containers {
			if err := status(&p.containers[j]); err != nil {
				return nil, nil, err
			}
		}
		n := 1 + protowire.SizeBytes(len(p.id)) + 1 + protowire.SizeVarint(uint64(p.lastEvent))
		n += 1 + protowire.SizeBytes(objSize(&p.sandbox, sts[k]))
		for j := range p.containers {
			n += 1 + protowire.SizeBytes(objSize(&p.containers[j], sts[k+1+j]))
		}
		podSizes[i] = n
		size += 1 + protowire.SizeBytes(n)
	}
	// Second pass: the bytes.
	out := make([]byte, checkpointHeader, checkpointHeader+size)
	copy(out, checkpointMagic)
	binary.LittleEndian.PutUint32(out[8:], checkpointVersion)
	out = protowire.AppendTag(out, 1, protowire.BytesType)
	out = protowire.AppendString(out, c.scope)
	out = protowire.AppendTag(out, 2, protowire.VarintType)
	out = protowire.AppendVarint(out, uint64(c.writtenAt))
	appendObject := func(dst []byte, num protowire.Number, o *ckptObject, st []byte) []byte {
		dst = protowire.AppendTag(dst, num, protowire.BytesType)
		dst = protowire.AppendVarint(dst, uint64(objSize(o, st)))
		dst = protowire.AppendTag(dst, 1, protowire.BytesType)
		dst = protowire.AppendString(dst, o.id)
		dst = protowire.AppendTag(dst, 2, protowire.VarintType)
		dst = protowire.AppendVarint(dst, uint64(o.phase))
		dst = protowire.AppendTag(dst, 3, protowire.VarintType)
		dst = protowire.AppendVarint(dst, o.flags)
		dst = protowire.AppendTag(dst, 4, protowire.VarintType)
		dst = protowire.AppendVarint(dst, uint64(o.created))
		if o.stoppedReason != "" {
			dst = protowire.AppendTag(dst, 5, protowire.BytesType)
			dst = protowire.AppendString(dst, o.stoppedReason)
		}
		dst = protowire.AppendTag(dst, 6, protowire.BytesType)
		return protowire.AppendBytes(dst, st)
	}
	k := 0
	for i := range c.pods {
		p := &c.pods[i]
		out = protowire.AppendTag(out, 3, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(podSizes[i]))
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendString(out, p.id)
		out = protowire.AppendTag(out, 2, protowire.VarintType)
		out = protowire.AppendVarint(out, uint64(p.lastEvent))
		out = appendObject(out, 3, &p.sandbox, sts[k])
		k++
		for j := range p.containers {
			out = appendObject(out, 4, &p.containers[j], sts[k])
			k++
		}
	}
	if len(out) != checkpointHeader+size {
		return nil, nil, fmt.Errorf("checkpoint: encoded %d bytes, computed %d", len(out)-checkpointHeader, size)
	}
	binary.LittleEndian.PutUint32(out[12:], crc32.Checksum(out[checkpointHeader:], crcTable))
	return out, next, nil
}

// decodeCheckpoint decodes and checks a checkpoint file's content. It never panics, whatever data is.
func decodeCheckpoint(data []byte) (*checkpoint, error) {
	if len(data) < checkpointHeader || string(data[:8]) != checkpointMagic {
		return nil, errors.New("not a pleg-nri checkpoint (bad magic)")
	}
	if v := binary.LittleEndian.Uint32(data[8:]); v != checkpointVersion {
		return nil, fmt.Errorf("%w %d (this pleg-nri reads version %d)", errCheckpointVersion, v, checkpointVersion)
	}
	body := data[checkpointHeader:]
	if crc := crc32.Checksum(body, crcTable); crc != binary.LittleEndian.Uint32(data[12:]) {
		return nil, errors.New("checkpoint checksum mismatch (truncated or corrupt)")
	}
	c := &checkpoint{}
	seen := map[string]bool{}
	err := eachField(body, func(num protowire.Number, typ protowire.Type, b []byte, v uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			c.scope = string(b)
		case num == 2 && typ == protowire.VarintType:
			c.writtenAt = int64(v)
		case num == 3 && typ == protowire.BytesType:
			p, err := decodePod(b, seen)
			if err != nil {
				return err
			}
			c.pods = append(c.pods, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

func decodePod(b []byte, seen map[string]bool) (ckptPod, error) {
	var p ckptPod
	hasSandbox := false
	err := eachField(b, func(num protowire.Number, typ protowire.Type, b []byte, v uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			p.id = string(b)
		case num == 2 && typ == protowire.VarintType:
			p.lastEvent = int64(v)
		case num == 3 && typ == protowire.BytesType:
			o, err := decodeObject(b, KindSandbox)
			if err != nil {
				return err
			}
			p.sandbox, hasSandbox = o, true
		case num == 4 && typ == protowire.BytesType:
			o, err := decodeObject(b, KindContainer)
			if err != nil {
				return err
			}
			p.containers = append(p.containers, o)
		}
		return nil
	})
	switch {
	case err != nil:
		return p, err
	case p.id == "" || !hasSandbox || p.sandbox.id != p.id:
		return p, fmt.Errorf("checkpoint pod %q without its sandbox", p.id)
	}
	ids := []string{p.id}
	for _, c := range p.containers {
		ids = append(ids, c.id)
	}
	for _, id := range ids {
		if seen[id] {
			return p, fmt.Errorf("checkpoint object %q listed twice", id)
		}
		seen[id] = true
	}
	return p, nil
}

func decodeObject(b []byte, kind Kind) (ckptObject, error) {
	var o ckptObject
	var st []byte
	hasStatus := false
	err := eachField(b, func(num protowire.Number, typ protowire.Type, b []byte, v uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			o.id = string(b)
		case num == 2 && typ == protowire.VarintType:
			if v < uint64(PhaseCreated) || v > uint64(PhaseExited) {
				return fmt.Errorf("checkpoint object with phase %d", v)
			}
			o.phase = Phase(v)
		case num == 3 && typ == protowire.VarintType:
			o.flags = v
		case num == 4 && typ == protowire.VarintType:
			o.created = int64(v)
		case num == 5 && typ == protowire.BytesType:
			o.stoppedReason = string(b)
		case num == 6 && typ == protowire.BytesType:
			st, hasStatus = b, true
		}
		return nil
	})
	switch {
	case err != nil:
		return o, err
	case o.id == "":
		return o, errors.New("checkpoint object without an id")
	case o.phase == PhaseNone:
		return o, fmt.Errorf("checkpoint object %s without a phase", o.id)
	case !hasStatus:
		return o, fmt.Errorf("checkpoint object %s without a status", o.id)
	}
	if kind == KindSandbox {
		s := &runtimeapi.PodSandboxStatus{}
		if err := proto.Unmarshal(st, s); err != nil {
			return o, fmt.Errorf("checkpoint sandbox %s: bad status: %w", o.id, err)
		}
		if s.Id != o.id || s.Metadata == nil {
			return o, fmt.Errorf("checkpoint sandbox %s: its status is of %q or has no metadata", o.id, s.Id)
		}
		o.sandbox = s
	} else {
		s := &runtimeapi.ContainerStatus{}
		if err := proto.Unmarshal(st, s); err != nil {
			return o, fmt.Errorf("checkpoint container %s: bad status: %w", o.id, err)
		}
		if s.Id != o.id {
			return o, fmt.Errorf("checkpoint container %s: its status is of %q", o.id, s.Id)
		}
		o.container = s
	}
	return o, nil
}

// eachField calls fn for every field of a protobuf message: b is a length-delimited field's bytes, v a
// varint or fixed field's value. Groups are an error.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, b []byte, v uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("checkpoint: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var val []byte
		var v uint64
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var x uint32
			x, n = protowire.ConsumeFixed32(b)
			v = uint64(x)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			val, n = protowire.ConsumeBytes(b)
		default:
			return fmt.Errorf("checkpoint: unexpected wire type %d", typ)
		}
		if n < 0 {
			return fmt.Errorf("checkpoint: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if err := fn(num, typ, val, v); err != nil {
			return err
		}
	}
	return nil
}

// writeFileAtomic replaces path with data durably: a temporary file beside it, fsync, rename, fsync of
// the directory. A crash at any point leaves either the old file or the new one, never a mix.
func writeFileAtomic(path string, data []byte) (err error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err = f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// loadCheckpoint reads the checkpoint at path and makes it the baseline of the state. It never fails:
// an unusable checkpoint is set aside and the state stays empty.
func (p *PLEG) loadCheckpoint(ctx context.Context) {
	path := p.cfg.CheckpointPath
	logger := log.G(ctx).WithField("checkpoint", path)
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
		sb.sbase, sb.seff = cp.sandbox.sandbox, cp.sandbox.sandbox
		sb.complete = true
		n++
		for j := range cp.containers {
			cc := &cp.containers[j]
			o := &object{id: cc.id, kind: KindContainer, pod: p, order: p.nextOrder}
			p.nextOrder++
			restoreObject(o, cc)
			o.cbase, o.ceff = cc.container, cc.container
			if o.phase >= PhaseExited {
				o.stoppedSt = o.ceff // what its last STOPPED carried, as received
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
		container: o.ceff, sandbox: o.seff}
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
		if ph := received(o, w); ph >= PhaseCreated && ph < PhaseRemoved && o.ceff != nil {
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
		if ph < PhaseCreated || ph == PhaseRemoved || sb.seff == nil {
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

// ckptWriter is the state of the checkpoint writer; only the goroutine that writes (checkpointLoop,
// then Run's final write) uses it.
type ckptWriter struct {
	// write replaces the file durably; nil is writeFileAtomic (tests that write thousands of
	// checkpoints skip the fsyncs).
	write     func(path string, data []byte) error
	cache     statusCache
	written   bool   // a checkpoint was written by this PLEG
	gen, mark uint64 // the state generation and the watermark of the last write
	lastErr   error  // the error of the last write, nil when it succeeded
}

// writeCheckpoint writes the checkpoint if the state or the watermark changed since the last write. It
// returns true when what was written is behind what was emitted (a subscriber has not received
// everything): the writer must try again later.
func (p *PLEG) writeCheckpoint(ctx context.Context) (behind bool) {
	w := &p.ckpt
	p.mu.Lock()
	mark := p.fan.delivered()
	gen := p.st.ckptGen
	behind = mark < p.fan.seq
	if w.written && gen == w.gen && mark == w.mark {
		p.mu.Unlock()
		return behind
	}
	c := p.st.snapshot(mark, p.cfg.CheckpointScope, p.clock.Now())
	p.mu.Unlock()

	start := time.Now()
	data, cache, err := encodeCheckpoint(c, w.cache)
	if err == nil {
		write := w.write
		if write == nil {
			write = writeFileAtomic
		}
		err = write(p.cfg.CheckpointPath, data)
	}
	d := time.Since(start)
	p.metrics.CheckpointWritten(len(data), c.objects(), d, err)
	logger := log.G(ctx).WithField("checkpoint", p.cfg.CheckpointPath)
	if err != nil {
		// Logged once per kind of failure, not on every retry.
		if w.lastErr == nil || err.Error() != w.lastErr.Error() {
			logger.WithError(err).Warn("failed to write the checkpoint: a restart will emit again what changed since the last one written")
		}
		w.lastErr = err
		return true
	}
	if w.lastErr != nil {
		logger.Info("checkpoint written again")
	}
	w.lastErr = nil
	w.cache, w.written, w.gen, w.mark = cache, true, gen, mark
	if log.GetLevel() >= log.DebugLevel {
		logger.WithField("bytes", len(data)).WithField("objects", c.objects()).WithField("took", d).Debug("checkpoint written")
	}
	return behind
}

// checkpointLoop writes the checkpoint after changes, at most once per CheckpointInterval, until ctx is
// done.
func (p *PLEG) checkpointLoop(ctx context.Context) {
	var last time.Time
	t := time.NewTimer(time.Hour)
	t.Stop()
	retry := false
	for {
		if !retry {
			select {
			case <-ctx.Done():
				return
			case <-p.st.ckptWake:
			}
		}
	wait:
		for {
			d := max(p.cfg.CheckpointInterval-time.Since(last), checkpointSettle)
			if p.st.ckptUrgent.Swap(false) {
				d = checkpointSettle
			}
			t.Reset(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
				break wait
			case <-p.st.ckptWake:
				t.Stop() // again: an urgent request shortens the wait
			}
		}
		retry = p.writeCheckpoint(ctx)
		last = time.Now()
	}
}

// checkpointBytes is for benchmarks and tests: the encoding of the current state's checkpoint.
func (p *PLEG) checkpointBytes() ([]byte, error) {
	p.mu.Lock()
	c := p.st.snapshot(p.fan.delivered(), p.cfg.CheckpointScope, p.clock.Now())
	p.mu.Unlock()
	data, _, err := encodeCheckpoint(c, nil)
	return data, err
}

// checkpointEmitted records an emitted event for the checkpoint: its sequence number, and a deleted
// object until its DELETED is received. It runs under PLEG.mu, on the event path: a few stores and a
// non-blocking send.
func (s *state) checkpointEmitted(o *object, t runtimeapi.ContainerEventType) {
	ph := eventPhase(t)
	o.emitSeq[ph] = s.fan.seq
	if ph == PhaseRemoved {
		s.unacked = append(s.unacked, o)
	}
	s.ckptGen++
	s.wakeCheckpoint()
}

// urgentCheckpoint asks the writer for a write without waiting for CheckpointInterval: the startup
// replay was received, and until it is recorded a kill would make the next pleg-nri emit it all again
// and forget the objects it holds. It never blocks.
func (s *state) urgentCheckpoint() {
	s.ckptUrgent.Store(true)
	s.wakeCheckpoint()
}

// wakeCheckpoint asks the writer for a write; it never blocks.
func (s *state) wakeCheckpoint() {
	select {
	case s.ckptWake <- struct{}{}:
	default:
	}
}

// eventPhase is the phase an event type reports.
func eventPhase(t runtimeapi.ContainerEventType) Phase {
	switch t {
	case runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT:
		return PhaseCreated
	case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
		return PhaseRunning
	case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
		return PhaseExited
	}
	return PhaseRemoved
}

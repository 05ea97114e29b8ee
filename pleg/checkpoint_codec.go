package pleg

// The checkpoint's file format: what encodeCheckpoint writes and decodeCheckpoint reads and checks.
//
// File format, version 1 (all integers little-endian):
//
//	offset  0: magic "plegnri\x00"
//	offset  8: uint32 format version
//	offset 12: uint32 CRC-32C (Castagnoli) of the payload
//	offset 16: payload: a checkpointpb.Checkpoint in protobuf wire format
//	  checkpoint: 1 scope (string), 2 written_at (varint, unix ns), 3 pod (message, repeated)
//	  pod:        1 id (string), 2 last_event (varint, ns), 3 sandbox (object), 4 container (object, repeated)
//	  object:     1 id (string), 2 phase (varint), 3 flags (varint: 1 started, 2 exited, 4 corrected),
//	              4 created (varint, ns), 5 stopped_reason (string), 6 status (bytes: a CRI
//	              PodSandboxStatus or ContainerStatus)
//
// internal/checkpointpb/checkpoint.proto defines the payload (make generate). Unknown fields are skipped
// (a later minor change can add some); a change that an older reader would misread bumps the version.
// testdata/checkpoint-v1.bin is a checkpoint of the first version-1 writer: every later reader must read
// it (TestGoldenCheckpoint).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/pleg/internal/checkpointpb"
)

const (
	checkpointMagic   = "plegnri\x00"
	checkpointVersion = 1
	checkpointHeader  = 16
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errCheckpointVersion says the checkpoint has another format version.
var errCheckpointVersion = errors.New("unsupported checkpoint format version")

// statusCache keeps the encoding of each status written, by pointer: statuses are immutable (a change
// makes a new one), so an unchanged object costs no marshal on the next write.
type statusCache map[proto.Message][]byte

// encodeCheckpoint encodes c; prev (may be nil) provides the statuses' encodings of the last write, and
// the encodings of this one are returned for the next. The file is built in one buffer of the exact
// size: an unchanged object costs a copy of its bytes.
func encodeCheckpoint(c *checkpoint, prev statusCache) ([]byte, statusCache, error) {
	next := make(statusCache, c.objects())
	// The messages in a few allocations: objects[k] is the k-th object written, each pod's containers a
	// part of containers.
	objects := make([]checkpointpb.Object, c.objects())
	pods := make([]checkpointpb.Pod, len(c.pods))
	containers := make([]*checkpointpb.Object, c.objects()-len(c.pods))
	k := 0
	object := func(o *ckptObject) (*checkpointpb.Object, error) {
		var m proto.Message = o.container
		if o.sandbox != nil {
			m = o.sandbox
		}
		st, ok := prev[m]
		if !ok {
			var err error
			if st, err = proto.Marshal(m); err != nil {
				return nil, fmt.Errorf("failed to encode the status of %s: %w", o.id, err)
			}
		}
		next[m] = st
		pb := &objects[k]
		k++
		pb.Id, pb.Phase, pb.Flags, pb.Created, pb.StoppedReason, pb.Status = o.id, uint64(o.phase), o.flags, o.created, o.stoppedReason, st
		return pb, nil
	}
	msg := &checkpointpb.Checkpoint{Scope: c.scope, WrittenAt: c.writtenAt, Pods: make([]*checkpointpb.Pod, len(c.pods))}
	for i := range c.pods {
		p, pb := &c.pods[i], &pods[i]
		pb.Id, pb.LastEvent = p.id, p.lastEvent
		var err error
		if pb.Sandbox, err = object(&p.sandbox); err != nil {
			return nil, nil, err
		}
		pb.Containers, containers = containers[:len(p.containers):len(p.containers)], containers[len(p.containers):]
		for j := range p.containers {
			if pb.Containers[j], err = object(&p.containers[j]); err != nil {
				return nil, nil, err
			}
		}
		msg.Pods[i] = pb
	}
	size := proto.Size(msg)
	out := make([]byte, checkpointHeader, checkpointHeader+size)
	copy(out, checkpointMagic)
	binary.LittleEndian.PutUint32(out[8:], checkpointVersion)
	// The sizes proto.Size computed are reused: the payload is sized once.
	out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(out, msg)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to encode the checkpoint: %w", err)
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
	var msg checkpointpb.Checkpoint
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, &msg); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	c := &checkpoint{scope: msg.GetScope(), writtenAt: msg.GetWrittenAt()}
	seen := map[string]bool{}
	for _, pb := range msg.GetPods() {
		p, err := decodePod(pb, seen)
		if err != nil {
			return nil, err
		}
		c.pods = append(c.pods, p)
	}
	return c, nil
}

// decodePod checks and converts one pod; seen has the ids of the pods before it, and gets its own.
func decodePod(pb *checkpointpb.Pod, seen map[string]bool) (ckptPod, error) {
	p := ckptPod{id: pb.GetId(), lastEvent: pb.GetLastEvent()}
	if pb.GetSandbox() != nil {
		var err error
		if p.sandbox, err = decodeObject(pb.GetSandbox(), KindSandbox); err != nil {
			return p, err
		}
	}
	for _, cb := range pb.GetContainers() {
		o, err := decodeObject(cb, KindContainer)
		if err != nil {
			return p, err
		}
		p.containers = append(p.containers, o)
	}
	if p.id == "" || pb.GetSandbox() == nil || p.sandbox.id != p.id {
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

// decodeObject checks and converts one object, and decodes its status.
func decodeObject(pb *checkpointpb.Object, kind Kind) (ckptObject, error) {
	o := ckptObject{id: pb.GetId(), flags: pb.GetFlags(), created: pb.GetCreated(), stoppedReason: pb.GetStoppedReason()}
	switch ph := pb.GetPhase(); {
	case ph > uint64(PhaseExited):
		return o, fmt.Errorf("checkpoint object with phase %d", ph)
	case o.id == "":
		return o, errors.New("checkpoint object without an id")
	case ph == uint64(PhaseNone):
		return o, fmt.Errorf("checkpoint object %s without a phase", o.id)
	case len(pb.GetStatus()) == 0:
		return o, fmt.Errorf("checkpoint object %s without a status", o.id)
	}
	o.phase = Phase(pb.GetPhase())
	if kind == KindSandbox {
		s := &runtimeapi.PodSandboxStatus{}
		if err := proto.Unmarshal(pb.GetStatus(), s); err != nil {
			return o, fmt.Errorf("checkpoint sandbox %s: bad status: %w", o.id, err)
		}
		if s.Id != o.id || s.Metadata == nil {
			return o, fmt.Errorf("checkpoint sandbox %s: its status is of %q or has no metadata", o.id, s.Id)
		}
		o.sandbox = s
	} else {
		s := &runtimeapi.ContainerStatus{}
		if err := proto.Unmarshal(pb.GetStatus(), s); err != nil {
			return o, fmt.Errorf("checkpoint container %s: bad status: %w", o.id, err)
		}
		if s.Id != o.id {
			return o, fmt.Errorf("checkpoint container %s: its status is of %q", o.id, s.Id)
		}
		o.container = s
	}
	return o, nil
}

package pleg

// The checkpoint's file format: what encodeCheckpoint writes and decodeCheckpoint reads and checks.
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
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
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

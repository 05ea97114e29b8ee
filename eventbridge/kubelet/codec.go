package kubelet

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// frame is one gRPC message as bytes on the wire, never decoded by the proxy. A received frame holds
// the transport's buffers (buf) and hands them on to the next send without copying; a frame built by
// the proxy holds plain bytes (data).
type frame struct {
	data []byte
	buf  mem.BufferSlice
}

// bytes returns the frame's content (a copy when it holds buffers).
func (f *frame) bytes() []byte {
	if f.buf != nil {
		return f.buf.Materialize()
	}
	return f.data
}

// free releases the buffers the frame still holds (a frame that was sent holds none).
func (f *frame) free() {
	if f.buf != nil {
		f.buf.Free()
		f.buf = nil
	}
}

// rawCodec passes frames through unchanged. It also marshals and unmarshals proto messages, so that a
// server or connection forced to it can still be used with generated types (the proxy's own
// GetContainerEvents handler, tests).
//
// Its name is "proto": the name becomes the content-subtype of forwarded calls
// ("application/grpc+proto"), which the runtime reads as the protobuf it is.
type rawCodec struct{}

var _ encoding.CodecV2 = rawCodec{}

// Marshal returns the frame's bytes, or the encoding of a proto message.
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *frame:
		if m.buf != nil {
			// The frame's reference goes to gRPC, which frees it once written.
			out := m.buf
			m.buf = nil
			return out, nil
		}
		return mem.BufferSlice{mem.SliceBuffer(m.data)}, nil
	case proto.Message:
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("failed to marshal %T: %w", v, err)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
}

// Unmarshal copies the bytes into a frame, or decodes them into a proto message.
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *frame:
		// data is freed when Unmarshal returns: the frame takes its own reference.
		m.free()
		data.Ref()
		m.buf, m.data = data, nil
		return nil
	case proto.Message:
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		if err := proto.Unmarshal(buf.ReadOnlyData(), m); err != nil {
			return fmt.Errorf("failed to unmarshal %T: %w", v, err)
		}
		return nil
	}
	return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
}

// Name returns "proto" (see the type's comment).
func (rawCodec) Name() string { return "proto" }

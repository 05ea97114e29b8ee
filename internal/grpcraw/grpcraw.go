// Package grpcraw carries gRPC messages as the bytes on the wire: a Frame is one message, never decoded,
// and Codec is the gRPC codec that passes frames through unchanged. pleg-nri's CRI endpoint forwards
// every call with them, and the front and the core speak their private protocol with them.
package grpcraw

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Frame is one gRPC message as bytes on the wire. A received frame holds the transport's buffers and
// hands them on to the next send without copying; a frame built by its user holds plain bytes (Data).
type Frame struct {
	// Data is the message of a frame built by its user (ignored while the frame holds buffers).
	Data []byte
	buf  mem.BufferSlice
}

// Bytes returns the frame's content (a copy when it holds buffers).
func (f *Frame) Bytes() []byte {
	if f.buf != nil {
		return f.buf.Materialize()
	}
	return f.Data
}

// Free releases the buffers the frame still holds (a frame that was sent holds none).
func (f *Frame) Free() {
	if f.buf != nil {
		f.buf.Free()
		f.buf = nil
	}
}

// Keep turns a received frame into plain bytes, which it returns: the frame can then be sent more than
// once, or read after it was sent (a sent buffer goes to gRPC).
func (f *Frame) Keep() []byte {
	b := f.Bytes()
	f.Free()
	f.Data = b
	return b
}

// Codec passes frames through unchanged. It also marshals and unmarshals proto messages, so that a
// server or connection forced to it can still be used with generated types (an endpoint's own
// handlers, tests).
//
// Its name is "proto": the name becomes the content-subtype of forwarded calls
// ("application/grpc+proto"), which the runtime reads as the protobuf it is.
type Codec struct{}

var _ encoding.CodecV2 = Codec{}

// Marshal returns the frame's bytes, or the encoding of a proto message.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *Frame:
		if m.buf != nil {
			// The frame's reference goes to gRPC, which frees it once written.
			out := m.buf
			m.buf = nil
			return out, nil
		}
		return mem.BufferSlice{mem.SliceBuffer(m.Data)}, nil
	case proto.Message:
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("failed to marshal %T: %w", v, err)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
}

// Unmarshal takes the bytes into a frame, or decodes them into a proto message.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *Frame:
		// data is freed when Unmarshal returns: the frame takes its own reference.
		m.Free()
		data.Ref()
		m.buf, m.Data = data, nil
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
func (Codec) Name() string { return "proto" }

package grpcraw

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestFramePassesThrough checks a received frame's bytes go out unchanged, kept or not, and that proto
// messages still encode and decode.
func TestFramePassesThrough(t *testing.T) {
	want, err := proto.Marshal(wrapperspb.String("container-1"))
	if err != nil {
		t.Fatal(err)
	}
	var c Codec
	var f Frame
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(bytes.Clone(want))}, &f); err != nil {
		t.Fatal(err)
	}
	if f.Data != nil || !bytes.Equal(f.Bytes(), want) {
		t.Fatalf("received frame: data %q, bytes %q; want buffers holding %q", f.Data, f.Bytes(), want)
	}
	if got := f.Keep(); !bytes.Equal(got, want) || !bytes.Equal(f.Data, want) || f.buf != nil {
		t.Fatalf("Keep: %q (data %q, buffers %v), want %q in plain bytes", got, f.Data, f.buf != nil, want)
	}
	for range 2 { // a kept frame can be sent again
		out, err := c.Marshal(&f)
		if err != nil {
			t.Fatal(err)
		}
		if got := out.Materialize(); !bytes.Equal(got, want) {
			t.Fatalf("sent %q, want %q", got, want)
		}
	}
	var s wrapperspb.StringValue
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(want)}, &s); err != nil || s.GetValue() != "container-1" {
		t.Fatalf("decoded %q, %v", s.GetValue(), err)
	}
	if _, err := c.Marshal(42); err == nil {
		t.Error("marshalled an int")
	}
	if err := c.Unmarshal(nil, new(int)); err == nil {
		t.Error("unmarshalled into an int")
	}
}

// TestFrameFree checks Free gives the buffers back once, and that the codec is known as "proto".
func TestFrameFree(t *testing.T) {
	var f Frame
	if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{1, 2})}, &f); err != nil {
		t.Fatal(err)
	}
	f.Free()
	f.Free()
	if f.buf != nil || len(f.Bytes()) != 0 {
		t.Fatalf("after Free: buffers %v, bytes %v", f.buf != nil, f.Bytes())
	}
	if n := (Codec{}).Name(); n != "proto" {
		t.Errorf("Name %q, want proto (the content-subtype the runtime reads)", n)
	}
}

// TestCodecMarshal: a received frame goes out as its own buffers (no copy: the codec hands them to gRPC
// and the frame holds none after), and a proto message is encoded.
func TestCodecMarshal(t *testing.T) {
	var f Frame
	in := []byte{0x0a, 0x01, 'x'}
	if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(in)}, &f); err != nil {
		t.Fatal(err)
	}
	out, err := (Codec{}).Marshal(&f)
	if err != nil || !bytes.Equal(out.Materialize(), in) {
		t.Fatalf("Marshal(received frame) = %v, %v; want %v", out.Materialize(), err, in)
	}
	if f.buf != nil {
		t.Error("the frame still holds the buffers it handed to gRPC")
	}
	out.Free()
	m, err := (Codec{}).Marshal(wrapperspb.String("x"))
	if err != nil || !bytes.Equal(m.Materialize(), in) {
		t.Errorf("Marshal(StringValue x) = %v, %v; want %v", m.Materialize(), err, in)
	}
	if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0xff})}, new(wrapperspb.StringValue)); err == nil {
		t.Error("unmarshalled garbage into a StringValue")
	}
}

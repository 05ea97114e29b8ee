package kubelet

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
)

// ReadHook is the one seam between the endpoint and what adjusts the answers a client gets after the
// events it was sent: read freshness and the refresh after a stop (package fresh) each implement it,
// and the Proxy knows none of them. The Proxy tells a hook every event it sends, and hands it every call it wants; a hook forwards a call it wants to the
// runtime (through the hooks after it) as often as it needs, or answers it itself.
//
// A hook must be safe for concurrent use, and Wants and Sending cheap: they run for every call and
// every event.
type ReadHook interface {
	// Sending is told of each event, encoded, before it is written to a subscriber: a call the event
	// causes comes after it. It must not keep or modify the bytes.
	Sending(event []byte)
	// Wants says whether a call of method goes through Call.
	Wants(method string) bool
	// Call makes c, whose method it wants: forward sends it on (to the next hook that wants it, or
	// the runtime) and may be called any number of times (none: the hook answers itself, with
	// SetAnswer). Call returns an error only when the client is to get it instead of any answer.
	Call(ctx context.Context, c *Call, forward func(context.Context) error) error
}

// Call is one call of a client as the hooks see it: for a unary method, its request and the answer the
// client is to get; a streaming call (a method this build does not know) is only forwarded.
type Call struct {
	method string
	// u is the unary call; nil for a stream.
	u *unaryCall
	// ss is the client's stream, for a streaming call's forward.
	ss grpc.ServerStream
	// forwarded says whether the call reached the runtime.
	forwarded bool
}

// Method returns the call's full method name.
func (c *Call) Method() string { return c.method }

// Request returns a unary call's encoded request (nil for a stream). The bytes are the call's own: do
// not modify them.
func (c *Call) Request() []byte {
	if c.u == nil {
		return nil
	}
	return c.u.req.Data
}

// ObjectID returns the id a unary call's request names first (field 1: a container's or sandbox's id in
// the CRI's calls about one object), or "".
func (c *Call) ObjectID() string {
	id, _ := MessageID(c.Request())
	return id
}

// Answer returns the answer the client is to get so far: the message, encoded, or the runtime's error
// (nil, nil before a forward).
func (c *Call) Answer() ([]byte, error) {
	if c.u == nil {
		return nil, nil
	}
	if c.u.err != nil {
		return nil, c.u.err
	}
	// Kept: a second look costs no copy.
	return c.u.resp.Keep(), nil
}

// SetAnswer makes b (an encoded answer) the one the client gets, with no error. Unary calls only.
func (c *Call) SetAnswer(b []byte) {
	c.u.resp.Free()
	c.u.resp.Data, c.u.err = b, nil
}

// ClearAnswer forgets the answer so far (a hook that asks again). Unary calls only.
func (c *Call) ClearAnswer() { c.u.resp.Free() }

// hooked returns the hooks of hooks that want method.
func hooked(hooks []ReadHook, method string) []ReadHook {
	var out []ReadHook
	for _, h := range hooks {
		if h.Wants(method) {
			out = append(out, h)
		}
	}
	return out
}

// through makes c through hooks, then the runtime.
func (p *Proxy) through(ctx context.Context, c *Call, hooks []ReadHook) error {
	if len(hooks) == 0 {
		c.forwarded = true
		if c.u == nil {
			return p.forward(c.ss, c.method)
		}
		c.u.invoke(outgoingContext(ctx), p.backend)
		return nil
	}
	return hooks[0].Call(ctx, c, func(ctx context.Context) error { return p.through(ctx, c, hooks[1:]) })
}

// MessageID returns field 1 of an encoded message when it is a string (the id of a CRI request about one
// object, of a status), as a decoder reads it (its last occurrence), and whether there was one; it
// decodes nothing else.
func MessageID(b []byte) (id string, found bool) {
	for len(b) > 0 {
		num, wt, n := protowire.ConsumeTag(b)
		if n < 0 {
			return id, found
		}
		b = b[n:]
		if num == 1 && wt == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return id, found
			}
			id, found, b = string(v), true, b[n:]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, wt, b); n < 0 {
			return id, found
		}
		b = b[n:]
	}
	return id, found
}

package kubelet

import (
	"context"
	"errors"
	"io"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/pleg-nri/pleg-nri/internal/grpcraw"
)

// serveCall forwards a call other than the events: a call of a known unary method with gRPC's unary
// client path, one request and one answer on the handler's goroutine, and any other as a stream (on
// the wire the two are the same); through the hooks that want it (hook.go). It reports whether the
// call reached the runtime.
func (p *Proxy) serveCall(ss grpc.ServerStream, method string) (forwarded bool, err error) {
	c := Call{method: method, ss: ss}
	hooks := hooked(p.hooks, method)
	if !isUnary(method) {
		err := p.through(ss.Context(), &c, hooks)
		return c.forwarded, err
	}
	c.u = &unaryCall{method: method}
	defer c.u.release()
	if err := ss.RecvMsg(&c.u.req); err != nil {
		return false, err
	}
	if len(hooks) > 0 {
		// A hook may read the request, or send it more than once.
		c.u.req.Keep()
	}
	if err := p.through(ss.Context(), &c, hooks); err != nil {
		return c.forwarded, err
	}
	return c.forwarded, c.u.reply(ss)
}

// unaryCall is one forwarded call of a unary method: the client's request, and the runtime's last answer
// (message, header, trailer, error) as the client is to get it.
type unaryCall struct {
	method   string
	req      grpcraw.Frame
	resp     grpcraw.Frame
	hdr, trl metadata.MD
	err      error
}

// invoke sends the request to the runtime; its answer replaces the previous one.
func (c *unaryCall) invoke(ctx context.Context, backend *grpc.ClientConn) {
	c.resp.Free()
	c.hdr, c.trl = nil, nil
	c.err = backend.Invoke(ctx, c.method, &c.req, &c.resp, grpc.ForceCodecV2(grpcraw.Codec{}), grpc.Header(&c.hdr), grpc.Trailer(&c.trl))
}

// reply gives the client the answer: the runtime's header and trailer (see forwardableMD), then its
// message or its error.
func (c *unaryCall) reply(ss grpc.ServerStream) error {
	if len(c.hdr) > 0 {
		if err := ss.SetHeader(forwardableMD(c.hdr)); err != nil {
			return err
		}
	}
	ss.SetTrailer(forwardableMD(c.trl))
	if c.err != nil {
		return c.err
	}
	return ss.SendMsg(&c.resp)
}

// free releases the buffers the call still holds.
func (c *unaryCall) release() {
	c.req.Free()
	c.resp.Free()
}

// streamDesc describes every forwarded call: a bidirectional stream is the general form of all four
// kinds of gRPC method, and on the wire it is the same.
var streamDesc = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// forward proxies one call to the backend. The backend's status error is returned unchanged, so the
// client gets its code, message and details.
func (p *Proxy) forward(ss grpc.ServerStream, method string) error {
	ctx, cancel := context.WithCancel(outgoingContext(ss.Context()))
	defer cancel()

	cs, err := p.backend.NewStream(ctx, streamDesc, method, grpc.ForceCodecV2(grpcraw.Codec{}))
	if err != nil {
		return err
	}

	// Client -> backend, in its own goroutine. It ends with the client's half-close (or the end of the
	// call: ctx is canceled when this handler returns).
	go func() {
		for {
			var f grpcraw.Frame
			if err := ss.RecvMsg(&f); err != nil {
				if errors.Is(err, io.EOF) {
					_ = cs.CloseSend()
				}
				return
			}
			err := cs.SendMsg(&f)
			f.Free()
			if err != nil {
				// The backend ended the call; RecvMsg below returns its status.
				return
			}
		}
	}()

	// Backend -> client. Headers go as soon as the backend sends them (a trailers-only answer has none).
	if hdr, err := cs.Header(); err == nil && len(hdr) > 0 {
		if err := ss.SendHeader(forwardableMD(hdr)); err != nil {
			return err
		}
	}
	for {
		var f grpcraw.Frame
		if err := cs.RecvMsg(&f); err != nil {
			ss.SetTrailer(forwardableMD(cs.Trailer()))
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		err := ss.SendMsg(&f)
		f.Free()
		if err != nil {
			return err
		}
	}
}

// outgoingContext returns ctx (a forwarded call's) with the client's metadata, less what gRPC sets on each
// hop, to send to the runtime.
func outgoingContext(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	return metadata.NewOutgoingContext(ctx, forwardableMD(md))
}

// forwardableMD returns a copy of md without the keys gRPC itself sets on the next hop (pseudo-headers,
// content type, user agent, encodings, timeout); the deadline is carried by the context.
func forwardableMD(md metadata.MD) metadata.MD {
	out := make(metadata.MD, len(md))
	for k, v := range md {
		if strings.HasPrefix(k, ":") {
			continue
		}
		switch k {
		case "content-type", "user-agent", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding",
			"grpc-message", "grpc-status", "grpc-status-details-bin":
			continue
		}
		out[k] = append([]string(nil), v...)
	}
	return out
}

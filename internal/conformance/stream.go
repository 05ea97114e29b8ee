package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// received is one event as a subscriber got it.
type received struct {
	ev *runtimeapi.ContainerEventResponse
	// at is when the subscriber received it (Options.Now).
	at time.Time
}

// recorder is one subscription to the endpoint's stream: it keeps every event with its receipt time,
// until the stream ends or its context is cancelled.
type recorder struct {
	now func() time.Time
	// onEvent, if set, is called in the receiving goroutine for each event, before the next is read.
	onEvent func(received)

	// mu guards evs, err and changed.
	mu  sync.Mutex
	evs []received
	// err is how the stream ended (nil while it is open).
	err error
	// changed is closed and replaced at every event and at the end.
	changed chan struct{}
	done    chan struct{}
	cancel  context.CancelFunc
}

// subscribe opens a stream and records it in a goroutine until stop.
func subscribe(ctx context.Context, rt runtimeapi.RuntimeServiceClient, now func() time.Time, onEvent func(received)) (*recorder, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("failed to subscribe to the container events: %w", err)
	}
	r := &recorder{now: now, onEvent: onEvent, changed: make(chan struct{}), done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(r.done)
		for {
			ev, err := stream.Recv()
			if err != nil {
				r.mu.Lock()
				r.err = err
				close(r.changed)
				r.changed = make(chan struct{})
				r.mu.Unlock()
				return
			}
			rec := received{ev: ev, at: r.now()}
			if r.onEvent != nil {
				r.onEvent(rec)
			}
			r.mu.Lock()
			r.evs = append(r.evs, rec)
			close(r.changed)
			r.changed = make(chan struct{})
			r.mu.Unlock()
		}
	}()
	return r, nil
}

// stop ends the subscription and waits for its goroutine.
func (r *recorder) stop() {
	r.cancel()
	<-r.done
}

// events returns what was received so far, in order, keeping those keep selects.
func (r *recorder) events(keep func(*runtimeapi.ContainerEventResponse) bool) []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []received
	for _, e := range r.evs {
		if keep(e.ev) {
			out = append(out, e)
		}
	}
	return out
}

// ended returns how the stream ended; nil while it is open.
func (r *recorder) ended() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// waitFor waits until cond holds of the events received (all of them), the stream ends, or timeout.
func (r *recorder) waitFor(ctx context.Context, timeout time.Duration, cond func([]received) bool) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		r.mu.Lock()
		ok, changed, ended := cond(r.evs), r.changed, r.err != nil
		r.mu.Unlock()
		if ok || ended {
			return ok
		}
		select {
		case <-changed:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// Support is what the probe of an endpoint found of its event stream.
type Support int

const (
	// Supported: the stream opened and stayed open.
	Supported Support = iota
	// SaysUnsupported: the stream ended at once with Unimplemented or FailedPrecondition, as a runtime
	// without events (or with them disabled) should answer.
	SaysUnsupported
	// EndsAtOnce: the stream ended at once with io.EOF or another status: a kubelet burns a retry on
	// each, and gives up after 5, without knowing why.
	EndsAtOnce
)

// Classify says what the first end of a fresh stream (nil: still open after the probe's wait) means.
func Classify(err error) Support {
	switch {
	case err == nil:
		return Supported
	case errors.Is(err, io.EOF):
		return EndsAtOnce
	}
	switch status.Code(err) {
	case codes.Unimplemented, codes.FailedPrecondition:
		return SaysUnsupported
	}
	return EndsAtOnce
}

// probe opens a stream and waits up to wait for it to end: nil if it stays open.
func probe(ctx context.Context, rt runtimeapi.RuntimeServiceClient, wait time.Duration) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		return err
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		return err
	case <-time.After(wait):
		cancel()
		<-ended
		return nil
	}
}

func isNotFound(err error) bool { return status.Code(err) == codes.NotFound }

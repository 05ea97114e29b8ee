package pleg

import (
	"context"
	"time"

	"github.com/containerd/log"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// checkpointSettle is the least delay between a change and the write that records it, so a burst of
// events makes one write.
const checkpointSettle = 20 * time.Millisecond

// ckptWriter is the state of the checkpoint writer; only the goroutine that writes (checkpointLoop,
// then Run's final write) uses it.
type ckptWriter struct {
	// write replaces the file durably; nil is writeCheckpointFile (tests that write thousands of
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
	c := p.st.snapshot(mark, p.cfg.CheckpointScope, p.clock())
	p.mu.Unlock()

	start := time.Now()
	data, cache, err := encodeCheckpoint(c, w.cache)
	if err == nil {
		write := w.write
		if write == nil {
			write = writeCheckpointFile
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
	c := p.st.snapshot(p.fan.delivered(), p.cfg.CheckpointScope, p.clock())
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

// phaseEvent is the event type that reports phase ph (PhaseCreated to PhaseRemoved).
func phaseEvent(ph Phase) runtimeapi.ContainerEventType {
	switch ph {
	case PhaseCreated:
		return runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
	case PhaseRunning:
		return runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
	case PhaseExited:
		return runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
	}
	return runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT
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

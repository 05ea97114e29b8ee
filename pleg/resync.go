package pleg

import (
	"context"
	"time"
)

// DefaultResyncDelays are the relists after a (re)synchronization with containerd (Resync), besides the
// one at once.
//
// After a restart of pleg-nri's core or of containerd, containerd settles what happened while one of
// them was down a little later than it answers: a container that exited while the core was down was
// reported by a /tasks/exit that nobody received, and containerd's CRI may still say RUNNING at the
// startup relist (its exit handler deletes the task, then updates the status); a container that exited
// while containerd was down is found by containerd's recovery after its NRI and CRI already answer.
// Without more relists, such an exit waits for the next periodic relist (relist-period, 10 s): the
// kubelet then restarts the container 10 s late. A quiet relist emits nothing and costs no status call
// (about 0.6 ms for 1,000 containers), so a few in the seconds after a reconnection cost nothing.
var DefaultResyncDelays = []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second}

// resyncer triggers relists at its delays after each kick, until its context is done. A kick during a
// schedule starts it again.
type resyncer struct {
	relist func()
	delays []time.Duration
	kick   chan struct{}
}

func newResyncer(relist func(), delays []time.Duration) *resyncer {
	return &resyncer{relist: relist, delays: delays, kick: make(chan struct{}, 1)}
}

// Kick relists at once and schedules the settle relists.
func (s *resyncer) Kick() {
	s.relist()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run runs the schedule until ctx is done.
func (s *resyncer) run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.kick:
		}
	schedule:
		for i, prev := 0, time.Duration(0); i < len(s.delays); i++ {
			t := time.NewTimer(s.delays[i] - prev)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-s.kick:
				t.Stop()
				i, prev = -1, 0
				continue schedule
			case <-t.C:
				s.relist()
			}
			prev = s.delays[i]
		}
	}
}

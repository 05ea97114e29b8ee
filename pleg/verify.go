package pleg

// The verification of a STARTED or STOPPED built from the fast inputs: containerd's status, asked again
// with backoff until it shows the exit, and the corrected STOPPED when it differs.

import (
	"context"
	"time"

	"github.com/containerd/log"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/retry"
)

// Bounds of the exit verification: containerd's exit handling (task.Delete) can take seconds under IO
// pressure, and a containerd that was down answers only once it is back.
const (
	maxVerifyDelay    = 30 * time.Second // cap of the doubling delay between two verification calls
	maxVerifyAttempts = 12               // about 3 minutes with the default first delay
)

// verify schedules the delayed verification status call of o. exit says it checks an exit: it is then
// asked again until containerd's answer shows the exit (reverify).
func (s *state) verify(o *object, exit bool) {
	if o.verifying || s.verifyDelay < 0 {
		return
	}
	o.verifying = true
	o.verifyExit = exit
	o.verifyAttempt = 1
	s.fetch.push(fetchReq{id: o.id, kind: o.kind, verify: true, due: s.clock().Add(s.verifyDelay)})
}

// reverify schedules the next exit verification call of o, with a doubling delay, unless the attempts
// are used up or the container is gone.
func (s *state) reverify(ctx context.Context, o *object) {
	if o.verifying || o.dropped || o.phase == PhaseRemoved || o.emitted == PhaseRemoved {
		return
	}
	if o.verifyAttempt >= maxVerifyAttempts {
		log.G(ctx).WithField("container", o.id).WithField("attempts", o.verifyAttempt).
			Warn("containerd's status never showed the exit that was reported: the STOPPED is not verified")
		return
	}
	d := retry.Nth(s.verifyDelay, maxVerifyDelay, o.verifyAttempt)
	o.verifyAttempt++
	o.verifying = true
	s.fetch.push(fetchReq{id: o.id, kind: o.kind, verify: true, due: s.clock().Add(d)})
}

// applyVerify applies the answer of a verification call (verify): the status known is replaced by
// containerd's, and an exit containerd does not show yet is asked again (reverify).
func (s *state) applyVerify(ctx context.Context, o *object, r *fetchResult) {
	o.verifying = false
	logger := log.G(ctx).WithField(o.kind.String(), o.id)
	if r.err != nil {
		if !isNotFound(r.err) {
			logger.WithError(r.err).Debug("verification status call failed")
			if o.verifyExit {
				s.reverify(ctx, o)
			}
		}
		return
	}
	oldC, oldS := o.ctrSent, o.sbSent
	s.update(ctx, o, statusObs(o, r))
	if (o.kind == KindContainer && !proto.Equal(oldC, o.ctrSent)) || (o.kind == KindSandbox && !proto.Equal(oldS, o.sbSent)) {
		s.metrics.StatusMismatch(o.kind)
		if log.GetLevel() >= log.DebugLevel {
			logger.Debug("verified status differs from the one emitted: cache updated")
		}
	}
	if o.verifyExit && o.kind == KindContainer && o.ctrAnswer.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
		s.reverify(ctx, o) // containerd has not finished its exit handling yet: ask again
	}
	s.flush(ctx, o.pod)
}

// exitDiffers reports whether the status of an exited container differs from the one its last STOPPED
// carried (sent) in a field the kubelet reads from an exited container: exit code, reason, message,
// finished_at (and started_at). A nil sent (none emitted, or restored without it) never differs.
func exitDiffers(sent, now *runtimeapi.ContainerStatus) bool {
	if sent == nil || now == nil || now.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		return false
	}
	return sent.ExitCode != now.ExitCode || sent.Reason != now.Reason || sent.Message != now.Message ||
		sent.FinishedAt != now.FinishedAt || sent.StartedAt != now.StartedAt
}

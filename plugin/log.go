package plugin

import (
	"context"

	"github.com/containerd/log"
	nrilog "github.com/containerd/nri/pkg/log"
)

// stubLogger routes the NRI stub's logs to containerd/log, the daemon's logger.
type stubLogger struct{}

var _ nrilog.Logger = stubLogger{}

func (stubLogger) entry(ctx context.Context) *log.Entry {
	if ctx == nil {
		ctx = context.Background()
	}
	return log.G(ctx).WithField("component", "nri-stub")
}

// Debugf logs at debug level.
func (l stubLogger) Debugf(ctx context.Context, format string, args ...any) {
	l.entry(ctx).Debugf(format, args...)
}

// Infof logs at info level.
func (l stubLogger) Infof(ctx context.Context, format string, args ...any) {
	l.entry(ctx).Infof(format, args...)
}

// Warnf logs at warning level.
func (l stubLogger) Warnf(ctx context.Context, format string, args ...any) {
	l.entry(ctx).Warnf(format, args...)
}

// Errorf logs at error level.
func (l stubLogger) Errorf(ctx context.Context, format string, args ...any) {
	l.entry(ctx).Errorf(format, args...)
}

package containerd

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// waitTimeout bounds every wait of a test for what a working machine does at once.
const waitTimeout = 10 * time.Second

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// recv returns the next value from ch, and fails t when none comes within waitTimeout.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	return testutil.Next(t, ch, what, waitTimeout)
}

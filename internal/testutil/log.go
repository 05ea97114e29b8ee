package testutil

import (
	"bytes"
	"sync"
	"testing"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
)

// LogBuffer is what a logger wrote, safe for concurrent use.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Reset forgets what was written so far.
func (b *LogBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}

// CaptureLog makes log.L (containerd/log's logger: what code without a context's logger writes to)
// write to the returned buffer until the test ends. log.L is global: not for parallel tests.
func CaptureLog(t testing.TB) *LogBuffer {
	t.Helper()
	var b LogBuffer
	logger := logrus.New()
	logger.SetOutput(&b)
	old := log.L
	log.L = logrus.NewEntry(logger)
	t.Cleanup(func() { log.L = old })
	return &b
}

package testutil

import (
	"bytes"
	"sync"
	"testing"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
)

// SyncBuffer is a buffer that writers (a logger, a process's output) fill while the test reads it, safe
// for concurrent use.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Reset forgets what was written so far.
func (b *SyncBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}

// CaptureLog makes log.L (containerd/log's logger: what code without a context's logger writes to)
// write to the returned buffer until the test ends. log.L is global: not for parallel tests.
func CaptureLog(t testing.TB) *SyncBuffer {
	t.Helper()
	var b SyncBuffer
	logger := logrus.New()
	logger.SetOutput(&b)
	old := log.L
	log.L = logrus.NewEntry(logger)
	t.Cleanup(func() { log.L = old })
	return &b
}

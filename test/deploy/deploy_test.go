// Package deploy tests pleg-nri's deployment artifacts for real: the systemd units under systemd (in a
// Debian bookworm container booted with /sbin/init, next to a real containerd) and the Helm chart
// (rendered by a helm built from the Go module proxy). make test-deploy builds what they need and sets
// PLEG_NRI_DEPLOY_TESTS=1; without it, a test whose environment is absent skips loudly, with it such a
// test fails.
package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/internal/testutil/plegnribin"
)

// TestMain runs the tests and removes the pleg-nri they built.
func TestMain(m *testing.M) {
	code := m.Run()
	plegnribin.Cleanup()
	os.Exit(code)
}

// repoRoot is the repository's root directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// cacheDir is the dependency cache (containerd, runc, helm).
func cacheDir() string {
	if c := os.Getenv("PLEG_NRI_CACHE"); c != "" {
		return c
	}
	return "/var/cache/pleg-nri"
}

// need fails the test under make test-deploy, or skips it loudly otherwise, when its environment is
// absent.
func need(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if ok {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("PLEG_NRI_DEPLOY_TESTS") == "1" {
		t.Fatalf("environment absent under make test-deploy: %s", msg)
	}
	t.Skipf("SKIP (loud): %s (make test-deploy builds it)", msg)
}

// pollDetail waits until cond holds, asking every interval for at most d; the error holds cond's last
// detail.
func pollDetail(d, interval time.Duration, what string, cond func() (bool, string)) error {
	return testutil.PollEvery(context.Background(), d, interval, what, func() (bool, error) {
		ok, detail := cond()
		return ok, errors.New(detail)
	})
}

// run runs name with args and returns its combined output; an error fails the test with that output.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// tryRun runs name with args and returns its output and error.
func tryRun(name string, args ...string) (string, error) {
	var b bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

// Package plegnribin builds the pleg-nri binary (cmd/pleg-nri) for the tests that run the whole
// program rather than its packages: cmd/pleg-nri's daemon tests, test/containerd-it, test/kubelet-e2e
// and test/deploy. Each kind of binary (Options) is built once per process, into one directory that
// Cleanup removes; test/containerd-it/plegnri runs it against a test containerd.
//
// It imports nothing but the standard library, so that a test importing it pulls in no dependency.
package plegnribin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// Options say which pleg-nri to build.
type Options struct {
	// Version is the binary's version (main.version, what `pleg-nri version` prints); empty keeps the
	// source's default.
	Version string
	// Static builds it as the image's binary is built (deploy/image/build.sh): CGO_ENABLED=0 and
	// -trimpath, for a container whose libc is not the host's.
	Static bool
}

// The binaries the tests build.
var (
	// Default is pleg-nri as `go build` makes it.
	Default = Options{}
	// Upgraded is another version of it: a different binary, as an upgrade installs.
	Upgraded = Options{Version: "v99.0.0-upgrade-test"}
	// Deploy is the static binary the deployment tests install in their nodes.
	Deploy = Options{Version: "deploy-test", Static: true}
)

// name is the binary's file name: pleg-nri for Default, pleg-nri-VERSION[-static] otherwise.
func (o Options) name() string {
	n := "pleg-nri"
	if o.Version != "" {
		n += "-" + strings.ReplaceAll(o.Version, "/", "_")
	}
	if o.Static {
		n += "-static"
	}
	return n
}

var (
	// mu guards dir, builds and each build's done.
	mu sync.Mutex
	// dir holds every binary of the process (made by the first Build).
	dir string
	// builds memoizes Build.
	builds = map[Options]*build{}
)

type build struct {
	once sync.Once
	path string
	err  error
	// done says that the build succeeded.
	done bool
}

// Build builds pleg-nri as opts say, once per process, and returns the binary's path. Callers at the
// same time wait for the one build.
func Build(opts Options) (string, error) {
	mu.Lock()
	if dir == "" {
		d, err := os.MkdirTemp("", "pleg-nri-bin-")
		if err != nil {
			mu.Unlock()
			return "", err
		}
		dir = d
	}
	b := builds[opts]
	if b == nil {
		b = &build{path: filepath.Join(dir, opts.name())}
		builds[opts] = b
	}
	mu.Unlock()
	b.once.Do(func() {
		b.err = goBuild(b.path, opts)
		mu.Lock()
		b.done = b.err == nil
		mu.Unlock()
	})
	if b.err != nil {
		return "", b.err
	}
	return b.path, nil
}

// Binary is Build for a test: a failed build fails tb.
func Binary(tb testing.TB, opts Options) string {
	tb.Helper()
	bin, err := Build(opts)
	if err != nil {
		tb.Fatal(err)
	}
	return bin
}

// Built returns the path of the binary Build made for opts, or "" when it has not made it (yet): what
// a test looks for among the processes left behind.
func Built(opts Options) string {
	mu.Lock()
	defer mu.Unlock()
	if b := builds[opts]; b != nil && b.done {
		return b.path
	}
	return ""
}

// Cleanup removes every binary Build made; a TestMain calls it once its tests are done.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
	dir, builds = "", map[Options]*build{}
}

// goBuild builds cmd/pleg-nri into bin.
func goBuild(bin string, opts Options) error {
	if out, err := goBuildCmd(bin, opts).CombinedOutput(); err != nil {
		return fmt.Errorf("go build pleg-nri (%+v): %w\n%s", opts, err, out)
	}
	return nil
}

// goBuildCmd is the go build of cmd/pleg-nri into bin.
func goBuildCmd(bin string, opts Options) *exec.Cmd {
	args := []string{"build", "-o", bin}
	if opts.Static {
		args = append(args, "-trimpath")
	}
	if opts.Version != "" {
		args = append(args, "-ldflags", "-X main.version="+opts.Version)
	}
	cmd := exec.Command("go", append(args, "./cmd/pleg-nri")...)
	cmd.Dir = moduleRoot()
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if opts.Static {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	}
	return cmd
}

// moduleRoot is the repository's root directory (this file is internal/testutil/plegnribin/...).
func moduleRoot() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(self), "..", "..", ".."))
}

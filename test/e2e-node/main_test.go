// Package e2enode runs upstream's node e2e suite (test/e2e_node of k8s.io/kubernetes, built unmodified
// from the Go module proxy by hack/build-e2e-node.sh) against the integration harness's containerd and
// the real kubelet of one version, in the three PLEG setups of the kubelet suite:
//
//   - generic: GenericPLEG, the kubelet's runtime endpoint is containerd;
//   - containerd: EventedPLEG on, the endpoint is containerd (its own GetContainerEvents stream);
//   - pleg-nri: EventedPLEG on, the endpoint is pleg-nri's, which forwards every other call.
//
// The suite starts its own etcd, API server and kubelet; this package gives it the node: containerd
// with NRI, pleg-nri, the images the selected tests use (built offline under the names the suite asks
// for, see images.go) and a kubelet configuration this machine can run. Each run's results are kept in
// docs/e2e-node-<version>.json and summed up in docs/e2e-node-<version>.md (report.go).
//
// It runs only under make e2e-node (PLEG_NRI_E2E_NODE=1): it takes the node's kubelet ports and
// /var/lib/kubelet, and one selection takes from minutes to hours.
package e2enode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil/plegnribin"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/kubelet"
)

// enableEnv must be 1 for the suite to run (make e2e-node sets it).
const enableEnv = "PLEG_NRI_E2E_NODE"

var (
	// env is the containerd every setup runs on, one setup at a time.
	env *harness.Env
	// suiteDir holds e2e_node.test, ginkgo and agnhost; kubeletBinary is the kubelet of the same
	// version; plegNRIBinary is built from this tree.
	suiteDir, kubeletBinary, plegNRIBinary string
	// version is the kubelet's and the suite's ("v1.37.2").
	version string
)

// suiteEnabled says the suite runs (make e2e-node); without it only the report's unit tests do.
var suiteEnabled = os.Getenv(enableEnv) == "1"

// reportOnlyEnv, set to a version, rewrites docs/e2e-node-<version>.md from its .json and runs nothing.
// With reimportEnv set to a selection's name too, it first saves that selection's runs of the version
// again from the JUnit reports they left under E2E_NODE_RESULTS (for runs whose saving failed).
const (
	reportOnlyEnv = "E2E_NODE_REPORT_ONLY"
	reimportEnv   = "E2E_NODE_REIMPORT"
)

func TestMain(m *testing.M) {
	if v := os.Getenv(reportOnlyEnv); v != "" {
		if sel := os.Getenv(reimportEnv); sel != "" {
			if err := reimport(v, sel, envOr(resultsEnv, "/tmp/pleg-nri-e2e-node")); err != nil {
				fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
				os.Exit(1)
			}
		}
		if err := writeReport(v); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "e2e-node: rewrote %s\n", docsPath(v, ".md"))
		os.Exit(0)
	}
	if !suiteEnabled {
		fmt.Fprintf(os.Stderr, "e2e-node: upstream's node e2e suite NOT RUN: it runs only under make e2e-node (%s=1); the report's unit tests run\n", enableEnv)
		os.Exit(m.Run())
	}
	os.Exit(run(m))
}

func run(m *testing.M) (code int) {
	ctx := context.Background()
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
		return 1
	}
	if os.Geteuid() != 0 || runtime.GOOS != "linux" {
		return fail("the node e2e suite needs root on Linux (it runs containerd, runc and a kubelet)")
	}
	version = os.Getenv("KUBELET_VERSION")
	if version == "" {
		version = "v1.37.2"
	}
	// The kubelet suite's lock: one kubelet on the machine at a time.
	unlock, err := kubelet.Lock(ctx, os.Stderr)
	if err != nil {
		return fail("%v", err)
	}
	defer unlock()
	kubelet.CleanStale(ctx, os.Stderr)

	start := time.Now()
	if kubeletBinary, err = script(ctx, "kubelet-e2e/hack/build-kubelet.sh"); err != nil {
		return fail("%v", err)
	}
	if suiteDir, err = script(ctx, "e2e-node/hack/build-e2e-node.sh"); err != nil {
		return fail("%v", err)
	}
	fmt.Fprintf(os.Stderr, "e2e-node: kubelet %s, suite %s (%s)\n", kubeletBinary, suiteDir, time.Since(start).Round(time.Second))

	env, err = harness.New(ctx, harness.Options{Log: os.Stderr, HostReachable: true})
	if err != nil {
		return fail("cannot set up the containerd environment: %v", err)
	}
	defer func() {
		if err := env.Teardown(context.Background()); err != nil {
			code = fail("containerd environment teardown: %v", err)
		}
	}()
	if err := env.Start(ctx); err != nil {
		return fail("cannot start containerd: %v", err)
	}
	defer plegnribin.Cleanup()
	if plegNRIBinary, err = plegnribin.Build(plegnribin.Default); err != nil {
		return fail("%v", err)
	}
	fmt.Fprintf(os.Stderr, "e2e-node: containerd %d ready (%s)\n", env.PID, env.Dir)
	unlink, err := linkSocket(cadvisorContainerdSocket, env.Address)
	if err != nil {
		return fail("%v", err)
	}
	defer func() {
		if err := unlink(); err != nil {
			code = fail("%v", err)
		}
	}()
	return m.Run()
}

// cadvisorContainerdSocket is where the kubelet's cAdvisor looks for containerd: its --containerd flag,
// which the kubelet does not expose. Upstream's job runs containerd there; without it cAdvisor has no
// containerd handler and /metrics/cadvisor no container's metrics.
const cadvisorContainerdSocket = "/run/containerd/containerd.sock"

// linkSocket makes path a symbolic link to socket, for as long as the run: nothing may be at path but a
// killed run's link to a socket that is gone (another containerd's socket is never replaced). unlink
// removes the link, and the directory it made.
func linkSocket(path, socket string) (unlink func() error, err error) {
	if fi, err := os.Lstat(path); err == nil {
		// A link to a socket that is gone is a killed run's: replace it.
		if _, serr := os.Stat(path); fi.Mode()&os.ModeSymlink != 0 && os.IsNotExist(serr) {
			if err := os.Remove(path); err != nil {
				return nil, err
			}
			return linkSocket(path, socket)
		}
		return nil, fmt.Errorf("%s exists (another containerd on this machine?): the kubelet's cAdvisor would read "+
			"that one instead of the harness's; stop it or remove the file", path)
	}
	dir := filepath.Dir(path)
	_, statErr := os.Stat(dir)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	if err := os.Symlink(socket, path); err != nil {
		return nil, err
	}
	return func() error {
		if err := os.Remove(path); err != nil {
			return err
		}
		if os.IsNotExist(statErr) {
			return os.Remove(dir)
		}
		return nil
	}, nil
}

// script runs one of the build scripts under test/ (each builds into the dependency cache once, then
// only prints where) and returns what it printed.
// repoRoot is the repository's root.
func repoRoot() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(self), "..", "..")
}

func script(ctx context.Context, rel string, args ...string) (string, error) {
	_, self, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(self), "..", rel)
	cmd := exec.CommandContext(ctx, "bash", append([]string{path}, args...)...)
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), "KUBELET_VERSION="+version)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s failed: %w", rel, err)
	}
	return strings.TrimSpace(string(out)), nil
}

package e2enode

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/cadvisorlag"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/plegnri"
	"github.com/pleg-nri/pleg-nri/test/e2eimages"
	"github.com/pleg-nri/pleg-nri/test/junit"
)

// setup is one way the kubelet learns about container changes.
type setup struct {
	Name    string
	Evented bool
	PlegNRI bool
	// Flags are pleg-nri's extra flags.
	Flags []string
	// Optional setups run only when PLEG names them.
	Optional bool
}

var setups = []setup{
	{Name: "generic"},
	{Name: "containerd", Evented: true},
	{Name: "pleg-nri", Evented: true, PlegNRI: true},
	// pleg-nri with refresh-after-stop (docs/internals.md, "Refresh after a stop").
	{Name: "pleg-nri-refresh", Evented: true, PlegNRI: true, Flags: []string{"--refresh-after-stop"}, Optional: true},
	// pleg-nri as docs/operations.md configures it for a kubelet 1.35 or 1.36: refresh-after-stop and
	// a 1 s cache tick (docs/internals.md, "The cache tick").
	{Name: "pleg-nri-tick", Evented: true, PlegNRI: true, Flags: []string{"--refresh-after-stop", "--cache-tick=1s"}, Optional: true},
}

// The run's parameters, from make e2e-node.
const (
	// plegEnv lists the setups to run ("generic,containerd,pleg-nri", the default, in that order).
	plegEnv = "PLEG"
	// selectionEnv names the selection in the report ("quick", "job", or any name for a custom one).
	selectionEnv = "E2E_NODE_SELECTION"
	// runEnv numbers a run of the selection (default 1): 2, 3, ... run it again, kept beside the first
	// to show a flake (make e2e-node-quick RUN=2).
	runEnv = "E2E_NODE_RUN"
	// focusEnv and skipEnv are ginkgo's --focus and --skip (regular expressions over the spec names).
	focusEnv = "FOCUS"
	skipEnv  = "SKIP"
	// procsEnv is how many ginkgo processes run specs in parallel (default 4, as the specs mostly wait).
	procsEnv = "E2E_NODE_PROCS"
	// timeoutEnv bounds one setup's run (a Go duration; default 4h).
	timeoutEnv = "E2E_NODE_TIMEOUT"
	// resultsEnv is where runs leave their logs, JUnit and the kubelet's log (default /tmp/pleg-nri-e2e-node).
	resultsEnv = "E2E_NODE_RESULTS"
)

// kubeletRoot is where the suite runs its kubelet (services.KubeletRootDirectory, fixed upstream).
const kubeletRoot = "/var/lib/kubelet"

// TestNodeE2E runs the selection once per setup, one after the other on the same containerd, and
// records each run. It fails when a setup could not run the suite at all (no JUnit), or when a test
// that passed with GenericPLEG in this run failed with an evented setup: the report names every
// difference, whichever way.
func TestNodeE2E(t *testing.T) {
	if !suiteEnabled {
		t.Skipf("NOT RUN: upstream's node e2e suite runs only under make e2e-node (%s=1)", enableEnv)
	}
	ctx := context.Background()
	sel := selection{
		Name:  envOr(selectionEnv, "custom"),
		Focus: os.Getenv(focusEnv),
		Skip:  os.Getenv(skipEnv),
	}
	if n, err := strconv.Atoi(envOr(runEnv, "1")); err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", runEnv, os.Getenv(runEnv))
	} else if n > 1 && os.Getenv(shardEnv) != "" {
		t.Fatalf("%s=%d with %s=%s: a shard is run again under another E2E_NODE_SELECTION (its shards merge per name)", runEnv, n, shardEnv, os.Getenv(shardEnv))
	} else if n > 1 {
		sel.Run = n
		if err := checkRepeat(version, sel); err != nil {
			t.Fatal(err)
		}
	}
	procs, err := strconv.Atoi(envOr(procsEnv, "4"))
	if err != nil || procs < 1 {
		t.Fatalf("%s=%q: want a positive number", procsEnv, os.Getenv(procsEnv))
	}
	timeout, err := time.ParseDuration(envOr(timeoutEnv, "4h"))
	if err != nil {
		t.Fatalf("%s: %v", timeoutEnv, err)
	}
	chosen, err := chooseSetups(os.Getenv(plegEnv))
	if err != nil {
		t.Fatal(err)
	}
	results := envOr(resultsEnv, "/tmp/pleg-nri-e2e-node")
	if s := os.Getenv(shardEnv); s != "" {
		index, count, err := parseShard(s)
		if err != nil {
			t.Fatal(err)
		}
		var part []string
		var ordered []int
		sel, part, ordered, err = cutShard(ctx, sel, index, count, filepath.Join(results, version, shardName(sel.Name, splitOrdered, index, count), "list"))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("shard %d of %d: %d of the selection's %d specs (the selection's %d Ordered containers kept whole, of %v specs), stored as selection %q:\n  %s",
			index, count, len(part), sel.Shard.Selected, len(ordered), ordered, sel.Name, strings.Join(part, "\n  "))
	}
	names, err := e2eimages.List(ctx, filepath.Join(suiteDir, "e2e_node.test"))
	if err != nil {
		t.Fatal(err)
	}
	images, archives, err := e2eimages.Builder{Root: repoRoot(), Cache: env.Cache, Agnhost: filepath.Join(suiteDir, "agnhost"),
		Version: version}.Build(ctx, names)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Import(ctx, archives...); err != nil {
		t.Fatal(err)
	}
	for _, im := range images {
		if !im.Built {
			t.Logf("image NOT BUILT (a test that runs it fails alike in every setup): %s: %s", im.Name, im.Why)
		}
	}
	if bin := os.Getenv(registryEnv); bin != "" {
		// Not under the results: cleaning the node between setups kills what runs from there.
		addr, err := testutil.FreeLoopbackAddr()
		if err != nil {
			t.Fatal(err)
		}
		r, err := e2eimages.StartRegistry(ctx, bin, t.TempDir(), addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Stop)
		hosts, err := mirror(ctx, r, images)
		t.Cleanup(func() {
			if err := unmirror(hosts); err != nil {
				t.Error(err)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("registry on %s holds every image built; containerd pulls %s from it", r.Addr, strings.Join(hosts, ", "))
	} else {
		t.Logf("NO REGISTRY (%s is not set): the specs that pull an image fail alike in every setup", registryEnv)
	}
	var runs []suiteRun
	for _, s := range chosen {
		t.Run(s.Name, func(t *testing.T) {
			r := runSetup(t, ctx, s, sel, procs, timeout, filepath.Join(results, version, runDirName(sel), s.Name))
			r.Images = images
			runs = append(runs, r)
			if err := saveRun(version, r); err != nil {
				t.Errorf("saving the run: %v", err)
			}
		})
	}
	if err := writeReport(version); err != nil {
		t.Errorf("writing the report: %v", err)
	}
	hasGeneric := false
	for _, r := range runs {
		hasGeneric = hasGeneric || r.Setup == "generic"
	}
	if !hasGeneric {
		t.Log("no GenericPLEG run in this run: nothing to compare with here (the report compares with the runs kept)")
	}
	for _, r := range genericRegressions(runs) {
		t.Error(r)
	}
}

// runDirName is the directory of a run's results under the version's: the selection's name, and the
// run's number when it is a repeat.
func runDirName(sel selection) string {
	if sel.run() > 1 {
		return fmt.Sprintf("%s-run%d", sel.Name, sel.run())
	}
	return sel.Name
}

func chooseSetups(list string) ([]setup, error) {
	var out []setup
	if list == "" {
		for _, s := range setups {
			if !s.Optional {
				out = append(out, s)
			}
		}
		return out, nil
	}
	for _, name := range strings.Split(list, ",") {
		found := false
		for _, s := range setups {
			if s.Name == strings.TrimSpace(name) {
				out, found = append(out, s), true
			}
		}
		if !found {
			return nil, fmt.Errorf("%s: unknown setup %q (want generic, containerd, pleg-nri, pleg-nri-refresh or pleg-nri-tick)", plegEnv, name)
		}
	}
	return out, nil
}

// runSetup runs the selection on one setup: a clean node, pleg-nri for its setup, the suite.
func runSetup(t *testing.T, ctx context.Context, s setup, sel selection, procs int, timeout time.Duration, dir string) suiteRun {
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cleanNode(ctx, dir); err != nil {
		t.Fatalf("cleaning the node before the run: %v", err)
	}
	// What the run ran, for reimport (E2E_NODE_REIMPORT) should saving it fail.
	if data, err := json.Marshal(sel); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(filepath.Join(dir, "selection.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cleanNode(context.Background(), dir); err != nil {
			t.Errorf("cleaning the node after the run: %v", err)
		}
	})
	endpoint := "unix://" + env.Address
	if s.PlegNRI {
		p, err := plegnri.Start(ctx, plegnri.Options{Binary: plegNRIBinary, Env: env,
			Dir: testutil.ShortTempDir(t, "plegnri-"), Extra: append([]string{"--log-level", "info"}, s.Flags...)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = os.WriteFile(filepath.Join(dir, "pleg-nri.log"), []byte(p.Log()), 0o644)
			_ = os.WriteFile(filepath.Join(dir, "pleg-nri-front.log"), []byte(p.FrontLog()), 0o644)
			if err := p.Close(); err != nil {
				t.Error(err)
			}
		})
		endpoint = "unix://" + p.Socket
	}
	args, cmdEnv, err := suiteCommand(s, sel, procs, timeout, dir, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "ginkgo.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir, cmd.Env = dir, cmdEnv
	cmd.Stdout = io.MultiWriter(logFile, os.Stderr)
	cmd.Stderr = cmd.Stdout
	// Its own process group: on a timeout the suite, its kubelet and its servers go together.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	t.Logf("setup %s: %s", s.Name, strings.Join(args, " "))
	start := time.Now()
	runErr := cmd.Run()
	wall := time.Since(start)
	tests, err := readJUnit(junitPath(dir))
	if err != nil {
		t.Fatalf("setup %s: the suite left no results (%v; ginkgo: %v); see %s", s.Name, err, runErr, logFile.Name())
	}
	r := suiteRun{Setup: s.Name, Selection: sel, Procs: procs, Started: start.UTC().Format(time.RFC3339),
		WallSeconds: wall.Seconds(), Tests: tests, Commit: treeCommit}
	// The kubelet's log, where the suite's report directory (--report-dir) has it.
	if l, err := cadvisorlag.ReadFile(filepath.Join(dir, "report", "kubelet.log")); err == nil {
		r.CAdvisor = &l
	} else {
		t.Logf("setup %s: the kubelet's cAdvisor lag not recorded: %v", s.Name, err)
	}
	c := r.counts()
	t.Logf("setup %s: %d passed, %d failed, %d skipped in %s (ginkgo: %v)", s.Name, c.Passed, c.Failed, c.Skipped,
		wall.Round(time.Second), runErr)
	return r
}

// suiteCommand is the ginkgo command line that runs e2e_node.test for a setup, and its environment.
func suiteCommand(s setup, sel selection, procs int, timeout time.Duration, dir, endpoint string) ([]string, []string, error) {
	kubeletConfig := filepath.Join(dir, "kubelet-config.yaml")
	if err := os.WriteFile(kubeletConfig, []byte(kubeletConfigYAML), 0o644); err != nil {
		return nil, nil, err
	}
	path, err := pathWithoutSystemd(filepath.Join(dir, "path"))
	if err != nil {
		return nil, nil, err
	}
	hostname, err := os.Hostname()
	if err != nil {
		return nil, nil, err
	}
	// The suite finds the kubelet beside its own binary (its --k8s-bin-dir is on a flag set it never
	// parses): both are linked into the run's directory.
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return nil, nil, err
	}
	for name, target := range map[string]string{"e2e_node.test": filepath.Join(suiteDir, "e2e_node.test"), "kubelet": kubeletBinary} {
		if err := os.Symlink(target, filepath.Join(bin, name)); err != nil && !os.IsExist(err) {
			return nil, nil, err
		}
	}
	args := []string{filepath.Join(suiteDir, "ginkgo"),
		"--procs=" + strconv.Itoa(procs), "--timeout=" + timeout.String(), "--no-color",
		"--output-dir=" + dir, "--junit-report=junit.xml", "--poll-progress-after=5m"}
	if focus := sel.ginkgoFocus(); focus != "" {
		args = append(args, "--focus="+focus)
	}
	if sel.Skip != "" {
		args = append(args, "--skip="+sel.Skip)
	}
	args = append(args, filepath.Join(bin, "e2e_node.test"), "--",
		"--container-runtime-endpoint="+endpoint,
		"--container-runtime-process-name="+filepath.Join(env.BinDir, "containerd"),
		"--report-dir="+filepath.Join(dir, "report"),
		"--node-name="+hostname,
		// Every image is built here and imported (package e2eimages); nothing can be pulled.
		"--prepull-images=false",
		"--kubelet-config-file="+kubeletConfig,
		// Without systemd the suite runs the kubelet with --runtime-cgroups=/docker-daemon and a system
		// cgroup that would take every process of this machine: neither exists on this node.
		"--kubelet-flags=--runtime-cgroups= --system-cgroups=",
	)
	if s.Evented {
		args = append(args, "--feature-gates=EventedPLEG=true")
	}
	cmdEnv := []string{"PATH=" + path, "HOME=" + dir, "KUBECONFIG="}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "TMPDIR=") || strings.HasPrefix(kv, "LANG=") {
			cmdEnv = append(cmdEnv, kv)
		}
	}
	return args, cmdEnv, nil
}

// junitPath is the JUnit report ginkgo wrote into dir (junit.Path).
func junitPath(dir string) string { return junit.Path(dir) }

// kubeletConfigYAML is the suite's own default kubelet configuration
// (test/e2e_node/jenkins/default-kubelet-config.yaml) for this node: cgroupfs, as the harness's
// containerd; and cgroup v1 allowed, which this machine has (kubelets 1.35+ refuse it by default).
const kubeletConfigYAML = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /
failCgroupV1: false
podCIDR: "10.100.0.0/24"
volumeStatsAggPeriod: 10s
fileCheckFrequency: 10s
evictionPressureTransitionPeriod: 30s
evictionHard:
  memory.available: 250Mi
  nodefs.available: 10%
  nodefs.inodesFree: 5%
evictionMinimumReclaim:
  nodefs.available: 5%
  nodefs.inodesFree: 5%
serializeImagePulls: false
`

// pathWithoutSystemd makes a PATH for the suite that has every program of this machine but
// systemd-run: the suite starts its kubelet as a transient systemd unit whenever systemd-run is on the
// PATH, and this machine has the program but not systemd. dir gets a link to each program of /usr/bin.
func pathWithoutSystemd(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	entries, err := os.ReadDir("/usr/bin")
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if e.Name() == "systemd-run" {
			continue
		}
		if err := os.Symlink(filepath.Join("/usr/bin", e.Name()), filepath.Join(dir, e.Name())); err != nil && !os.IsExist(err) {
			return "", err
		}
	}
	return strings.Join([]string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/sbin", dir}, ":"), nil
}

// cleanNode leaves the node as the suite expects to find it: no process of a run of this version (the
// suite, its services, its kubelet: their command lines name the run's directory,
// <results>/<version>/<selection>/<setup>), no pod in containerd, nothing mounted or left under the
// kubelet's root, none of its cgroups.
func cleanNode(ctx context.Context, dir string) error {
	runs := filepath.Dir(filepath.Dir(dir)) + "/" // <results>/<version>/
	harness.KillAll(func() []int {
		return harness.ProcessesWhere(func(pid int) bool { return harness.CommandLineHas(pid, runs) })
	})
	if err := env.RemoveAllPods(ctx); err != nil {
		return err
	}
	harness.UnmountAll(kubeletRoot)
	if m := harness.MountsUnder(kubeletRoot); len(m) > 0 {
		return fmt.Errorf("still mounted under %s: %v", kubeletRoot, m)
	}
	if err := os.RemoveAll(kubeletRoot); err != nil {
		return err
	}
	for _, cg := range []string{"/kubepods", "/kubelet"} {
		harness.RemoveCgroups(cg)
		if left := harness.CgroupDirs(cg); len(left) > 0 {
			return fmt.Errorf("cgroups left: %v", left)
		}
	}
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// treeCommit is the tree's commit when the run started (pleg-nri is built from it then), for the report.
var treeCommit = commit()

// commit is this tree's commit (with -dirty).
func commit() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

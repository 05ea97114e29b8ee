// Package kubelet runs an unmodified kubelet in standalone mode (no API server: static pods from a
// manifest directory) against a test containerd, directly or through pleg-nri, and undoes everything
// it does to the host: its process, its mounts, its cgroups, the sysctls it sets, the files it writes
// outside its own directory. Teardown checks that nothing is left and fails naming what is.
//
// Every kubelet gets its own directory /tmp/plegkube-<id> (root dir, manifests, pod logs, certificates,
// config, log) and a record of the host state it changed (state.json), so a later run can undo what a
// killed test left behind (CleanStale). Only one kubelet runs on the machine at a time (Lock): some of
// what it touches is global (sysctls, /var/lib/kubelet/device-plugins, /var/log/containers).
package kubelet

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/plegnri"
)

// dirPrefix names every kubelet's directory, /tmp/plegkube-<id>.
const dirPrefix = "plegkube-"

// NodeName is the kubelet's node name (--hostname-override); static pods are named <name>-<NodeName>.
const NodeName = "plegkube"

// Options configure a Kubelet.
type Options struct {
	// Binary is the kubelet binary.
	Binary string
	// RuntimeEndpoint is the kubelet's containerRuntimeEndpoint (unix://...): containerd's socket or
	// pleg-nri's.
	RuntimeEndpoint string
	// ImageServiceEndpoint is the kubelet's imageServiceEndpoint (unix://...); empty: unset, and the
	// kubelet sends its image calls to RuntimeEndpoint.
	ImageServiceEndpoint string
	// ContainerdAddress is containerd's own socket, used to remove the kubelet's pods after it stopped.
	ContainerdAddress string
	// EventedPLEG turns the EventedPLEG feature gate on.
	EventedPLEG bool
	// CgroupParent is an existing cgroup under which the kubelet's cgroupRoot is made (the test
	// environment's, so the environment's teardown removes whatever is left).
	CgroupParent string
	// FeatureGates are more feature gates (name: enabled), for experiments.
	FeatureGates map[string]bool
	// MaxPods is the kubelet's maxPods, the most pods it admits (0: the kubelet's default, 110).
	MaxPods int
	// Verbosity is the kubelet's --v (default 4: PLEG events and the sync loop's PLEG lines are logged).
	Verbosity int
	// Log receives progress lines (default io.Discard).
	Log io.Writer
}

// Kubelet is one standalone kubelet and the host state it owns. The exported fields are saved in
// Dir/state.json.
type Kubelet struct {
	// ID names the directory and the cgroup root.
	ID string
	// Dir holds everything of this kubelet; RootDir, ManifestDir, PodLogsDir, CertDir, ConfigPath and
	// LogPath are its --root-dir, staticPodPath, podLogsDir, --cert-dir, --config and its output.
	Dir, RootDir, ManifestDir, PodLogsDir, CertDir, ConfigPath, LogPath string
	// CgroupRoot is the kubelet's cgroupRoot (kubepods is made under it); created by New.
	CgroupRoot string
	// ContainerdAddress is containerd's own socket (Options.ContainerdAddress).
	ContainerdAddress string
	// ReadOnlyPort serves /pods and /metrics without authentication on 127.0.0.1; Port and HealthzPort
	// are its authenticated server and /healthz.
	ReadOnlyPort, Port, HealthzPort int
	// Host is the host state the kubelet may change, as it was before it started.
	Host HostState
	// Owner is the pid of the process that made the kubelet: when it is dead, CleanStale undoes it.
	Owner int
	// PID is the kubelet's pid while it runs.
	PID int

	opts Options
	// proc is the kubelet this process started, while it runs.
	proc *harness.Process
}

// New prepares a kubelet: its directory, its cgroup root, its config; it records the host state
// the kubelet may change. It does not start it. The caller must hold Lock.
func New(opts Options) (*Kubelet, error) {
	if opts.Verbosity == 0 {
		opts.Verbosity = 4
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if _, err := os.Stat(opts.Binary); err != nil {
		return nil, fmt.Errorf("kubelet binary: %w", err)
	}
	id := randomHex(3)
	dir := filepath.Join(os.TempDir(), dirPrefix+id)
	if err := os.Mkdir(dir, 0o750); err != nil {
		return nil, err
	}
	k := &Kubelet{
		ID:          id,
		Dir:         dir,
		RootDir:     filepath.Join(dir, "root"),
		ManifestDir: filepath.Join(dir, "manifests"),
		PodLogsDir:  filepath.Join(dir, "pods"),
		CertDir:     filepath.Join(dir, "pki"),
		ConfigPath:  filepath.Join(dir, "config.yaml"),
		LogPath:     filepath.Join(dir, "kubelet.log"),
		CgroupRoot:  opts.CgroupParent + "/" + dirPrefix + id,
		Owner:       os.Getpid(),
		opts:        opts,

		ContainerdAddress: opts.ContainerdAddress,
	}
	fail := func(err error) (*Kubelet, error) {
		_ = k.Teardown(context.Background())
		return nil, err
	}
	for _, d := range []string{k.RootDir, k.ManifestDir, k.PodLogsDir, k.CertDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return fail(err)
		}
	}
	var err error
	if k.Host, err = RecordHostState(); err != nil {
		return fail(err)
	}
	if err := k.save(); err != nil {
		return fail(err)
	}
	if err := makeCgroup(k.CgroupRoot); err != nil {
		return fail(fmt.Errorf("cgroup root %s: %w", k.CgroupRoot, err))
	}
	ports, err := freePorts(3)
	if err != nil {
		return fail(err)
	}
	k.ReadOnlyPort, k.Port, k.HealthzPort = ports[0], ports[1], ports[2]
	if err := k.writeConfig(); err != nil {
		return fail(err)
	}
	if err := k.save(); err != nil {
		return fail(err)
	}
	return k, nil
}

// kubeletConfig is the KubeletConfiguration of a standalone kubelet on a test machine: static pods
// only, no node registration, cgroupfs under its own cgroup root, its servers on loopback only, a
// crash-loop back-off of at most 1 s (so tests of repeated restarts take seconds), and eviction
// thresholds low enough that a busy shared machine does not evict test pods.
var kubeletConfig = template.Must(template.New("kubelet").Parse(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: {{.ManifestDir}}
fileCheckFrequency: 1s
podLogsDir: {{.PodLogsDir}}
containerRuntimeEndpoint: {{.RuntimeEndpoint}}
{{- if .ImageServiceEndpoint}}
imageServiceEndpoint: {{.ImageServiceEndpoint}}
{{- end}}
registerNode: false
address: 127.0.0.1
port: {{.Port}}
readOnlyPort: {{.ReadOnlyPort}}
healthzBindAddress: 127.0.0.1
healthzPort: {{.HealthzPort}}
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupRoot: {{.CgroupRoot}}
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: false
makeIPTablesUtilChains: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
crashLoopBackOff:
  maxContainerRestartPeriod: 1s
{{- if .MaxPods}}
maxPods: {{.MaxPods}}
{{- end}}
featureGates:
  EventedPLEG: {{.EventedPLEG}}
  KubeletCrashLoopBackOffMax: true
{{- range $name, $on := .FeatureGates}}
  {{$name}}: {{$on}}
{{- end}}
`))

func (k *Kubelet) writeConfig() error {
	var b strings.Builder
	if err := kubeletConfig.Execute(&b, map[string]any{
		"ManifestDir":          k.ManifestDir,
		"PodLogsDir":           k.PodLogsDir,
		"RuntimeEndpoint":      k.opts.RuntimeEndpoint,
		"ImageServiceEndpoint": k.opts.ImageServiceEndpoint,
		"Port":                 k.Port,
		"ReadOnlyPort":         k.ReadOnlyPort,
		"HealthzPort":          k.HealthzPort,
		"CgroupRoot":           k.CgroupRoot,
		"EventedPLEG":          k.opts.EventedPLEG,
		"FeatureGates":         k.opts.FeatureGates,
		"MaxPods":              k.opts.MaxPods,
	}); err != nil {
		return err
	}
	return os.WriteFile(k.ConfigPath, []byte(b.String()), 0o640)
}

func (k *Kubelet) save() error {
	data, err := json.MarshalIndent(k, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(k.Dir, "state.json.tmp")
	if err := os.WriteFile(tmp, data, 0o640); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(k.Dir, "state.json"))
}

func (k *Kubelet) logf(format string, args ...any) {
	fmt.Fprintf(k.opts.Log, "kubelet: "+format+"\n", args...)
}

// Start starts the kubelet and waits until its /healthz and its read-only /pods answer.
func (k *Kubelet) Start(ctx context.Context) error {
	if k.proc != nil {
		return errors.New("the kubelet is already running")
	}
	logf, err := os.OpenFile(k.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(k.opts.Binary,
		"--config="+k.ConfigPath,
		"--root-dir="+k.RootDir,
		"--cert-dir="+k.CertDir,
		"--hostname-override="+NodeName,
		"--v="+strconv.Itoa(k.opts.Verbosity))
	cmd.Stdout, cmd.Stderr = logf, logf
	proc, err := harness.StartProcess(cmd)
	if err != nil {
		return fmt.Errorf("failed to start the kubelet: %w", err)
	}
	k.proc, k.PID = proc, proc.PID()
	if err := k.save(); err != nil {
		return err
	}
	err = harness.WaitFor(ctx, 60*time.Second, "the kubelet's /healthz and /pods", func() (bool, error) {
		if !proc.Running() {
			return false, testutil.Stop(errors.New("the kubelet exited"))
		}
		for _, url := range []string{
			fmt.Sprintf("http://127.0.0.1:%d/healthz", k.HealthzPort),
			fmt.Sprintf("http://127.0.0.1:%d/pods", k.ReadOnlyPort),
		} {
			if err := httpOK(url); err != nil {
				return false, err
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w\n%s", err, k.LogTail(60))
	}
	k.logf("kubelet %d ready (%s, EventedPLEG=%t, runtime %s)", k.PID, k.Dir, k.opts.EventedPLEG, k.opts.RuntimeEndpoint)
	return nil
}

func httpOK(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// Stop stops the kubelet with SIGTERM (SIGKILL after 10 s) and waits for it. Its pods keep running,
// as they do when a kubelet restarts on a node.
func (k *Kubelet) Stop() {
	if k.proc == nil {
		if k.PID != 0 && testutil.Alive(k.PID) && k.ownsPID(k.PID) {
			_ = syscall.Kill(k.PID, syscall.SIGKILL)
			_ = testutil.WaitGone(context.Background(), k.PID, 10*time.Second)
		}
		k.PID = 0
		return
	}
	k.proc.Stop(syscall.SIGTERM, 10*time.Second)
	k.proc, k.PID = nil, 0
	_ = k.save()
}

// Running says whether the kubelet runs.
func (k *Kubelet) Running() bool { return k.proc.Running() }

// ownsPID says whether pid is this kubelet (its command line names the kubelet's directory).
func (k *Kubelet) ownsPID(pid int) bool { return harness.CommandLineHas(pid, k.Dir) }

// WritePod writes a static pod manifest; the kubelet picks it up within a second.
func (k *Kubelet) WritePod(p Pod) error {
	data, err := json.MarshalIndent(p.manifest(), "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(k.ManifestDir, "."+p.Name+".json.tmp")
	if err := os.WriteFile(tmp, data, 0o640); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(k.ManifestDir, p.Name+".json"))
}

// RemovePod removes a static pod's manifest; the kubelet then stops and removes the pod.
func (k *Kubelet) RemovePod(name string) error {
	return os.Remove(filepath.Join(k.ManifestDir, name+".json"))
}

// Pods returns the kubelet's pods and their statuses as its read-only /pods reports them.
func (k *Kubelet) Pods() ([]PodStatus, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/pods", k.ReadOnlyPort))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/pods: %s", resp.Status)
	}
	var list struct {
		Items []PodStatus `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("/pods: %w", err)
	}
	return list.Items, nil
}

// Pod returns the status of the static pod made from the manifest named name (nil when the kubelet
// does not have it).
func (k *Kubelet) Pod(name string) (*PodStatus, error) {
	pods, err := k.Pods()
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if pods[i].Metadata.Name == name+"-"+NodeName {
			return &pods[i], nil
		}
	}
	return nil, nil
}

// Metric returns the sum of the samples of a kubelet metric (from its read-only /metrics) whose line
// contains every filter.
func (k *Kubelet) Metric(name string, filters ...string) (float64, error) {
	return plegnri.ScrapeMetric(fmt.Sprintf("http://127.0.0.1:%d/metrics", k.ReadOnlyPort), name, filters...)
}

// LogTail returns the last n lines of the kubelet's log.
func (k *Kubelet) LogTail(n int) string { return harness.LogTail(k.LogPath, "kubelet", n) }

// CountLog counts the lines of the kubelet's log that contain s.
func (k *Kubelet) CountLog(s string) int {
	f, err := os.Open(k.LogPath)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			n++
		}
	}
	return n
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

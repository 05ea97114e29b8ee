// Package harness runs an isolated, real containerd for pleg-nri's integration tests: pinned binaries
// built by hack/install-deps.sh, offline test images, every path under one temporary directory, CRI and
// NRI enabled, cgroupfs, and a teardown that removes everything it made and fails loudly when something
// is left behind.
package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/atomicfile"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// DefaultCache is where install-deps.sh keeps the binaries it builds, one directory per version.
const DefaultCache = "/var/cache/pleg-nri"

// dirPrefix names every environment's directory, /tmp/plegit-<id>. It is kept short because containerd
// refuses a shim socket directory longer than 42 bytes.
const dirPrefix = "plegit-"

// Options configure an Env.
type Options struct {
	// Cache is the dependency cache (default $PLEG_NRI_CACHE or DefaultCache).
	Cache string
	// LogLevel is containerd's log level (default "info").
	LogLevel string
	// Persistent marks an environment made by hand (make it-up): no later run cleans it up as stale.
	Persistent bool
	// Log receives the harness's progress lines (default io.Discard).
	Log io.Writer
	// Containerd says where containerd runs: Native (default) or Docker (see ContainerdFromEnv).
	Containerd string
	// Profile opens containerd's debug socket (pprof, DebugAddress) and its metrics endpoint with the
	// gRPC server's per-method counts and handling times (MetricsAddress); native containerd only.
	Profile bool
	// HostReachable gives the pods' bridge the subnet's gateway address, so the host reaches the pods
	// (the kubelet's HTTP probes, a test talking to a pod) and the pods reach the host. Off, nothing is
	// routed between them.
	HostReachable bool
}

// Env is one isolated containerd and everything it owns. The exported fields are saved in Dir/env.json,
// so `it-env down` (or a later test run, for an environment whose owner died) can tear it down.
type Env struct {
	// ID is the environment's random id; it names the directory, the CNI network, the bridge and the
	// cgroup parent.
	ID string
	// Dir holds every path the environment uses.
	Dir string
	// Cache and BinDir are the dependency cache and its directory of links to the pinned binaries.
	Cache, BinDir string
	// Address is containerd's gRPC socket (CRI included).
	Address string
	// NRISocket, NRIPluginDir and NRIConfDir are containerd's NRI socket and pre-registered plugin
	// directories.
	NRISocket, NRIPluginDir, NRIConfDir string
	// ShimSocketDir is where the shims put their sockets.
	ShimSocketDir string
	// ConfigPath and LogPath are containerd's config file and log.
	ConfigPath, LogPath string
	// CNIConfDir, NetName, Bridge and Subnet describe the pods' CNI network.
	CNIConfDir, NetName, Bridge, Subnet string
	// CgroupParent is the cgroup every test pod must use as its cgroup_parent, so teardown can find and
	// remove every cgroup of the environment.
	CgroupParent string
	// Snapshotter is overlayfs where an overlay mount works here, native otherwise.
	Snapshotter string
	// Owner is the pid of the process that made the environment (0 when Persistent): when it is dead,
	// the next harness run tears the environment down.
	Owner int
	// PID is containerd's pid while it runs (on this machine, also when it runs in a container).
	PID int
	// DebugAddress (a unix socket serving /debug/pprof) and MetricsAddress (host:port serving
	// /v1/metrics) are set when Options.Profile is.
	DebugAddress, MetricsAddress string
	// Container is the Docker container containerd runs in, and Image its image; both empty when
	// containerd runs natively.
	Container, Image string
	// Forward says the environment added forwardRule to iptables (Options.HostReachable).
	Forward bool

	opts Options
	// proc is the containerd this process started (nil when it does not run, or runs in Docker).
	proc *Process
}

// New prepares an environment: it installs the dependencies, builds the images, tears down stale
// environments of dead owners, and writes the configs. It does not start containerd.
func New(ctx context.Context, opts Options) (*Env, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the containerd integration environment needs root")
	}
	if runtime.GOOS != "linux" {
		return nil, errors.New("the containerd integration environment needs Linux")
	}
	if opts.Cache == "" {
		opts.Cache = os.Getenv("PLEG_NRI_CACHE")
	}
	if opts.Cache == "" {
		opts.Cache = DefaultCache
	}
	if opts.LogLevel == "" {
		opts.LogLevel = "info"
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if err := InstallDeps(ctx, opts.Cache, opts.Log); err != nil {
		return nil, err
	}
	var image string
	switch opts.Containerd {
	case "", Native:
	case Docker:
		var err error
		if image, err = buildContainerdImage(ctx, opts.Cache, opts.Log); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown Options.Containerd %q (want %q or %q)", opts.Containerd, Native, Docker)
	}
	CleanStale(ctx, opts.Log)

	var raw [3]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, err
	}
	id := hex.EncodeToString(raw[:])
	dir, err := os.MkdirTemp("", dirPrefix+id+"-")
	if err != nil {
		return nil, err
	}
	// MkdirTemp appends digits; use exactly /tmp/plegit-<id> for short socket paths.
	_ = os.Remove(dir)
	dir = filepath.Join(os.TempDir(), dirPrefix+id)
	if err := os.Mkdir(dir, 0o711); err != nil {
		return nil, err
	}
	e := &Env{
		ID:            id,
		Dir:           dir,
		Cache:         opts.Cache,
		BinDir:        filepath.Join(opts.Cache, "bin"),
		Address:       filepath.Join(dir, "containerd.sock"),
		NRISocket:     filepath.Join(dir, "nri", "nri.sock"),
		NRIPluginDir:  filepath.Join(dir, "nri", "plugins"),
		NRIConfDir:    filepath.Join(dir, "nri", "conf.d"),
		ShimSocketDir: filepath.Join(dir, "s"),
		ConfigPath:    filepath.Join(dir, "config.toml"),
		LogPath:       filepath.Join(dir, "containerd.log"),
		CNIConfDir:    filepath.Join(dir, "cni", "net.d"),
		NetName:       dirPrefix + id,
		Bridge:        "plegit" + id,
		Subnet:        fmt.Sprintf("10.250.%d.0/24", int(raw[0])),
		CgroupParent:  "/" + dirPrefix + id,
		Image:         image,
		opts:          opts,
	}
	if image != "" {
		e.Container = dirPrefix + id
	}
	if opts.Profile {
		if image != "" {
			return nil, errors.New("Options.Profile is for native containerd only")
		}
		addr, err := testutil.FreeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		e.DebugAddress, e.MetricsAddress = filepath.Join(dir, "debug.sock"), addr
	}
	if !opts.Persistent {
		e.Owner = os.Getpid()
	}
	for _, d := range []string{"root", "state", "tmp", "opt", "runc", "cdi", "s", "nri/plugins", "nri/conf.d",
		"cni/net.d", "pods"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o711); err != nil {
			return nil, err
		}
	}
	e.Snapshotter = pickSnapshotter(dir)
	if err := e.writeConfigs(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := e.writeCrictlConfigs(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if opts.HostReachable {
		if err := e.addForwardRule(); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := e.save(); err != nil {
		e.removeForwardRule()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if e.Container != "" {
		e.logf("environment %s in %s (snapshotter %s), containerd in container %s", e.ID, e.Dir, e.Snapshotter, e.Container)
	} else {
		e.logf("environment %s in %s (snapshotter %s)", e.ID, e.Dir, e.Snapshotter)
	}
	return e, nil
}

// Load reads the environment saved in dir (by New) so it can be torn down by another process.
func Load(dir string) (*Env, error) {
	data, err := os.ReadFile(filepath.Join(dir, "env.json"))
	if err != nil {
		return nil, err
	}
	e := &Env{}
	if err := json.Unmarshal(data, e); err != nil {
		return nil, fmt.Errorf("failed to parse %s/env.json: %w", dir, err)
	}
	e.opts.Log = io.Discard
	e.opts.LogLevel = "info"
	return e, nil
}

// SetLog sets where the harness writes its progress lines.
func (e *Env) SetLog(w io.Writer) { e.opts.Log = w }

func (e *Env) save() error {
	data, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(e.Dir, "env.json"), data, 0o644)
}

func (e *Env) logf(format string, args ...any) {
	fmt.Fprintf(e.opts.Log, "harness: "+format+"\n", args...)
}

// InstallDeps runs hack/install-deps.sh, which installs the Debian packages and builds the pinned
// binaries into cache (nothing when they are already there).
func InstallDeps(ctx context.Context, cache string, log io.Writer) error {
	_, self, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(self), "..", "hack", "install-deps.sh")
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Env = append(os.Environ(), "PLEG_NRI_CACHE="+cache)
	var stderr bytes.Buffer
	cmd.Stdout = io.Discard
	cmd.Stderr = io.MultiWriter(&stderr, log)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("installing the integration test dependencies failed: %w\n%s", err, stderr.String())
	}
	return nil
}

// Start starts containerd (again, after Stop) and waits until its CRI reports the runtime and the
// network ready and the test images are present; on the first start it imports them.
func (e *Env) Start(ctx context.Context) error {
	if e.proc != nil || (e.Container != "" && e.PID != 0 && testutil.Alive(e.PID)) {
		return errors.New("containerd is already running")
	}
	start := e.startNative
	if e.Container != "" {
		start = e.startDocker
	}
	if err := start(ctx); err != nil {
		return err
	}
	if err := e.save(); err != nil {
		return err
	}
	if err := e.waitReady(ctx); err != nil {
		return fmt.Errorf("containerd did not become ready: %w\n%s", err, e.LogTail(40))
	}
	if err := e.ensureImages(ctx); err != nil {
		return fmt.Errorf("failed to import the test images: %w\n%s", err, e.LogTail(40))
	}
	return nil
}

// startNative starts containerd as a child of this process.
func (e *Env) startNative(ctx context.Context) error {
	logf, err := os.OpenFile(e.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "==== harness: starting containerd at %s ====\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(filepath.Join(e.BinDir, "containerd"), "--config", e.ConfigPath)
	cmd.Env = append(os.Environ(), "PATH="+e.BinDir+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = logf, logf
	proc, err := StartProcess(cmd)
	if err != nil {
		return fmt.Errorf("failed to start containerd: %w", err)
	}
	e.proc, e.PID = proc, proc.PID()
	return nil
}

// startDocker starts containerd in its container.
func (e *Env) startDocker(ctx context.Context) error {
	if err := appendLog(e.LogPath, fmt.Sprintf("==== harness: starting containerd in %s at %s ====\n",
		e.Container, time.Now().Format(time.RFC3339Nano))); err != nil {
		return err
	}
	if err := e.startInContainer(ctx); err != nil {
		return fmt.Errorf("%w\n%s", err, e.LogTail(40))
	}
	return nil
}

func appendLog(path, line string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(line)
	return err
}

// waitReady waits until the CRI answers Status with RuntimeReady and NetworkReady and the NRI socket is
// there, every 50 ms for 30 s; it gives up at once when containerd exits.
func (e *Env) waitReady(ctx context.Context) error {
	return testutil.PollEvery(ctx, 30*time.Second, 50*time.Millisecond, "containerd's CRI and NRI", func() (bool, error) {
		if (e.proc != nil && !e.proc.Running()) || (e.Container != "" && !testutil.Alive(e.PID)) {
			return false, testutil.Stop(errors.New("containerd exited"))
		}
		if err := e.criReady(ctx); err != nil {
			return false, err
		}
		if _, err := os.Stat(e.NRISocket); err != nil {
			return false, fmt.Errorf("NRI socket not there: %w", err)
		}
		return true, nil
	})
}

// criReady asks the CRI for its Status: an error unless it answers with RuntimeReady and NetworkReady.
func (e *Env) criReady(ctx context.Context) error {
	conn, err := e.Dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
	defer ccancel()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).Status(cctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return err
	}
	for _, c := range resp.GetStatus().GetConditions() {
		// Other conditions (containerd's cgroup v1 deprecation warning, say) do not stop pods.
		if (c.Type == runtimeapi.RuntimeReady || c.Type == runtimeapi.NetworkReady) && !c.Status {
			return fmt.Errorf("condition %s is false: %s %s", c.Type, c.Reason, c.Message)
		}
	}
	return nil
}

// ensureImages imports the test images unless the CRI already lists them.
func (e *Env) ensureImages(ctx context.Context) error {
	conn, err := e.Dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	images := runtimeapi.NewImageServiceClient(conn)
	present := func() bool {
		for _, name := range []string{PauseImage, BusyboxImage} {
			resp, err := images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: name}})
			if err != nil || resp.GetImage() == nil {
				return false
			}
		}
		return true
	}
	if present() {
		return nil
	}
	if err := e.importImages(ctx); err != nil {
		return err
	}
	return WaitFor(ctx, 10*time.Second, "the imported images in the CRI image store", func() (bool, error) {
		return present(), nil
	})
}

// importImages imports the test images into containerd's k8s.io namespace.
func (e *Env) importImages(ctx context.Context) error {
	if e.Container != "" {
		return e.importInContainer(ctx)
	}
	archives, err := BuildImages(ctx, e.Cache)
	if err != nil {
		return err
	}
	return e.Import(ctx, archives...)
}

// Import imports OCI archives (WriteImages') into containerd's k8s.io namespace, where the CRI finds
// them, under the names their indexes carry. Native containerd only.
func (e *Env) Import(ctx context.Context, archives ...string) error {
	if e.Container != "" {
		return errors.New("Env.Import: containerd runs in Docker")
	}
	for _, a := range archives {
		out, err := exec.CommandContext(ctx, filepath.Join(e.BinDir, "ctr"), "--address", e.Address,
			"--namespace", "k8s.io", "images", "import", "--local", a).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images import %s: %w: %s", a, err, out)
		}
	}
	return nil
}

// Dial connects a gRPC client to containerd's socket.
func (e *Env) Dial(ctx context.Context) (*grpc.ClientConn, error) {
	return DialUnix(e.Address)
}

// DialUnix connects a gRPC client to a unix socket path.
func DialUnix(path string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
}

// Stop stops containerd with SIGTERM (SIGKILL after 15 s) and waits for it. Shims and containers keep
// running, as they do when containerd restarts on a node.
func (e *Env) Stop(ctx context.Context) error {
	return e.signal(ctx, syscall.SIGTERM, 15*time.Second)
}

// Kill kills containerd with SIGKILL and waits for it.
func (e *Env) Kill(ctx context.Context) error {
	return e.signal(ctx, syscall.SIGKILL, 15*time.Second)
}

// Restart stops and starts containerd.
func (e *Env) Restart(ctx context.Context) error {
	if err := e.Stop(ctx); err != nil {
		return err
	}
	return e.Start(ctx)
}

func (e *Env) signal(ctx context.Context, sig syscall.Signal, grace time.Duration) error {
	if e.proc == nil {
		// Not our child (loaded from env.json, or in Docker): signal the recorded pid.
		if e.PID == 0 || !testutil.Alive(e.PID) {
			e.PID = 0
			return nil
		}
		_ = syscall.Kill(e.PID, sig)
		if testutil.WaitGone(ctx, e.PID, grace) != nil {
			_ = syscall.Kill(e.PID, syscall.SIGKILL)
			if err := testutil.WaitGone(ctx, e.PID, 5*time.Second); err != nil {
				return fmt.Errorf("containerd (pid %d) did not exit: %w", e.PID, err)
			}
		}
		e.PID = 0
		return e.save()
	}
	e.proc.Stop(sig, grace)
	e.proc, e.PID = nil, 0
	return e.save()
}

// Running says whether the containerd of this environment runs.
func (e *Env) Running() bool {
	if e.proc != nil {
		return e.proc.Running()
	}
	return e.PID != 0 && testutil.Alive(e.PID)
}

// LogTail returns the last n lines of containerd's log.
func (e *Env) LogTail(n int) string { return LogTail(e.LogPath, "containerd", n) }

// LogTail returns the last n lines of the log file at path, of the daemon named what, framed for a
// failure report.
func LogTail(path, what string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no %s log: %v)", what, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "---- " + what + " log (last lines) ----\n" + strings.Join(lines, "\n") + "\n---- end of " + what + " log ----"
}

// LogSize returns the current size of containerd's log, for LogSince.
func (e *Env) LogSize() int64 {
	fi, err := os.Stat(e.LogPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// LogSince returns containerd's log from offset on.
func (e *Env) LogSince(offset int64) string {
	f, err := os.Open(e.LogPath)
	if err != nil {
		return fmt.Sprintf("(no containerd log: %v)", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return err.Error()
	}
	data, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return string(data)
}

// Exports renders the environment as shell exports, for make it-up.
func (e *Env) Exports() string {
	var b strings.Builder
	for _, kv := range [][2]string{
		{"PLEGIT_DIR", e.Dir},
		{"CONTAINERD_ADDRESS", e.Address},
		{"CONTAINER_RUNTIME_ENDPOINT", "unix://" + e.Address},
		{"IMAGE_SERVICE_ENDPOINT", "unix://" + e.Address},
		{"NRI_SOCKET", e.NRISocket},
		{"PLEGIT_CGROUP_PARENT", e.CgroupParent},
		{"PLEGIT_CRICTL_CONFIGS", filepath.Join(e.Dir, "crictl")},
		{"CRI_CONFIG_FILE", filepath.Join(e.Dir, "crictl", "crictl.yaml")},
		{"PATH", e.BinDir + ":$PATH"},
	} {
		fmt.Fprintf(&b, "export %s=%q\n", kv[0], kv[1])
	}
	return strings.ReplaceAll(b.String(), `"`+e.BinDir+`:$PATH"`, `"`+e.BinDir+`:${PATH}"`)
}

// pickSnapshotter returns overlayfs when an overlay mount works under dir, native otherwise.
func pickSnapshotter(dir string) string {
	base := filepath.Join(dir, "tmp", "overlay-check")
	defer os.RemoveAll(base)
	var paths [4]string
	for i, n := range []string{"lower", "upper", "work", "merged"} {
		paths[i] = filepath.Join(base, n)
		if err := os.MkdirAll(paths[i], 0o700); err != nil {
			return "native"
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", paths[0], paths[1], paths[2])
	if err := syscall.Mount("overlay", paths[3], "overlay", 0, opts); err != nil {
		return "native"
	}
	_ = syscall.Unmount(paths[3], 0)
	return "overlayfs"
}

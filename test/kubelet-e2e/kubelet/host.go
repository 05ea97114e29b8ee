package kubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// Sysctls are the kernel settings a kubelet with protectKernelDefaults=false sets at start
// (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables).
var Sysctls = []string{
	"vm.overcommit_memory",
	"vm.panic_on_oom",
	"kernel.panic",
	"kernel.panic_on_oops",
	"kernel.keys.root_maxkeys",
	"kernel.keys.root_maxbytes",
}

// globalPaths are the paths outside its --root-dir that a kubelet creates: the device plugin manager's
// socket directory is hard-coded (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1.DevicePluginPath), and
// so is the directory of the containers' log symlinks (pkg/kubelet/kuberuntime/legacy.go).
var globalPaths = []string{"/var/lib/kubelet", "/var/lib/kubelet/device-plugins", containerLogsDir}

// containerLogsDir holds a symlink per container, to its log under the pods log dir.
const containerLogsDir = "/var/log/containers"

// HostState is the host state a kubelet may change, as it was before it started.
type HostState struct {
	// Sysctls maps each of Sysctls to its value.
	Sysctls map[string]string
	// Absent lists the global paths that did not exist: the teardown removes them.
	Absent []string
}

// RecordHostState reads the sysctls the kubelet may change and which of its global paths exist.
func RecordHostState() (HostState, error) {
	h := HostState{Sysctls: map[string]string{}}
	for _, s := range Sysctls {
		v, err := readSysctl(s)
		if err != nil {
			return h, err
		}
		h.Sysctls[s] = v
	}
	for _, p := range globalPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			h.Absent = append(h.Absent, p)
		}
	}
	return h, nil
}

func sysctlPath(name string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
}

func readSysctl(name string) (string, error) {
	data, err := os.ReadFile(sysctlPath(name))
	if err != nil {
		return "", fmt.Errorf("read sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(data)), nil
}

// ChangedSysctls lists the sysctls whose value differs from the recorded one, as "name: was -> now".
func (h HostState) ChangedSysctls() []string {
	var out []string
	for _, s := range Sysctls {
		was, ok := h.Sysctls[s]
		if !ok {
			continue
		}
		if now, err := readSysctl(s); err == nil && now != was {
			out = append(out, fmt.Sprintf("%s: %s -> %s", s, was, now))
		}
	}
	return out
}

// restore writes back every recorded sysctl that changed.
func (h HostState) restore() error {
	var errs []error
	for _, s := range Sysctls {
		was, ok := h.Sysctls[s]
		if !ok {
			continue
		}
		if now, err := readSysctl(s); err == nil && now == was {
			continue
		}
		if err := os.WriteFile(sysctlPath(s), []byte(was), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", s, was, err))
		}
	}
	return errors.Join(errs...)
}

// Teardown stops the kubelet and undoes everything it did: its pods (removed through containerd's
// CRI), its log symlinks, its mounts, its cgroups, the sysctls it set, the global paths it created,
// and its directory. It then checks that nothing is left and returns an error naming every leftover.
func (k *Kubelet) Teardown(ctx context.Context) error {
	var errs []error
	k.Stop()
	harness.KillAll(k.ownedProcesses)
	if err := k.removePods(ctx); err != nil {
		errs = append(errs, fmt.Errorf("removing the kubelet's pods through containerd: %w", err))
	}
	for _, l := range k.logSymlinks() {
		_ = os.Remove(l)
	}
	harness.UnmountAll(k.Dir)
	harness.KillAll(k.ownedProcesses)
	harness.RemoveCgroups(k.CgroupRoot)
	if err := k.Host.restore(); err != nil {
		errs = append(errs, err)
	}
	// Deepest first: /var/lib/kubelet/device-plugins before /var/lib/kubelet.
	absent := append([]string(nil), k.Host.Absent...)
	sort.Slice(absent, func(i, j int) bool { return len(absent[i]) > len(absent[j]) })
	for _, p := range absent {
		if p == containerLogsDir {
			// Other symlinks than ours would be someone else's: remove it only when empty.
			_ = os.Remove(p)
		} else {
			_ = os.RemoveAll(p)
		}
	}
	if err := os.RemoveAll(k.Dir); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", k.Dir, err))
	}
	if leaks := k.Leftovers(); len(leaks) > 0 {
		errs = append(errs, fmt.Errorf("kubelet teardown left behind:\n  %s", strings.Join(leaks, "\n  ")))
	}
	return errors.Join(errs...)
}

// Leftovers lists what of the kubelet still exists or is still changed: processes, mounts, cgroups,
// sysctls, global paths it created, log symlinks and its directory.
func (k *Kubelet) Leftovers() []string {
	out := harness.DescribeProcesses(k.ownedProcesses())
	for _, mp := range harness.MountsUnder(k.Dir) {
		out = append(out, "mount "+mp)
	}
	for _, d := range harness.CgroupDirs(k.CgroupRoot) {
		out = append(out, "cgroup "+d)
	}
	for _, s := range k.Host.ChangedSysctls() {
		out = append(out, "sysctl "+s)
	}
	for _, p := range k.Host.Absent {
		if _, err := os.Lstat(p); err == nil {
			out = append(out, "created path "+p)
		}
	}
	for _, l := range k.logSymlinks() {
		out = append(out, "log symlink "+l)
	}
	if _, err := os.Stat(k.Dir); err == nil {
		out = append(out, "directory "+k.Dir)
	}
	return out
}

// removePods stops and removes, through containerd's own CRI, every pod sandbox of the kubelet's
// namespace: a stopped kubelet leaves its pods running.
func (k *Kubelet) removePods(ctx context.Context) error {
	if k.opts.ContainerdAddress == "" {
		return nil
	}
	if _, err := os.Stat(k.opts.ContainerdAddress); err != nil {
		return nil // containerd is gone: its own teardown removes what it ran
	}
	conn, err := harness.DialUnix(k.opts.ContainerdAddress)
	if err != nil {
		return err
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	pods, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.namespace": Namespace}}})
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range pods.GetItems() {
		if err := removePod(ctx, rt, p.Id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removePod stops and removes one pod sandbox, trying again while containerd still reports one of its
// containers running (a container that has exited is running for containerd until its task is deleted).
func removePod(ctx context.Context, rt runtimeapi.RuntimeServiceClient, id string) error {
	var err error
	for {
		if _, err = rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			err = fmt.Errorf("stop pod %s: %w", id, err)
		} else if _, err = rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			err = fmt.Errorf("remove pod %s: %w", id, err)
		} else {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// logSymlinks lists the symlinks in /var/log/containers that point into the kubelet's pods log dir.
func (k *Kubelet) logSymlinks() []string {
	entries, err := os.ReadDir(containerLogsDir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		p := filepath.Join(containerLogsDir, e.Name())
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, k.PodLogsDir+"/") {
			out = append(out, p)
		}
	}
	return out
}

// ownedProcesses lists the kubelet (any process whose command line names its directory) and any process
// left in its cgroup root.
func (k *Kubelet) ownedProcesses() []int {
	return harness.ProcessesWhere(func(pid int) bool { return k.ownsPID(pid) || harness.InCgroup(pid, k.CgroupRoot) })
}

// Load reads the kubelet saved in dir, so that another process can tear it down.
func Load(dir string) (*Kubelet, error) {
	data, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return nil, err
	}
	k := &Kubelet{}
	if err := json.Unmarshal(data, k); err != nil {
		return nil, fmt.Errorf("failed to parse %s/state.json: %w", dir, err)
	}
	k.opts.Log = io.Discard
	k.opts.ContainerdAddress = k.ContainerdAddress
	return k, nil
}

// CleanStale tears down the kubelets left by a test process that died. The caller must hold Lock.
func CleanStale(ctx context.Context, log io.Writer) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		k, err := Load(dir)
		if err != nil || k.Owner == 0 || testutil.Alive(k.Owner) {
			continue
		}
		fmt.Fprintf(log, "kubelet: tearing down stale kubelet %s (owner %d is gone)\n", dir, k.Owner)
		if err := k.Teardown(ctx); err != nil {
			fmt.Fprintf(log, "kubelet: stale kubelet %s: %v\n", dir, err)
		}
	}
}

// lockPath serializes the kubelet runs of every test process on the machine.
var lockPath = filepath.Join(os.TempDir(), "plegkube.lock")

// Lock takes the machine-wide lock of kubelet runs, waiting for another test process to release it;
// the returned function releases it. The lock dies with the process that holds it.
func Lock(ctx context.Context, log io.Writer) (func(), error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	waiting := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", lockPath, err)
		}
		if !waiting {
			fmt.Fprintf(log, "kubelet: another kubelet test run holds %s, waiting\n", lockPath)
			waiting = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// freePorts returns n loopback TCP ports nobody listens on right now.
func freePorts(n int) ([]int, error) {
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// makeCgroup creates the cgroup path in every hierarchy; in cpuset it copies each new level's cpus and
// mems from its parent (a cpuset cgroup without them cannot hold a process).
func makeCgroup(path string) error {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for _, root := range harness.CgroupRoots() {
		cur := root
		for _, p := range parts {
			parent := cur
			cur = filepath.Join(cur, p)
			if err := os.Mkdir(cur, 0o755); err != nil {
				if errors.Is(err, os.ErrExist) {
					continue
				}
				return err
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				data, err := os.ReadFile(filepath.Join(parent, f))
				if err != nil {
					continue // not the cpuset hierarchy
				}
				if err := os.WriteFile(filepath.Join(cur, f), data, 0o644); err != nil {
					return fmt.Errorf("%s/%s: %w", cur, f, err)
				}
			}
		}
	}
	return nil
}

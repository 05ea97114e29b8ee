package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// cniStateDir is where libcni and host-local keep their state, whatever containerd is configured with.
const cniStateDir = "/var/lib/cni"

// Teardown removes everything the environment made: its pods (through the CRI while containerd runs),
// containerd, leftover shims and container processes, mounts, cgroups, the bridge, the CNI state and
// the directory. It then checks that nothing is left and returns an error naming every leftover.
func (e *Env) Teardown(ctx context.Context) error {
	var errs []error
	if e.Running() {
		if err := e.RemoveAllPods(ctx); err != nil {
			errs = append(errs, fmt.Errorf("removing pods through the CRI: %w", err))
		}
	}
	if err := e.signal(ctx, syscall.SIGTERM, 15*time.Second); err != nil {
		errs = append(errs, err)
	}
	if err := e.removeContainer(ctx); err != nil {
		errs = append(errs, fmt.Errorf("removing container %s: %w", e.Container, err))
	}
	KillAll(e.ownedProcesses)
	e.unmountAll()
	RemoveCgroups(e.CgroupParent)
	e.removeNetwork()
	if err := os.RemoveAll(e.Dir); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", e.Dir, err))
	}
	if leaks := e.Leftovers(); len(leaks) > 0 {
		errs = append(errs, fmt.Errorf("teardown left behind:\n  %s", strings.Join(leaks, "\n  ")))
	}
	return errors.Join(errs...)
}

// RemoveAllPods stops and removes every pod sandbox through the CRI, as a kubelet would.
func (e *Env) RemoveAllPods(ctx context.Context) error {
	conn, err := e.Dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	pods, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range pods.GetItems() {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stop pod %s: %w", p.Id, err))
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			errs = append(errs, fmt.Errorf("remove pod %s: %w", p.Id, err))
		}
	}
	return errors.Join(errs...)
}

// ownedProcesses lists the pids of processes of this environment: any process whose command line names
// the environment's directory (containerd, shims, runc) or that lives in its cgroup parent (container
// processes).
func (e *Env) ownedProcesses() []int {
	return ProcessesWhere(func(pid int) bool { return CommandLineHas(pid, e.Dir) || InCgroup(pid, e.CgroupParent) })
}

// MountsUnder lists the mount points at or below dir, deepest first.
func MountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (e *Env) unmountAll() { UnmountAll(e.Dir) }

// UnmountAll unmounts everything at or below dir, deepest first (lazily when a mount is busy).
func UnmountAll(dir string) {
	for attempt := 0; attempt < 5; attempt++ {
		mps := MountsUnder(dir)
		if len(mps) == 0 {
			return
		}
		for _, mp := range mps {
			if err := syscall.Unmount(mp, 0); err != nil {
				_ = syscall.Unmount(mp, syscall.MNT_DETACH)
			}
		}
	}
}

// CgroupRoots lists the mounted cgroup hierarchies (v1 controllers or the v2 unified tree).
func CgroupRoots() []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	var roots []string
	for _, l := range strings.Split(string(data), "\n") {
		fields := strings.Fields(l)
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) {
			continue
		}
		if fs := fields[sep+1]; (fs == "cgroup" || fs == "cgroup2") && !seen[fields[4]] {
			seen[fields[4]] = true
			roots = append(roots, fields[4])
		}
	}
	return roots
}

// CgroupDirs lists the cgroup directories at or below path in every hierarchy, deepest first (none
// for the root: never the whole hierarchy).
func CgroupDirs(path string) []string {
	if strings.Trim(path, "/") == "" {
		return nil
	}
	var dirs []string
	for _, root := range CgroupRoots() {
		_ = filepath.WalkDir(filepath.Join(root, path), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	return dirs
}

// RemoveCgroups removes the cgroup directories at or below path, deepest first, trying again while
// one is busy (for 2.5 s at the most).
func RemoveCgroups(path string) {
	for attempt := 0; attempt < 50; attempt++ {
		dirs := CgroupDirs(path)
		if len(dirs) == 0 {
			return
		}
		for _, d := range dirs {
			_ = syscall.Rmdir(d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *Env) removeNetwork() {
	e.removeForwardRule()
	if linkExists(e.Bridge) {
		_ = exec.Command("ip", "link", "delete", e.Bridge).Run()
	}
	for _, p := range e.cniState() {
		_ = os.RemoveAll(p)
	}
}

// forwardRule lets the pods of the environment's bridge reach each other: Docker sets the FORWARD
// policy to DROP, and with br_netfilter traffic between two ports of a bridge goes through FORWARD.
func (e *Env) forwardRule() []string {
	return []string{"-i", e.Bridge, "-o", e.Bridge, "-j", "ACCEPT"}
}

func (e *Env) addForwardRule() error {
	out, err := exec.Command("iptables", append([]string{"-w", "-I", "FORWARD"}, e.forwardRule()...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables -I FORWARD %s: %w: %s", strings.Join(e.forwardRule(), " "), err, out)
	}
	e.Forward = true
	return nil
}

func (e *Env) hasForwardRule() bool {
	return exec.Command("iptables", append([]string{"-w", "-C", "FORWARD"}, e.forwardRule()...)...).Run() == nil
}

func (e *Env) removeForwardRule() {
	if !e.Forward {
		return
	}
	for e.hasForwardRule() {
		if exec.Command("iptables", append([]string{"-w", "-D", "FORWARD"}, e.forwardRule()...)...).Run() != nil {
			return
		}
	}
}

func linkExists(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}

// cniState lists libcni's and host-local's state entries of the environment: its network's, and the
// cached results of containerd's loopback network ("cni-loopback-<sandbox>-lo"), which carry no
// network name of ours but record a network namespace under the environment's directory.
func (e *Env) cniState() []string {
	var out []string
	if _, err := os.Stat(filepath.Join(cniStateDir, "networks", e.NetName)); err == nil {
		out = append(out, filepath.Join(cniStateDir, "networks", e.NetName))
	}
	matches, _ := filepath.Glob(filepath.Join(cniStateDir, "results", e.NetName+"-*"))
	out = append(out, matches...)
	loopbacks, _ := filepath.Glob(filepath.Join(cniStateDir, "results", "cni-loopback-*"))
	for _, f := range loopbacks {
		var cached struct {
			Netns string `json:"netns"`
		}
		if data, err := os.ReadFile(f); err == nil && json.Unmarshal(data, &cached) == nil &&
			strings.HasPrefix(cached.Netns, e.Dir+"/") {
			out = append(out, f)
		}
	}
	return out
}

// Leftovers lists what of the environment still exists: processes, mounts, cgroups, the bridge, CNI
// state, network namespaces and the directory.
func (e *Env) Leftovers() []string {
	out := DescribeProcesses(e.ownedProcesses())
	for _, mp := range MountsUnder(e.Dir) {
		out = append(out, "mount "+mp)
	}
	for _, d := range CgroupDirs(e.CgroupParent) {
		out = append(out, "cgroup "+d)
	}
	if linkExists(e.Bridge) {
		out = append(out, "network device "+e.Bridge)
	}
	if e.Forward && e.hasForwardRule() {
		out = append(out, "iptables rule FORWARD "+strings.Join(e.forwardRule(), " "))
	}
	for _, p := range e.cniState() {
		out = append(out, "CNI state "+p)
	}
	if _, err := os.Stat(e.Dir); err == nil {
		out = append(out, "directory "+e.Dir)
	}
	if e.Container != "" && e.containerExists(context.Background()) {
		out = append(out, "docker container "+e.Container)
	}
	return out
}

// CleanStale tears down environments left by a harness process that died (a test binary killed by its
// timeout, say). Environments made by hand (make it-up) are left alone.
func CleanStale(ctx context.Context, log io.Writer) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		e, err := Load(dir)
		if err != nil || e.Owner == 0 || testutil.Alive(e.Owner) {
			continue
		}
		e.SetLog(log)
		fmt.Fprintf(log, "harness: tearing down stale environment %s (owner %d is gone)\n", dir, e.Owner)
		if err := e.Teardown(ctx); err != nil {
			fmt.Fprintf(log, "harness: stale environment %s: %v\n", dir, err)
		}
	}
}

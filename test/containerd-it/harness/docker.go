package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// Where the containerd of an environment runs (Options.Containerd).
const (
	// Native runs containerd as a child process of the harness, on this machine.
	Native = "native"
	// Docker runs containerd in a container of the pleg-nri-test/containerd image
	// (test/images/containerd.sh), as containerd's CI and kind run a runtime in a container. The
	// environment's directory is bind-mounted at the same path, so every socket, config and log path
	// means the same on both sides and the sockets reach this machine's processes (pleg-nri, the
	// tests' CRI clients) through it; containerd's root is in it too, so its overlayfs snapshots never
	// sit on the engine's overlay storage.
	Docker = "docker"
)

// Paths of the binaries in the pleg-nri-test/containerd image.
const (
	imageRunc      = "/usr/local/bin/runc"
	imageCNIBinDir = "/opt/cni/bin"
	imageArchives  = "/opt/pleg-nri/images"
)

// ContainerdFromEnv returns the Options.Containerd value the environment variable
// PLEG_NRI_IT_CONTAINERD asks for ("" or "native": Native; "docker": Docker).
func ContainerdFromEnv() (string, error) {
	switch v := os.Getenv("PLEG_NRI_IT_CONTAINERD"); v {
	case "", Native:
		return Native, nil
	case Docker:
		return Docker, nil
	default:
		return "", fmt.Errorf("PLEG_NRI_IT_CONTAINERD=%q: want %q or %q", v, Native, Docker)
	}
}

// buildContainerdImage builds the test images and the pleg-nri-test/containerd image from them and
// the dependency cache (nothing when both are current), and returns the image's name.
func buildContainerdImage(ctx context.Context, cache string, log io.Writer) (string, error) {
	if _, err := exec.LookPath("docker"); err != nil {
		return "", fmt.Errorf("PLEG_NRI_IT_CONTAINERD=docker needs the docker CLI and a running engine: %w", err)
	}
	archives, err := BuildImages(ctx, cache)
	if err != nil {
		return "", err
	}
	_, self, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(self), "..", "..", "images", "containerd.sh")
	cmd := exec.CommandContext(ctx, "bash", append([]string{script}, archives...)...)
	cmd.Env = append(os.Environ(), "PLEG_NRI_CACHE="+cache)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = io.MultiWriter(&stderr, log)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building the containerd image failed: %w\n%s", err, stderr.String())
	}
	image := strings.TrimSpace(stdout.String())
	if image == "" {
		return "", errors.New("test/images/containerd.sh printed no image name")
	}
	return image, nil
}

// capNames are the capabilities by number, as Docker names them.
var capNames = []string{
	"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
	"LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
	"SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
	"SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
	"MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
	"CHECKPOINT_RESTORE",
}

// missingCapabilities lists the capabilities the kernel knows but this process's bounding set lacks
// (on this project's machines: SYS_RESOURCE). Docker's --privileged asks runc for every capability
// the kernel knows, and runc fails with "unable to apply caps: operation not permitted" when one of
// them is not in the engine's bounding set.
func missingCapabilities() ([]string, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil, err
	}
	last := len(capNames) - 1
	if data, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			last = n
		}
	}
	return capsMissing(string(status), last)
}

// capsMissing returns the names of the capabilities 0..lastCap that the CapBnd line of a
// /proc/PID/status text does not have.
func capsMissing(status string, lastCap int) ([]string, error) {
	var bnd uint64
	found := false
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, "CapBnd:"); ok {
			var err error
			if bnd, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64); err != nil {
				return nil, fmt.Errorf("failed to parse CapBnd %q: %w", v, err)
			}
			found = true
		}
	}
	if !found {
		return nil, errors.New("no CapBnd in /proc/self/status")
	}
	lastCap = min(lastCap, len(capNames)-1)
	var missing []string
	for i := 0; i <= lastCap; i++ {
		if bnd&(1<<uint(i)) == 0 {
			missing = append(missing, capNames[i])
		}
	}
	return missing, nil
}

// privilegeFlags are the docker run flags that give the container what --privileged gives (every
// capability, no seccomp or AppArmor profile, unmasked /proc, every device in the device cgroup), or
// --privileged itself where the engine can grant every capability. Without --privileged Docker mounts
// /sys and the cgroups read-only; the image's entrypoint remounts them writable.
func privilegeFlags() ([]string, string, error) {
	missing, err := missingCapabilities()
	if err != nil {
		return nil, "", err
	}
	if len(missing) == 0 {
		return []string{"--privileged"}, "--privileged", nil
	}
	flags := []string{"--cap-add", "ALL"}
	for _, c := range missing {
		flags = append(flags, "--cap-drop", c)
	}
	flags = append(flags,
		"--security-opt", "seccomp=unconfined",
		"--security-opt", "apparmor=unconfined",
		"--security-opt", "systempaths=unconfined",
		"--device-cgroup-rule", "a *:* rwm",
	)
	return flags, fmt.Sprintf("every capability but %s (not in this machine's bounding set, so --privileged fails)",
		strings.Join(missing, ", ")), nil
}

// docker runs the docker CLI and returns its trimmed stdout.
func docker(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// containerRunning says whether the environment's container runs.
func (e *Env) containerRunning(ctx context.Context) bool {
	out, err := docker(ctx, "container", "inspect", "-f", "{{.State.Running}}", e.Container)
	return err == nil && out == "true"
}

// containerExists says whether the environment's container exists, running or not.
func (e *Env) containerExists(ctx context.Context) bool {
	_, err := docker(ctx, "container", "inspect", "-f", "{{.Id}}", e.Container)
	return err == nil
}

// startContainer runs the environment's container: PID 1 is the image's entrypoint (writable
// cgroups, nesting) running `sleep infinity`; containerd is started in it by startInContainer.
func (e *Env) startContainer(ctx context.Context) error {
	flags, how, err := privilegeFlags()
	if err != nil {
		return err
	}
	args := append([]string{"run", "-d", "--name", e.Container, "--label", "org.pleg-nri.it=" + e.ID}, flags...)
	args = append(args,
		"--cgroupns=private",
		"--tmpfs", "/run", "--tmpfs", "/tmp",
		// The environment's directory at the same path: sockets, config, logs, containerd's root.
		"-v", e.Dir+":"+e.Dir,
		e.Image, "sleep", "infinity")
	if _, err := docker(ctx, args...); err != nil {
		return fmt.Errorf("failed to start the containerd container: %w", err)
	}
	e.logf("container %s of %s runs with %s", e.Container, e.Image, how)
	return nil
}

// startInContainer starts containerd in the environment's container with docker exec, appending its
// output to the log, and finds its pid on this machine (so Stop and Kill signal it as they signal a
// native containerd, and the shims and containers keep running as they do on a node).
func (e *Env) startInContainer(ctx context.Context) error {
	if !e.containerRunning(ctx) {
		if e.containerExists(ctx) {
			_, _ = docker(ctx, "rm", "-f", "-v", e.Container)
		}
		if err := e.startContainer(ctx); err != nil {
			return err
		}
	}
	script := fmt.Sprintf("exec containerd --config %s >>%s 2>&1", e.ConfigPath, e.LogPath)
	if _, err := docker(ctx, "exec", "-d", e.Container, "sh", "-c", script); err != nil {
		return fmt.Errorf("failed to start containerd in %s: %w", e.Container, err)
	}
	want := "containerd\x00--config\x00" + e.ConfigPath + "\x00"
	return WaitFor(ctx, 10*time.Second, "containerd's pid", func() (bool, error) {
		entries, _ := os.ReadDir("/proc")
		for _, ent := range entries {
			pid, err := strconv.Atoi(ent.Name())
			if err != nil {
				continue
			}
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if string(cmdline) == want && testutil.Alive(pid) {
				e.PID = pid
				return true, nil
			}
		}
		return false, nil
	})
}

// importInContainer imports the test images baked into the image (test/images/containerd.sh copies
// the archives BuildImages made) with the image's ctr.
func (e *Env) importInContainer(ctx context.Context) error {
	out, err := docker(ctx, "exec", e.Container, "sh", "-c",
		fmt.Sprintf("for a in %s/*.tar; do ctr --address %s --namespace k8s.io images import --local \"$a\" || exit 1; done",
			imageArchives, e.Address))
	if err != nil {
		return fmt.Errorf("importing the test images in %s: %w: %s", e.Container, err, out)
	}
	return nil
}

// removeContainer removes the environment's container and its anonymous volumes: with it go every
// process, mount, cgroup and network device containerd made in it.
func (e *Env) removeContainer(ctx context.Context) error {
	if e.Container == "" || !e.containerExists(ctx) {
		return nil
	}
	if _, err := docker(ctx, "rm", "-f", "-v", e.Container); err != nil {
		return err
	}
	return nil
}

// SignalContainerProcess sends sig to a process of a container, by the pid the CRI reports for it (in
// containerd's pid namespace: the container's when containerd runs in Docker).
func (e *Env) SignalContainerProcess(ctx context.Context, pid int, sig syscall.Signal) error {
	if e.Container == "" {
		return syscall.Kill(pid, sig)
	}
	if _, err := docker(ctx, "exec", e.Container, "kill", "-s", strconv.Itoa(int(sig)), strconv.Itoa(pid)); err != nil {
		return fmt.Errorf("failed to signal pid %d in %s: %w", pid, e.Container, err)
	}
	return nil
}

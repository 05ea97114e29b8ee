package main

// The daemon as its users run it: the real binary with bad flags, bad config files and unusable listen
// paths (a clear error naming what is wrong, exit status 2 for a usage error and 1 for a failure, nothing touched that pleg-nri did not
// create), and the socket it serves (0660 in a 0750 directory, nothing else listening but loopback).
// None of these needs containerd: pleg-nri waits for containerd's sockets and gets as far as serving.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/runningcore"
	"github.com/pleg-nri/pleg-nri/eventbridge/front"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// absentUpstreams are flags that point pleg-nri at containerd sockets that do not exist (it waits for
// them) under dir, keep its state under dir, and disable the metrics server.
func absentUpstreams(dir string) []string {
	return []string{
		"--nri-socket", filepath.Join(dir, "absent-nri.sock"),
		"--containerd-address", filepath.Join(dir, "absent-containerd.sock"),
		"--runtime-endpoint", "unix://" + filepath.Join(dir, "absent-containerd.sock"),
		"--metrics-address", "",
		"--state-dir", filepath.Join(dir, "state"),
	}
}

// runToExit runs the daemon with args and returns its exit status and stderr; it fails the test if the
// daemon is still running after 30s.
func runToExit(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(daemonBinary(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), stderr.String()
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("pleg-nri %v is still running after 30s; output:\n%s", args, stderr.String())
		return 0, ""
	}
}

// lastLine is the error line the daemon prints before exiting.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

// snapshot records every path under root with its mode, size, time and content, to tell whether
// anything was created, deleted or changed.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		desc := fmt.Sprintf("%s %d %d", fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			desc += " " + string(b)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(path)
			desc += " -> " + target
		}
		out[path] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDaemonBadConfiguration(t *testing.T) {
	dir := testutil.ShortTempDir(t, "pn-")
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	listen := []string{"--listen", "unix://" + filepath.Join(dir, "run", "cri.sock")}
	for _, tc := range []struct {
		name string
		args []string
		want []string // in the last line of the output
		// failure: the configuration is valid, but the daemon cannot run with it (exit status 1, not 2).
		failure bool
	}{
		{"unknown config key", []string{"--config", write("unknown.yaml", "relist_period: 5s\n")},
			[]string{"unknown.yaml", `unknown config key "relist_period"`}, false},
		{"bad duration in the file", []string{"--config", write("dur.yaml", "relist-period: often\n")},
			[]string{`config key "relist-period"`, "often"}, false},
		{"negative size in the file", []string{"--config", write("size.yaml", "subscriber-queue: -1\n")},
			[]string{`config key "subscriber-queue"`, "must be at least 1"}, false},
		{"negative size flag", []string{"--subscriber-queue", "-5"}, []string{`config key "subscriber-queue"`, "-5"}, false},
		{"bad duration flag", []string{"--relist-period", "soon"}, []string{"-relist-period", `"soon"`}, false},
		{"negative duration flag", []string{"--relist-period", "-3s"}, []string{`config key "relist-period"`, "-3s"}, false},
		{"unknown flag", []string{"--relist_period", "5s"}, []string{"flag provided but not defined", "-relist_period"}, false},
		{"missing config file", []string{"--config", filepath.Join(dir, "missing.yaml")}, []string{"missing.yaml", "no such file"}, false},
		{"config file is a directory", []string{"--config", dir}, []string{dir, "is a directory"}, false},
		{"not YAML", []string{"--config", write("bad.yaml", "a: [\n")}, []string{"bad.yaml", "invalid config"}, false},
		{"bad listen scheme", []string{"--listen", "http://127.0.0.1:1"}, []string{`config key "listen"`}, false},
		{"relative listen path", []string{"--listen", "run/cri.sock"}, []string{"listen", "run/cri.sock"}, false},
		{"bad metrics address", []string{"--metrics-address", "9810"}, []string{`config key "metrics-address"`}, false},
		{"extra argument", []string{"serve"}, []string{`unexpected argument "serve"`}, false},
		{"relative state dir", []string{"--state-dir", "var/lib/pleg-nri"}, []string{`config key "state-dir"`, "absolute"}, false},
		{"state dir is a file", []string{"--state-dir", write("state-file", "")}, []string{`config key "state-dir"`, "not a directory"}, true},
		{"state dir under a file", []string{"--state-dir", filepath.Join(write("state-parent", ""), "state")}, []string{`config key "state-dir"`, "state-parent"}, true},
		{"read-only state dir", []string{"--state-dir", roDir(t, dir)}, []string{`config key "state-dir"`, "not writable"}, true},
		{"negative startup replay", []string{"--startup-replay", "-1s"}, []string{`config key "startup-replay"`, "-1s"}, false},
		{"stall timeout too short", []string{"--subscriber-stall-timeout", "10ms"}, []string{`config key "subscriber-stall-timeout"`, "10ms"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append(absentUpstreams(dir), listen...), tc.args...)
			code, out := runToExit(t, args...)
			if want := map[bool]int{false: 2, true: 1}[tc.failure]; code != want {
				t.Errorf("exit status %d, want %d; output:\n%s", code, want, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(lastLine(out), w) {
					t.Errorf("last line %q does not say %q", lastLine(out), w)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "run")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a bad configuration still created the socket directory: %v", err)
			}
		})
	}
}

// roDir returns a read-only directory: a read-only tmpfs when running as root (whom permission bits do
// not stop), 0755 (a tmpfs's default, 1777, is refused as writable by others), else a 0555 directory.
func roDir(t *testing.T, parent string) string {
	t.Helper()
	dir := filepath.Join(parent, "ro")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		if err := os.Chmod(dir, 0o555); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Chmod(dir, 0o755) })
		return dir
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_RDONLY|syscall.MS_NOSUID|syscall.MS_NODEV, "size=64k,mode=0755"); err != nil {
		t.Skipf("cannot mount a read-only tmpfs for the read-only directory case: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// TestDaemonUnusableListenPaths: every unusable --listen path gives exit status 1 and an error naming
// the flag and the path; nothing under the test directory is created, deleted or changed.
func TestDaemonUnusableListenPaths(t *testing.T) {
	dir := testutil.ShortTempDir(t, "pn-")
	mk := func(name string, fn func(p string) error) string {
		p := filepath.Join(dir, name)
		if err := fn(p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	file := mk("file.sock", func(p string) error { return os.WriteFile(p, []byte("keep me"), 0o640) })
	notDir := mk("notdir", func(p string) error { return os.WriteFile(p, []byte("a file"), 0o600) })
	isDir := mk("dir.sock", func(p string) error {
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(p, "inside"), []byte("keep me too"), 0o600)
	})
	link := mk("link.sock", func(p string) error { return os.Symlink(file, p) })
	dangling := mk("dangling.sock", func(p string) error { return os.Symlink(filepath.Join(dir, "nowhere"), p) })
	live := filepath.Join(dir, "live.sock")
	other, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	go func() {
		for {
			c, err := other.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	ro := roDir(t, dir)

	cases := []struct {
		name, path string
		want       []string
	}{
		{"missing parent directory", filepath.Join(dir, "missing", "run", "cri.sock"), []string{filepath.Join(dir, "missing"), "does not exist"}},
		{"read-only directory", filepath.Join(ro, "cri.sock"), []string{filepath.Join(ro, "cri.sock")}},
		{"socket directory in a read-only directory", filepath.Join(ro, "run", "cri.sock"), []string{filepath.Join(ro, "run")}},
		{"regular file", file, []string{file, "not a socket"}},
		{"directory", isDir, []string{isDir, "not a socket"}},
		{"symlink to a file", link, []string{link, "not a socket"}},
		{"dangling symlink", dangling, []string{dangling, "not a socket"}},
		{"socket directory is a file", filepath.Join(notDir, "cri.sock"), []string{notDir, "not a directory"}},
		{"socket of a live server", live, []string{live, "another server is listening"}},
		{"path longer than a socket address", filepath.Join(dir, strings.Repeat("x", 120)+".sock"), []string{"failed to listen"}},
	}
	before := snapshot(t, dir)
	state := filepath.Join(testutil.ShortTempDir(t, "pn-"), "state") // made before the listen fails: outside dir
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runToExit(t, append(absentUpstreams(dir), "--state-dir", state, "--listen", "unix://"+tc.path)...)
			if code != 1 {
				t.Errorf("exit status %d, want 1 (a failure to run, not a usage error); output:\n%s", code, out)
			}
			line := lastLine(out)
			for _, w := range append([]string{`config key "listen"`}, tc.want...) {
				if !strings.Contains(line, w) {
					t.Errorf("last line %q does not say %q", line, w)
				}
			}
			after := snapshot(t, dir)
			for p, d := range before {
				if after[p] != d {
					t.Errorf("%s changed: %q -> %q", p, d, after[p])
				}
			}
			for p := range after {
				if _, ok := before[p]; !ok {
					t.Errorf("%s was created", p)
				}
			}
		})
	}
	if c, err := net.Dial("unix", live); err != nil {
		t.Errorf("the live server's socket was broken: %v", err)
	} else {
		_ = c.Close()
	}
}

// daemon is a pleg-nri process started for a test.
type daemon struct {
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
	done chan struct{}
}

// startDaemon starts pleg-nri with args under umask mask and waits until its socket (the front's)
// and the core's event socket beside it answer.
func startDaemon(t *testing.T, socket string, mask int, args ...string) *daemon {
	t.Helper()
	d := spawnDaemon(t, socket, mask, args...)
	d.waitServing(t, socket)
	return d
}

// spawnDaemon starts pleg-nri with args under umask mask; it and its front are stopped when the test
// ends.
func spawnDaemon(t *testing.T, socket string, mask int, args ...string) *daemon {
	t.Helper()
	// The socket and directory modes must not depend on the umask pleg-nri is started with.
	cmd := exec.Command("/bin/sh", append([]string{"-c", fmt.Sprintf("umask %03o && exec \"$0\" \"$@\"", mask), daemonBinary(t)}, args...)...)
	d := &daemon{cmd: cmd, out: new(testutil.SyncBuffer), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = d.out, d.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		d.stop(t)
		// The front the daemon started outlives it, by design: stop it too.
		if err := front.Stop(filepath.Dir(socket)); err != nil {
			t.Errorf("stop the front: %v", err)
		}
		if t.Failed() {
			t.Logf("pleg-nri output:\n%s", d.out.String())
		}
	})
	return d
}

// waitServing waits until the daemon serves socket (the front's) and the core's event socket beside it.
func (d *daemon) waitServing(t *testing.T, socket string) {
	t.Helper()
	err := testutil.Poll(context.Background(), 30*time.Second, "pleg-nri to serve "+socket, func() (bool, error) {
		select {
		case <-d.done:
			t.Fatalf("pleg-nri exited: %s", d.out.String())
		default:
		}
		// The sockets answer before the metrics server listens: servingLog comes after both.
		return answers(socket) && answers(filepath.Join(filepath.Dir(socket), front.CoreSocketName)) &&
			strings.Contains(d.out.String(), servingLog), nil
	})
	if err != nil {
		t.Fatalf("%v: %s", err, d.out.String())
	}
}

// answers says whether a server accepts connections on the unix socket path.
func answers(path string) bool {
	c, err := net.Dial("unix", path)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// stop sends SIGTERM and waits; it returns the exit status.
func (d *daemon) stop(t *testing.T) int {
	t.Helper()
	select {
	case <-d.done:
		return d.cmd.ProcessState.ExitCode()
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
		t.Errorf("pleg-nri did not stop within 20s of SIGTERM")
	}
	return d.cmd.ProcessState.ExitCode()
}

// listeners returns the listening sockets of process pid: TCP ones as "tcp host:port", unix ones as
// "unix path".
func listeners(t *testing.T, pid int) []string {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(target, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] = true
		}
	}
	var out []string
	for _, proto := range []string{"tcp", "tcp6", "udp", "udp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, proto))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			if len(fields) < 10 || !inodes[fields[9]] {
				continue
			}
			if strings.HasPrefix(proto, "tcp") && fields[3] != "0A" { // LISTEN
				continue
			}
			out = append(out, proto+" "+hexAddr(t, fields[1]))
		}
		_ = f.Close()
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan()
	for sc.Scan() {
		// Num RefCount Protocol Flags Type St Inode Path
		fields := strings.Fields(sc.Text())
		if len(fields) >= 7 && inodes[fields[6]] && fields[3] == "00010000" { // __SO_ACCEPTCON: listening
			path := ""
			if len(fields) >= 8 {
				path = fields[7]
			}
			out = append(out, "unix "+path)
		}
	}
	return out
}

// hexAddr decodes /proc/net/tcp's "0100007F:2652" into an IP and port.
func hexAddr(t *testing.T, s string) string {
	t.Helper()
	host, port, _ := strings.Cut(s, ":")
	b := make([]byte, len(host)/2)
	for i := range b {
		v, err := strconv.ParseUint(host[2*i:2*i+2], 16, 8)
		if err != nil {
			t.Fatalf("bad address %q", s)
		}
		b[i] = byte(v)
	}
	// The kernel prints each 32-bit word in host (little endian) order.
	for i := 0; i+4 <= len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	p, _ := strconv.ParseUint(port, 16, 16)
	return net.JoinHostPort(net.IP(b).String(), strconv.FormatUint(p, 10))
}

// TestDaemonSocketAndListeners starts the daemon under a permissive and a strict umask: its CRI socket
// is 0660 in a 0750 directory it created; the front it started listens on nothing but that socket and
// its control socket, the core on nothing but its event socket and the loopback metrics address; the
// metrics answer; SIGTERM stops the core with status 0 and removes its socket, and the front serves on
// until `pleg-nri stop-front`, which removes the CRI socket.
func TestDaemonSocketAndListeners(t *testing.T) {
	for _, mask := range []int{0o000, 0o077} {
		t.Run(fmt.Sprintf("umask %03o", mask), func(t *testing.T) {
			dir := testutil.ShortTempDir(t, "pn-")
			sockDir := filepath.Join(dir, "run")
			sock := filepath.Join(sockDir, "cri.sock")
			metrics := freeLoopbackAddr(t)
			args := append(absentUpstreams(dir), "--listen", "unix://"+sock, "--metrics-address", metrics)
			d := startDaemon(t, sock, mask, args...)

			for path, want := range map[string]fs.FileMode{sockDir: fs.ModeDir | 0o750, sock: fs.ModeSocket | 0o660} {
				fi, err := os.Lstat(path)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode() != want {
					t.Errorf("%s: mode %s, want %s", path, fi.Mode(), want)
				}
			}
			resp, err := http.Get("http://" + metrics + "/healthz")
			if err != nil {
				t.Fatalf("/healthz: %v", err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			// One scrape shows the core's metrics and the front's (the kubelet's endpoint).
			resp, err = http.Get("http://" + metrics + "/metrics")
			if err != nil {
				t.Fatalf("/metrics: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			for _, name := range []string{"pleg_nri_subscribers ", "pleg_nri_event_streams ", `pleg_nri_upstream_connected{upstream="front_cri"} `, `go_goroutines{process="front"} `, `go_goroutines{process="core"} `} {
				if !strings.Contains(string(body), "\n"+name) {
					t.Errorf("/metrics has no %s", name)
				}
			}

			info, err := front.Query(sockDir, "info")
			if err != nil {
				t.Fatalf("no front answers in %s: %v", sockDir, err)
			}
			if info.PID == d.cmd.Process.Pid || info.Listen != "unix://"+sock {
				t.Errorf("front: %+v, want another process serving %s", info, sock)
			}
			for pid, want := range map[int][]string{
				// The core also holds the kubelet's socket the front shares, for the front it would start
				// if this one went away (front.Supervisor).
				d.cmd.Process.Pid: {"unix " + filepath.Join(sockDir, front.CoreSocketName), "tcp " + metrics, "unix " + sock},
				info.PID:          {"unix " + sock, "unix " + filepath.Join(sockDir, front.ControlSocketName)},
			} {
				wanted := map[string]bool{}
				for _, l := range want {
					wanted[l] = true
				}
				got := listeners(t, pid)
				for _, l := range got {
					if !wanted[l] {
						t.Errorf("pid %d listens on %s, beyond %v", pid, l, want)
					}
					delete(wanted, l)
				}
				for l := range wanted {
					t.Errorf("pid %d does not listen on %s (listeners: %v)", pid, l, got)
				}
			}

			if code := d.stop(t); code != 0 {
				t.Errorf("exit status %d after SIGTERM, want 0", code)
			}
			if _, err := os.Lstat(filepath.Join(sockDir, front.CoreSocketName)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("core socket left after SIGTERM: %v", err)
			}
			if c, err := net.Dial("unix", sock); err != nil {
				t.Errorf("the front's CRI socket does not answer after the core stopped: %v", err)
			} else {
				_ = c.Close()
			}
			var out bytes.Buffer
			if err := runStopFront([]string{"--run-dir", sockDir}, &out); err != nil {
				t.Fatalf("stop-front: %v", err)
			}
			if testutil.Alive(info.PID) {
				t.Errorf("the front (pid %d) runs after stop-front", info.PID)
			}
			if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("socket left after stop-front: %v", err)
			}
		})
	}
}

// TestDaemonNonLoopbackMetricsWarns: a metrics address that is not loopback is served, because it was
// configured, with a warning saying so.
func TestDaemonNonLoopbackMetricsWarns(t *testing.T) {
	dir := testutil.ShortTempDir(t, "pn-")
	sock := filepath.Join(dir, "run", "cri.sock")
	args := append(absentUpstreams(dir), "--listen", "unix://"+sock, "--metrics-address", "0.0.0.0:0")
	d := startDaemon(t, sock, 0o022, args...)
	testutil.Eventually(t, 10*time.Second, "a warning about the non-loopback metrics address", func() bool {
		return strings.Contains(d.out.String(), "non-loopback")
	})
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	addr, err := testutil.FreeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestRunDaemonStopsCleanly runs the daemon in the test process, with its upstreams absent, until its
// context is canceled: while it serves, core.json names it; it returns nil, removes its core socket and
// core.json, leaves the front serving (this test
// binary, started as a front, see TestMain), and once the front is stopped (TestMain's goleak) no
// goroutine is left.
func TestRunDaemonStopsCleanly(t *testing.T) {
	t.Setenv("NRI_PLUGIN_SOCKET", "")
	dir := testutil.ShortTempDir(t, "pn-")
	cfg := config.Default()
	cfg.NRISocket = filepath.Join(dir, "absent-nri.sock")
	cfg.ContainerdAddress = filepath.Join(dir, "absent-containerd.sock")
	cfg.RuntimeEndpoint = "unix://" + cfg.ContainerdAddress
	cfg.Listen = "unix://" + filepath.Join(dir, "run", "cri.sock")
	cfg.MetricsAddress = freeLoopbackAddr(t)
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.LogLevel = "error"
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- runDaemon(ctx, cfg, "") }()
	err := testutil.Poll(ctx, 20*time.Second, "the daemon's core socket", func() (bool, error) {
		return answers(filepath.Join(dir, "run", front.CoreSocketName)), nil
	})
	if err != nil {
		cancel()
		t.Fatalf("%v: runDaemon: %v", err, <-errc)
	}
	// It says what serves the run directory (for the next pre-registered instance, takeover.go).
	if info, err := runningcore.ReadInfo(filepath.Join(dir, "run")); err != nil || info.PID != os.Getpid() || info.Version != version || info.Config != cfg {
		t.Errorf("core.json while serving: %+v, %v", info, err)
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("runDaemon: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("runDaemon did not return after cancel")
	}
	if _, err := os.Lstat(filepath.Join(dir, "run", front.CoreSocketName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("core socket left: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "run", runningcore.InfoName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("core.json left: %v", err)
	}
	if err := front.Stop(filepath.Join(dir, "run")); err != nil {
		t.Errorf("stop the front: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "run", "cri.sock")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket left after the front stopped: %v", err)
	}
}

// TestDaemonNotifiesSystemd (issue 26): under a unit of Type=notify (NOTIFY_SOCKET set), the daemon says
// READY=1 once it serves and STOPPING=1 when it stops, and the front it spawns does not get the notify
// socket (the unit's state is the daemon's to tell).
func TestDaemonNotifiesSystemd(t *testing.T) {
	dir := testutil.ShortTempDir(t, "pn-")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "notify.sock"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	got := make(chan string, 10)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := notify.Read(buf)
			if err != nil {
				return
			}
			got <- string(buf[:n])
		}
	}()
	t.Setenv("NOTIFY_SOCKET", filepath.Join(dir, "notify.sock"))
	sock := filepath.Join(dir, "run", "cri.sock")
	d := spawnDaemon(t, sock, 0o022, append(absentUpstreams(dir), "--listen", "unix://"+sock)...)
	next := func(want string) {
		t.Helper()
		select {
		case msg := <-got:
			if msg != want {
				t.Errorf("systemd was told %q, want %q", msg, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("systemd was not told %s:\n%s", want, d.out.String())
		}
	}
	next("READY=1")
	// READY=1 means serving: the kubelet's endpoint answers.
	if !answers(sock) {
		t.Errorf("READY=1 before %s answers", sock)
	}
	info, err := front.Query(filepath.Join(dir, "run"), "info")
	if err != nil {
		t.Fatal(err)
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", info.PID))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(env), "NOTIFY_SOCKET=") {
		t.Errorf("the front (pid %d) has NOTIFY_SOCKET in its environment", info.PID)
	}
	if code := d.stop(t); code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
	next("STOPPING=1")
}

package runningcore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/eventbridge/front"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

const testExe = "/opt/nri/plugins/10-pleg-nri"

// TestDecideTakeover (issue 56): a new pre-registered instance takes over from the core that serves its
// run directory when the core's binary was replaced (an upgrade), or its configuration or version
// differs, or it does not say them (an older release); it leaves the work to the same binary with the
// same configuration; it never touches a process of another executable.
func TestDecideTakeover(t *testing.T) {
	cfg := config.Default()
	changed := cfg
	changed.LogLevel, changed.CacheTick = "debug", config.Duration(time.Second)
	self := Info{PID: 20, Version: "v2", Executable: testExe, Config: cfg}
	same := Info{PID: 10, Version: "v2", Executable: testExe, Config: cfg}
	older := same
	older.Version = "v1"
	otherCfg := same
	otherCfg.Config = changed
	for _, tc := range []struct {
		name string
		peer peerCore
		want takeoverAction
		why  string
	}{
		{"the same core", peerCore{PID: 10, Executable: testExe, SameBinary: true, Info: &same}, leaveIt, "the same binary and configuration"},
		{"an upgrade", peerCore{PID: 10, Executable: testExe, Info: &older}, takeOver, "binary was replaced"},
		{"an upgrade from a release without core.json", peerCore{PID: 10, Executable: testExe}, takeOver, "binary was replaced"},
		{"a configuration change", peerCore{PID: 10, Executable: testExe, SameBinary: true, Info: &otherCfg}, takeOver, "differs in cache-tick, log-level"},
		{"the same binary, not saying its configuration", peerCore{PID: 10, Executable: testExe, SameBinary: true}, takeOver, "does not say its configuration"},
		{"the same file, another version", peerCore{PID: 10, Executable: testExe, SameBinary: true, Info: &older}, takeOver, "version v1"},
		{"the host service's core", peerCore{PID: 10, Executable: "/usr/local/bin/pleg-nri", Info: &same}, refuse, `runs "/usr/local/bin/pleg-nri"`},
		{"not pleg-nri", peerCore{PID: 10, Executable: "/usr/bin/socat"}, refuse, "stop it first"},
	} {
		got, why := decideTakeover(self, tc.peer)
		if got != tc.want || !strings.Contains(why, tc.why) {
			t.Errorf("%s: %v (%s), want %v (%s)", tc.name, got, why, tc.want, tc.why)
		}
	}
}

// fakeProcess is a coreProcess that exits on the signals it is told to.
type fakeProcess struct {
	signals []syscall.Signal
	exitOn  map[syscall.Signal]bool
	exited  bool
	closed  bool
}

func (p *fakeProcess) Signal(sig syscall.Signal) error {
	p.signals = append(p.signals, sig)
	if p.exitOn[sig] {
		p.exited = true
	}
	return nil
}

func (p *fakeProcess) Wait(context.Context, time.Duration) bool { return p.exited }
func (p *fakeProcess) Close()                                   { p.closed = true }

// TestTakeover: the takeover with the system faked: nobody serving is served; the same core is left
// the work, unsignalled; an upgraded one gets SIGTERM and, once it exited, this process serves; one that
// ignores SIGTERM gets SIGKILL; another install's core is not signalled and the process stops with an
// error; a core that exited between the connection and its opening is no one to take over from.
func TestTakeover(t *testing.T) {
	ctx := context.Background()
	cfg := config.Default()
	self := Info{PID: 20, Version: "v2", Executable: testExe, Config: cfg}
	same := Info{PID: 10, Version: "v2", Executable: testExe, Config: cfg}
	for _, tc := range []struct {
		name        string
		peerErr     error
		openErr     error
		peer        peerCore
		exitOn      []syscall.Signal
		wantServe   bool
		wantErr     string
		wantSignals string
	}{
		{name: "nobody serves", peerErr: fmt.Errorf("dial: %w", fs.ErrNotExist), wantServe: true},
		{name: "a stale socket", peerErr: fmt.Errorf("dial: %w", syscall.ECONNREFUSED), wantServe: true},
		{name: "a socket that cannot be asked", peerErr: syscall.EACCES, wantErr: "cannot tell which process"},
		{name: "the same core", peer: peerCore{PID: 10, Executable: testExe, SameBinary: true, Info: &same}, wantSignals: "[]"},
		{name: "an upgrade", peer: peerCore{PID: 10, Executable: testExe}, exitOn: []syscall.Signal{syscall.SIGTERM},
			wantServe: true, wantSignals: "[terminated]"},
		{name: "a core that ignores SIGTERM", peer: peerCore{PID: 10, Executable: testExe}, exitOn: []syscall.Signal{syscall.SIGKILL},
			wantServe: true, wantSignals: "[terminated killed]"},
		{name: "a core that does not die", peer: peerCore{PID: 10, Executable: testExe}, wantErr: "did not exit after SIGKILL",
			wantSignals: "[terminated killed]"},
		{name: "another install", peer: peerCore{PID: 10, Executable: "/usr/local/bin/pleg-nri", Info: &same}, wantErr: "stop it first", wantSignals: "[]"},
		{name: "gone before it was opened", openErr: syscall.ESRCH, wantServe: true},
	} {
		proc := &fakeProcess{exitOn: map[syscall.Signal]bool{}}
		for _, s := range tc.exitOn {
			proc.exitOn[s] = true
		}
		opened := false
		tk := takeover{runDir: "/run/pleg-nri", self: self,
			peerPID: func(path string) (int, error) {
				if path != filepath.Join("/run/pleg-nri", front.CoreSocketName) {
					t.Errorf("%s: asked %s", tc.name, path)
				}
				return 10, tc.peerErr
			},
			open: func(pid int) (coreProcess, error) {
				opened = true
				if tc.openErr != nil {
					return nil, tc.openErr
				}
				return proc, nil
			},
			inspect: func(pid int) (peerCore, error) {
				if !opened {
					t.Errorf("%s: inspected before it was opened", tc.name)
				}
				return tc.peer, nil
			}}
		serve, err := tk.run(ctx)
		if serve != tc.wantServe || (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s: serve %v, %v; want %v, %q", tc.name, serve, err, tc.wantServe, tc.wantErr)
		}
		if got := fmt.Sprint(proc.signals); tc.wantSignals != "" && got != tc.wantSignals {
			t.Errorf("%s: signals %s, want %s", tc.name, got, tc.wantSignals)
		}
		if opened && tc.openErr == nil && !proc.closed {
			t.Errorf("%s: the process was left open", tc.name)
		}
	}
}

// TestSocketPeerPID: the pid of a unix socket's server is the kernel's: here, this process.
func TestSocketPeerPID(t *testing.T) {
	dir := testutil.ShortTempDir(t, "tk-")
	path := filepath.Join(dir, "s.sock")
	if _, err := PeerPID(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no socket: %v, want ErrNotExist", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pid, err := PeerPID(path)
	if err != nil || pid != os.Getpid() {
		t.Errorf("PeerPID = %d, %v; want %d", pid, err, os.Getpid())
	}
}

// TestRefuseSecond: no error while nothing serves the run directory's core socket (none, or a stale
// socket file); an error naming the run directory once something serves it, with the pid and version
// of core.json when it has one.
func TestRefuseSecond(t *testing.T) {
	runDir := testutil.ShortTempDir(t, "rs-")
	if err := RefuseSecond(runDir); err != nil {
		t.Errorf("nothing serves: %v", err)
	}
	sock := filepath.Join(runDir, front.CoreSocketName)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l.Close()
	if err := RefuseSecond(runDir); err != nil {
		t.Errorf("a stale socket: %v", err)
	}
	_ = os.Remove(sock)
	if l, err = net.Listen("unix", sock); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	err = RefuseSecond(runDir)
	if err == nil || !strings.Contains(err.Error(), "a pleg-nri core already serves "+runDir+": stop it first") {
		t.Errorf("a core serves, no core.json: %v", err)
	}
	if _, err := WriteInfo(runDir, Info{PID: 4242, Version: "v9"}); err != nil {
		t.Fatal(err)
	}
	err = RefuseSecond(runDir)
	if err == nil || !strings.Contains(err.Error(), "already serves "+runDir+" (pid 4242, version v9): stop it first") {
		t.Errorf("a core serves, with core.json: %v", err)
	}
}

// TestInspectPeer reads a /proc-like tree: the peer's executable without " (deleted)", whether it is
// the file this process runs, and core.json only when it names the peer.
func TestInspectPeer(t *testing.T) {
	root := t.TempDir()
	proc, runDir := filepath.Join(root, "proc"), filepath.Join(root, "run")
	bin := filepath.Join(root, "10-pleg-nri")
	for _, d := range []string{filepath.Join(proc, "self"), filepath.Join(proc, "10"), filepath.Join(proc, "11"), runDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(bin, []byte("new"), 0o755); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{"self": bin, "10": bin, "11": bin + " (deleted)"}
	for pid, target := range links {
		if err := os.Symlink(target, filepath.Join(proc, pid, "exe")); err != nil {
			t.Fatal(err)
		}
	}
	remove, err := WriteInfo(runDir, Info{PID: 10, Version: "v1", Executable: bin, Config: config.Default()})
	if err != nil {
		t.Fatal(err)
	}
	p, err := inspectPeer(proc, runDir, 10)
	if err != nil || p.Executable != bin || !p.SameBinary || p.Info == nil || p.Info.Version != "v1" || p.Info.Config != config.Default() {
		t.Errorf("the running binary's core: %+v, %v", p, err)
	}
	p, err = inspectPeer(proc, runDir, 11)
	if err != nil || p.Executable != bin || p.SameBinary || p.Info != nil {
		t.Errorf("a replaced binary's core (core.json names another pid): %+v, %v", p, err)
	}
	if _, err := inspectPeer(proc, runDir, 12); err == nil {
		t.Error("a process with no executable link: no error")
	}
	// core.json goes with its core, and only its own.
	if _, err := WriteInfo(runDir, Info{PID: 11}); err != nil {
		t.Fatal(err)
	}
	remove()
	if info, err := ReadInfo(runDir); err != nil || info.PID != 11 {
		t.Errorf("core 10 removed core 11's core.json: %+v, %v", info, err)
	}
}

// TestPidfdProcess: a real child process is signalled and waited for through its pidfd.
func TestPidfdProcess(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p, err := openProcess(cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		t.Skipf("no pidfd here: %v", err)
	}
	defer p.Close()
	if p.Wait(context.Background(), 100*time.Millisecond) {
		t.Fatal("Wait says a running process exited")
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !p.Wait(context.Background(), 10*time.Second) {
		t.Fatal("Wait did not see the process exit")
	}
	<-done
}

// TestTakeOverCoreOnTheRealSystem: the takeover as configurePreRegistered runs it, with the real pid
// lookups: no core serves the run directory, so this process serves; a socket whose server is this
// very process is refused (it cannot take over from itself).
func TestTakeOverCoreOnTheRealSystem(t *testing.T) {
	runDir := testutil.ShortTempDir(t, "to-")
	cfg := config.Default()
	cfg.RunDir = runDir
	serve, err := TakeOver(context.Background(), cfg, "v2")
	if err != nil || !serve {
		t.Fatalf("takeover of an empty run directory: serve %v, %v; want to serve", serve, err)
	}
	l, err := net.Listen("unix", filepath.Join(runDir, front.CoreSocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	if serve, err := TakeOver(context.Background(), cfg, "v2"); err == nil || serve {
		t.Errorf("takeover from this very process: serve %v, %v; want an error", serve, err)
	}
}

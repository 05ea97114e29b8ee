package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/runningcore"
	"github.com/pleg-nri/pleg-nri/eventbridge/front"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// nriLog records what NRI's runtime side logs (containerd's log, for a plugin's failures).
type nriLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *nriLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}
func (l *nriLog) Debugf(_ context.Context, f string, a ...any) { l.add(f, a...) }
func (l *nriLog) Infof(_ context.Context, f string, a ...any)  { l.add(f, a...) }
func (l *nriLog) Warnf(_ context.Context, f string, a ...any)  { l.add(f, a...) }
func (l *nriLog) Errorf(_ context.Context, f string, a ...any) { l.add(f, a...) }

func (l *nriLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// TestPreRegisteredTakeover (issue 56) runs the daemon's binary as containerd runs a pre-registered
// plugin: NRI's own runtime side (the adaptation containerd embeds) launches <plugins>/10-pleg-nri with
// <conf.d>/10-pleg-nri.conf, and, as containerd 2.4, never stops it. Each "containerd restart" is a new
// adaptation launching the plugin again while the core launched before still serves:
//   - the same file and configuration: the new instance leaves the old core the work, and says so in
//     the runtime's log;
//   - the binary replaced (an upgrade): the new instance stops the old core and serves (before, it
//     exited and the upgrade never took effect);
//   - a configuration change: the same;
//   - a bad configuration: refused, in the runtime's log, naming the key; the core goes on;
//   - another install's core (the host service's binary) serving the run directory: left alone, and
//     the refusal in the runtime's log.
func TestPreRegisteredTakeover(t *testing.T) {
	dir := testutil.ShortTempDir(t, "pt-")
	plugins, confs, runDir := filepath.Join(dir, "plugins"), filepath.Join(dir, "conf.d"), filepath.Join(dir, "run")
	for _, d := range []string{plugins, confs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin, err := os.ReadFile(daemonBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	// install writes the plugin as install.sh does: a new file renamed over the old.
	install := func() {
		path := filepath.Join(plugins, "10-pleg-nri")
		if err := os.WriteFile(path+".new", bin, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	configure := func(extra string) {
		conf := fmt.Sprintf("listen: unix://%s\ncontainerd-address: %s\nruntime-endpoint: unix://%s\nnri-socket: %s\nmetrics-address: \"\"\nstate-dir: %s\n%s",
			filepath.Join(runDir, "cri.sock"), filepath.Join(dir, "absent.sock"), filepath.Join(dir, "absent.sock"),
			filepath.Join(dir, "absent-nri.sock"), filepath.Join(dir, "state"), extra)
		if err := os.WriteFile(filepath.Join(confs, "10-pleg-nri.conf"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	logs := &nriLog{}
	nrilog.Set(logs)
	// containerd starts: a new adaptation launches the plugin (an earlier one is left as containerd 2.4
	// leaves its plugins: running). Each is stopped at the end (which kills the plugin it launched).
	n := 0
	restart := func() {
		n++
		sync := func(ctx context.Context, cb adaptation.SyncCB) error { _, err := cb(ctx, nil, nil); return err }
		update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
		a, err := adaptation.New("containerd", "v2.4.2", sync, update, adaptation.WithPluginPath(plugins),
			adaptation.WithPluginConfigPath(confs), adaptation.WithSocketPath(filepath.Join(dir, fmt.Sprintf("nri-%d.sock", n))))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := a.Start(); err != nil {
			t.Fatalf("adaptation %d: %v", n, err)
		}
		// Start returns once the plugin it launched synchronized, or failed to.
		t.Logf("containerd start %d: its plugins started in %s", n, time.Since(start).Round(time.Millisecond))
		t.Cleanup(a.Stop)
	}
	corePID := func() int {
		t.Helper()
		var pid int
		// Serving, and saying so in core.json (written just after the socket serves).
		err := testutil.Poll(context.Background(), 20*time.Second, "a core serving "+runDir, func() (bool, error) {
			var err error
			if pid, err = runningcore.PeerPID(filepath.Join(runDir, front.CoreSocketName)); err != nil {
				return false, err
			}
			info, err := runningcore.ReadInfo(runDir)
			return err == nil && info.PID == pid, err
		})
		if err != nil {
			t.Fatalf("%v\nNRI's log:\n%s", err, logs)
		}
		return pid
	}
	t.Cleanup(func() {
		if pid, err := runningcore.PeerPID(filepath.Join(runDir, front.CoreSocketName)); err == nil {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
		_ = front.Stop(runDir)
		nrilog.Set(nil)
	})

	install()
	configure("")
	restart()
	first := corePID()

	// The same binary and configuration: the old core goes on.
	restart()
	if pid := corePID(); pid != first {
		t.Errorf("the same binary and configuration: the core is %d, was %d (want it left the work)", pid, first)
	}
	if want := "desc = " + errLeftToRunningCore.Error(); !strings.Contains(logs.String(), want) {
		t.Errorf("NRI's log does not say %s:\n%s", want, logs)
	}

	// An upgrade: the new binary's instance takes over.
	install()
	restart()
	second := corePID()
	if second == first {
		t.Fatalf("after an upgrade the core is still %d\nNRI's log:\n%s", first, logs)
	}
	if testutil.Alive(first) {
		t.Errorf("the old core %d still runs after the takeover", first)
	}
	if info, err := runningcore.ReadInfo(runDir); err != nil || info.PID != second {
		t.Errorf("core.json after the takeover: %+v, %v", info, err)
	}

	// A configuration change: the same.
	configure("relist-period: 7s\n")
	restart()
	third := corePID()
	if info, err := runningcore.ReadInfo(runDir); third == second || err != nil || info.PID != third || info.Config.RelistPeriod.String() != "7s" {
		t.Errorf("after a configuration change: core %d (was %d), core.json %+v, %v", third, second, info, err)
	}

	// A bad configuration: refused in the runtime's log; the running core goes on.
	configure("relist_period: 7s\n")
	restart()
	if pid := corePID(); pid != third {
		t.Errorf("a bad configuration: the core is %d, was %d", pid, third)
	}
	// containerd 2.4.2 logs it so: failed to synchronize pre-installed NRI plugin "10-pleg-nri": rpc
	// error: code = Unknown desc = invalid NRI plugin configuration: unknown config key "relist_period"
	// (known keys: ...)
	if !strings.Contains(logs.String(), `failed to synchronize pre-installed NRI plugin "10-pleg-nri": rpc error: code = Unknown desc = invalid NRI plugin configuration: unknown config key "relist_period"`) {
		t.Errorf("NRI's log does not say the configuration was refused:\n%s", logs)
	}

	// Another install's core (a host service's binary) serves the run directory: the plugin leaves it
	// alone and refuses containerd's Configure, saying why.
	configure("relist-period: 7s\n")
	if err := syscall.Kill(third, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := testutil.Poll(context.Background(), 20*time.Second, "the core to stop", func() (bool, error) { return !testutil.Alive(third), nil }); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other", "pleg-nri")
	if err := os.MkdirAll(filepath.Dir(other), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	svc := exec.Command(other, "--config", filepath.Join(confs, "10-pleg-nri.conf"))
	if err := svc.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = svc.Wait(); close(exited) }()
	t.Cleanup(func() { _ = svc.Process.Signal(syscall.SIGTERM); <-exited })
	if pid := corePID(); pid != svc.Process.Pid {
		t.Fatalf("the host service's core is %d, want %d", pid, svc.Process.Pid)
	}
	restart()
	if pid := corePID(); pid != svc.Process.Pid {
		t.Errorf("another install's core: the core is %d, want the host service's %d left alone", pid, svc.Process.Pid)
	}
	if want := fmt.Sprintf(`desc = config key "run-dir": the run directory's core (pid %d) runs %q, not this install's`, svc.Process.Pid, other); !strings.Contains(logs.String(), want) {
		t.Errorf("NRI's log does not say %s:\n%s", want, logs)
	}
}

package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/pleg"
	"github.com/pleg-nri/pleg-nri/plugin"
)

// TestExitStatus: 0 on success, 2 for a usage error, 1 for any other failure, the error printed once.
func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{nil, 0},
		{usageError{errors.New("flag provided but not defined: -x")}, 2},
		{errors.Join(errors.New("wrapped"), usageError{errors.New("bad value")}), 2},
		{errors.New("listen: address already in use"), 1},
	} {
		var out bytes.Buffer
		if got := exitStatus(tc.err, &out); got != tc.code {
			t.Errorf("exitStatus(%v) = %d, want %d", tc.err, got, tc.code)
		}
		if tc.err != nil && out.String() != "pleg-nri: "+tc.err.Error()+"\n" {
			t.Errorf("printed %q for %v", out.String(), tc.err)
		}
	}
	if !errors.Is(usageError{io.EOF}, io.EOF) {
		t.Error("a usage error does not unwrap")
	}
}

// TestApp: the commands as a user types them, with their output and exit status.
func TestApp(t *testing.T) {
	run := func(args ...string) (string, int) {
		t.Helper()
		var out, errOut bytes.Buffer
		err := newApp(&out, &errOut, func(string) string { return "" }).Run(context.Background(), append([]string{"pleg-nri"}, args...))
		code := exitStatus(err, &errOut)
		return out.String() + errOut.String(), code
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"version"}, 0, "pleg-nri " + version},
		{[]string{"help", "events"}, 0, "pleg-nri events [flags]"},
		{[]string{"events", "--help"}, 0, "--runtime-endpoint"},
		{[]string{"--help"}, 0, "kubelet-config"},
		{[]string{"--relist_period", "5s"}, 2, "flag provided but not defined"},
		{[]string{"serve"}, 2, `unexpected argument "serve"`},
		{[]string{"events", "--listen", "/x"}, 2, "flag provided but not defined"},
		{[]string{"events", "--type", "exited"}, 2, "--type"},
		{[]string{"stop-front", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"stop-front", "--run-dir", t.TempDir()}, 0, "front stopped"},
		{[]string{"kubelet-config", "--config", filepath.Join(t.TempDir(), "missing.yaml")}, 1, "--config"},
		{[]string{"kubelet-config", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"front", "--run-dir", "relative"}, 2, "--run-dir"},
	} {
		out, code := run(tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("pleg-nri %s: status %d, output %q; want %d and %q", strings.Join(tc.args, " "), code, out, tc.code, tc.want)
		}
	}
	if out, _ := run("--help"); strings.Contains(out, "the front:") {
		t.Errorf("the hidden front command is listed:\n%s", out)
	}
}

// TestConfigurePreRegistered: the configuration containerd sends is applied; a bad one stops the
// process with an error; then the takeover decides (takeover_test.go): with a core to leave the work
// to, nothing is served, and its error is the process's; an ended context is no error and no work.
func TestConfigurePreRegistered(t *testing.T) {
	ctx := context.Background()
	base := config.Default()
	base.RunDir = testutil.ShortTempDir(t, "pr-")
	send := func(data string) <-chan plugin.Configuration {
		ch := make(chan plugin.Configuration, 1)
		ch <- plugin.Configuration{Data: []byte(data)}
		return ch
	}
	var takeoverCfg config.Config
	serveAll := func(_ context.Context, cfg config.Config) (bool, error) { takeoverCfg = cfg; return true, nil }
	cfg, serve, err := configurePreRegistered(ctx, base, send("relist-period: 7s\n"), serveAll)
	if err != nil || !serve || time.Duration(cfg.RelistPeriod) != 7*time.Second {
		t.Errorf("a good configuration: %v, serve %v, %v", time.Duration(cfg.RelistPeriod), serve, err)
	}
	if time.Duration(takeoverCfg.RelistPeriod) != 7*time.Second {
		t.Errorf("the takeover decided with relist-period %s, want the configuration's 7s", takeoverCfg.RelistPeriod)
	}
	if _, serve, err := configurePreRegistered(ctx, base, send("relist_period: 7s\n"), serveAll); err == nil || serve {
		t.Errorf("a bad configuration: serve %v, %v", serve, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, serve, err := configurePreRegistered(cctx, base, make(chan plugin.Configuration), serveAll); err != nil || serve {
		t.Errorf("an ended context: serve %v, %v", serve, err)
	}
	leave := func(context.Context, config.Config) (bool, error) { return false, nil }
	if _, serve, err := configurePreRegistered(ctx, base, send("relist-period: 7s\n"), leave); err != nil || serve {
		t.Errorf("a core to leave the work to: serve %v, %v", serve, err)
	}
	refuse := func(context.Context, config.Config) (bool, error) { return false, errors.New("another install") }
	if _, serve, err := configurePreRegistered(ctx, base, send(""), refuse); err == nil || serve || !strings.Contains(err.Error(), "another install") {
		t.Errorf("a core of another install: serve %v, %v", serve, err)
	}
}

// TestPreRegisteredBadConfigurationFails (issue 56): a pre-registered plugin given a configuration it
// cannot use refuses it to containerd in its answer to Synchronize (containerd logs the error and stops
// the plugin) and the daemon stops with the error, naming the key, at once: it does not run with the
// defaults.
func TestPreRegisteredBadConfigurationFails(t *testing.T) {
	ctx := context.Background()
	base := config.Default()
	base.RunDir = testutil.ShortTempDir(t, "pr-")
	nri, err := newPlugin(base, true, func() *pleg.PLEG { return nil }, plugin.NopMetrics{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nri.Configure(ctx, "relist_period: 7s\n", "containerd", "v2.4.2"); err != nil {
		t.Errorf("Configure's answer to containerd: %v; want the refusal in Synchronize's", err)
	}
	if _, err := nri.Synchronize(ctx, nil, nil); err == nil || !strings.Contains(err.Error(), `"relist_period"`) {
		t.Errorf("Synchronize's answer to containerd: %v; want the error naming the key", err)
	}
	start := time.Now()
	_, serve, err := configurePreRegistered(ctx, base, nri.Configured(), func(context.Context, config.Config) (bool, error) { return true, nil })
	if err == nil || serve || !strings.Contains(err.Error(), `unknown config key "relist_period"`) {
		t.Errorf("configurePreRegistered: serve %v, %v; want the configuration's error", serve, err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("the daemon took %s to give up on the bad configuration", waited)
	}
}

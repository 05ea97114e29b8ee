package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/eventbridge/front"
	"github.com/pleg-nri/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
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
// process with an error; a core already serving the run directory leaves the work to it; an ended
// context is no error and no work.
func TestConfigurePreRegistered(t *testing.T) {
	ctx := context.Background()
	runDir := testutil.ShortTempDir(t, "pr-")
	base := config.Default()
	base.RunDir = runDir
	send := func(data string) <-chan []byte {
		ch := make(chan []byte, 1)
		ch <- []byte(data)
		return ch
	}
	cfg, serve, err := configurePreRegistered(ctx, base, send("relist-period: 7s\n"))
	if err != nil || !serve || time.Duration(cfg.RelistPeriod) != 7*time.Second {
		t.Errorf("a good configuration: %v, serve %v, %v", time.Duration(cfg.RelistPeriod), serve, err)
	}
	if _, serve, err := configurePreRegistered(ctx, base, send("relist_period: 7s\n")); err == nil || serve {
		t.Errorf("a bad configuration: serve %v, %v", serve, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, serve, err := configurePreRegistered(cctx, base, make(chan []byte)); err != nil || serve {
		t.Errorf("an ended context: serve %v, %v", serve, err)
	}
	l, err := net.Listen("unix", filepath.Join(runDir, front.CoreSocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, serve, err := configurePreRegistered(ctx, base, send("relist-period: 7s\n")); err != nil || serve {
		t.Errorf("a core already serving: serve %v, %v", serve, err)
	}
}

package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// WrapRuncDelete restarts containerd with a runc wrapper (name, in the environment's directory, which
// containerd in Docker sees at the same path) that runs the shell command beforeDelete before each
// `runc delete`: containerd's exit handling, which it finishes before it updates the exited container's
// CRI status. containerd's own runc comes back, with a restart, when the test ends.
func (e *Env) WrapRuncDelete(t testing.TB, name, beforeDelete string) {
	t.Helper()
	ctx := context.Background()
	wrapper := filepath.Join(e.Dir, name)
	if err := os.WriteFile(wrapper, []byte(runcWrapper(e.RuncPath(), beforeDelete)), 0o755); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(e.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	wrapped := strings.Replace(string(orig), `BinaryName = "`+e.RuncPath()+`"`, `BinaryName = "`+wrapper+`"`, 1)
	if wrapped == string(orig) {
		t.Fatal("no runc BinaryName in containerd's config")
	}
	restart := func(config []byte) {
		if err := e.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(e.ConfigPath, config, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := e.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	restart([]byte(wrapped))
	t.Cleanup(func() { restart(orig) })
}

// runcWrapper is a shell script that runs beforeDelete when an argument is delete, then runc.
func runcWrapper(runc, beforeDelete string) string {
	return fmt.Sprintf("#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = delete ] && { %s; } && break; done\nexec %s \"$@\"\n",
		beforeDelete, runc)
}

// SlowRuncDelete is WrapRuncDelete with a `runc delete` that takes d more (whole seconds are exact):
// containerd's exit handling slow, as under IO pressure.
func (e *Env) SlowRuncDelete(t testing.TB, d time.Duration) {
	t.Helper()
	e.WrapRuncDelete(t, "slow-runc", fmt.Sprintf("sleep %g", d.Seconds()))
}

// RuncGate holds containerd's exit handling at `runc delete` while it is closed (GateRuncDelete):
// containerd then shows an exited container RUNNING.
type RuncGate struct {
	t    testing.TB
	path string
}

// GateRuncDelete is WrapRuncDelete with a `runc delete` that waits while the returned gate is closed.
// The gate starts open, and opens when the test ends (before containerd's restart).
func (e *Env) GateRuncDelete(t testing.TB) *RuncGate {
	t.Helper()
	g := &RuncGate{t: t, path: filepath.Join(e.Dir, "delete-gate")}
	g.Open()
	e.WrapRuncDelete(t, "gated-runc", fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done", g.path))
	t.Cleanup(g.Open)
	return g
}

// Close closes the gate: the next `runc delete` waits.
func (g *RuncGate) Close() {
	g.t.Helper()
	if err := os.Remove(g.path); err != nil {
		g.t.Fatal(err)
	}
}

// Open opens the gate: a `runc delete` waiting goes on. It may be called again (the cleanups do).
func (g *RuncGate) Open() {
	g.t.Helper()
	if err := os.WriteFile(g.path, nil, 0o644); err != nil {
		g.t.Error(err)
	}
}

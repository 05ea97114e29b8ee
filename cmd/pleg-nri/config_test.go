package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

func TestLoadConfigFlagsOverrideFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("relist-period: 5s\nplugin-name: from-file\nlog-level: debug\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := loadConfig([]string{"--config", path, "--relist-period", "7s", "--log-level=info"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RelistPeriod != config.Duration(7*time.Second) || cfg.PluginName != "from-file" || cfg.LogLevel != "info" {
		t.Errorf("cfg = %+v", cfg)
	}
	if _, _, err := loadConfig([]string{"--relist-period", "soon"}); err == nil {
		t.Error("a bad --relist-period was accepted")
	}
	if _, _, err := loadConfig([]string{"--config", filepath.Join(t.TempDir(), "missing.yaml")}); err == nil {
		t.Error("a missing config file was accepted")
	}
}

// TestRetiredFlagIgnored: a daemon started with a retired key's flag (a unit written for an earlier
// release) starts with a warning, the flag ignored, and does not list it in its help.
func TestRetiredFlagIgnored(t *testing.T) {
	buf := testutil.CaptureLog(t)
	cfg, _, err := loadConfig([]string{"--read-source", "state", "--relist-period", "7s"})
	if err != nil {
		t.Fatalf("a daemon with --read-source: %v", err)
	}
	if cfg.RelistPeriod != config.Duration(7*time.Second) {
		t.Errorf("cfg = %+v", cfg)
	}
	if out := buf.String(); !strings.Contains(out, "--read-source") || !strings.Contains(out, "retired") {
		t.Errorf("log %q: want a warning naming --read-source as retired", out)
	}
	var help bytes.Buffer
	app := newApp(&help, io.Discard, func(string) string { return "" })
	if err := app.Run(context.Background(), []string{"pleg-nri", "--help"}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(help.String(), "read-source") || !strings.Contains(help.String(), "read-freshness") {
		t.Errorf("--help lists the retired flag, or not the others:\n%s", help.String())
	}
}

package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
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

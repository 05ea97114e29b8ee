package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPrometheusRules: promtool (built from the Go module proxy by make promtool) checks the rules
// file and runs its unit tests (deploy/prometheus/pleg-nri-rules.test.yaml).
func TestPrometheusRules(t *testing.T) {
	p := os.Getenv("PLEG_NRI_PROMTOOL")
	if p == "" {
		p = filepath.Join(cacheDir(), "promtool-v0.316.0", "promtool")
	}
	_, err := os.Stat(p)
	need(t, err == nil, "no promtool at %s (make promtool)", p)
	dir := filepath.Join(repoRoot(), "deploy", "prometheus")
	out := run(t, p, "check", "rules", filepath.Join(dir, "pleg-nri-rules.yaml"))
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules:\n%s", out)
	}
	t.Log(strings.TrimSpace(out))
	out = run(t, p, "test", "rules", filepath.Join(dir, "pleg-nri-rules.test.yaml"))
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules:\n%s", out)
	}
}

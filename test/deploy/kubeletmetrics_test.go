package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestKubeletMetricNames: the kubelet metrics that the alerts, the dashboard and docs/operations.md
// name are the kubelet's, in every supported kubelet (1.35, 1.36, 1.37): read from its source on the
// Go module proxy.
func TestKubeletMetricNames(t *testing.T) {
	var used []string
	seen := map[string]bool{}
	for _, f := range []string{"deploy/prometheus/pleg-nri-rules.yaml", "deploy/grafana/pleg-nri-dashboard.json", "docs/operations.md"} {
		data, err := os.ReadFile(filepath.Join(repoRoot(), f))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range regexp.MustCompile(`\bkubelet_[a-z0-9_]+`).FindAllString(string(data), -1) {
			if !seen[n] {
				seen[n] = true
				used = append(used, n)
			}
		}
	}
	if len(used) == 0 {
		t.Fatal("no kubelet metric named anywhere")
	}
	for _, v := range []string{"v1.35.4", "v1.36.3", "v1.37.2"} {
		cmd := exec.Command("go", "mod", "download", "-json", "k8s.io/kubernetes@"+v)
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
		out, err := cmd.Output()
		need(t, err == nil, "go mod download k8s.io/kubernetes@%s: %v", v, err)
		var mod struct{ Dir string }
		if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
			t.Fatalf("go mod download k8s.io/kubernetes@%s: %v %s", v, err, out)
		}
		src, err := os.ReadFile(filepath.Join(mod.Dir, "pkg/kubelet/metrics/metrics.go"))
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`KubeletSubsystem\s*=\s*"kubelet"`).Match(src) {
			t.Fatalf("kubelet %s: the metrics' subsystem is not kubelet", v)
		}
		for _, n := range used {
			if !strings.Contains(string(src), `"`+strings.TrimPrefix(n, "kubelet_")+`"`) {
				t.Errorf("kubelet %s has no metric %s", v, n)
			}
		}
	}
}

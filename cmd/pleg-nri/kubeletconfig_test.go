package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunKubeletConfig: the command says whether it changed anything (the chart's node script restarts
// the kubelet only then).
func TestRunKubeletConfig(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte("kind: KubeletConfiguration\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"changed", "unchanged"} {
		var out, errb bytes.Buffer
		err := runKubeletConfig([]string{"--config", config, "--kubeadm-flags", filepath.Join(dir, "none.env"),
			"--container-runtime-endpoint", "unix:///run/pleg-nri/cri.sock", "--evented-pleg", "true"}, &out, &errb)
		if err != nil || strings.TrimSpace(out.String()) != want {
			t.Errorf("printed %q (%v), want %q", out.String(), err, want)
		}
	}
}

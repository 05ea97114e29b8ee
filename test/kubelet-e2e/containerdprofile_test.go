package kubelete2e

import (
	"fmt"
	"os"
	"sort"
)

// containerdProfileEnv makes the harness open containerd's metrics and debug socket
// (harness.Options.Profile): BenchmarkNodeCost then records the CRI calls containerd served and profiles
// it (issue 25, "measure first"). make bench-node sets it.
const containerdProfileEnv = "PLEG_NRI_CONTAINERD_PROFILE"

// sortedKeys returns m's keys, by value, most first.
func sortedKeys[V int | float64](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	return keys
}

// profileDir is where the profiles of a run go: outside the tree, kept after the run for go tool pprof.
func profileDir(t interface{ Fatal(...any) }) string {
	dir := fmt.Sprintf("%s/pleg-nri-node-profiles-%s", os.TempDir(), kubeletVersion)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

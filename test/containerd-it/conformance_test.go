package containerdit

import (
	"bytes"
	"context"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/conformance"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// conformanceOptions run the suite's short version on the harness: host-network pods in the harness's
// cgroup parent and log directory, 10 containers of load, 20 pods a slow-consumer phase (160 events: more
// than containerd's queue of 100 per subscriber and the HTTP/2 window hold), the harness's
// containerd restarted for the restart check, and deadlines far above what any event takes here (the
// suite asserts no timing but the slow consumer's loose bound).
func conformanceOptions(endpoint string) conformance.Options {
	return conformance.Options{
		Endpoint:  endpoint,
		Image:     harness.BusyboxImage,
		Load:      10,
		SlowPods:  20,
		EventWait: 30 * time.Second,
		RestartRuntime: func(ctx context.Context) error {
			return env.Restart(ctx)
		},
		PodConfig: func(name string) *runtimeapi.PodSandboxConfig {
			cfg := env.PodConfig(name)
			cfg.Hostname = "" // runc refuses a hostname in the host's UTS namespace
			cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}
			return cfg
		},
	}
}

// runConformance runs the suite against endpoint, logs its table, and fails the test if the run could
// not run or left a pod behind (on any endpoint: the cleanup is the suite's own promise).
func runConformance(t *testing.T, endpoint string) *conformance.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	opts := conformanceOptions(endpoint)
	rep, err := conformance.Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("conformance against %s:\n%s", endpoint, table.String())
	if rep.Cleanup != "" {
		t.Errorf("the suite's cleanup failed: %s", rep.Cleanup)
	}
	lctx, lcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer lcancel()
	list, err := newCRI(t, env.Address).rt.ListPodSandbox(lctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{conformance.RunLabel: rep.RunID}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("the suite left %d pods of run %s behind", len(list.Items), rep.RunID)
	}
	return rep
}

// TestConformancePlegNRI (issue 61): pleg-nri's endpoint passes every check of the conformance suite
// that is built (the rest skip, each saying why).
func TestConformancePlegNRI(t *testing.T) {
	logOnFailure(t)
	if conformance.DefaultImage != harness.BusyboxImage {
		t.Errorf("pleg-nri conformance's default image %s is not the harness's busybox %s", conformance.DefaultImage, harness.BusyboxImage)
	}
	p := startPlegNRI(t)
	rep := runConformance(t, "unix://"+p.Socket)
	for _, r := range rep.Results {
		if r.Outcome == conformance.Fail {
			t.Errorf("%s: %s (%s)", r.ID, r.Failure, r.Name)
		}
	}
	if rep.Count(conformance.Pass) == 0 {
		t.Error("no check passed")
	}
}

// TestConformanceContainerd (issue 61): containerd's own stream under the same suite, for
// docs/conformance.md; logged, not asserted (its failures are containerd's known faults), but the run
// must complete and clean up.
func TestConformanceContainerd(t *testing.T) {
	logOnFailure(t)
	rep := runConformance(t, "unix://"+env.Address)
	if len(rep.Results) != len(conformance.Checks()) {
		t.Errorf("%d results, want %d", len(rep.Results), len(conformance.Checks()))
	}
}

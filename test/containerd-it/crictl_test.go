package containerdit

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// TestCrictlThroughPlegNRI runs crictl's whole lifecycle (runp, create, start, exec, logs, inspect,
// stats, ps, images, stop, rm, stopp, rmp) against pleg-nri's endpoint and against containerd
// directly: every command succeeds on both and gives the same results, ids and times aside.
func TestCrictlThroughPlegNRI(t *testing.T) {
	logOnFailure(t)
	p := startPlegNRI(t)
	direct := crictlLifecycle(t, "unix://"+env.Address)
	proxied := crictlLifecycle(t, "unix://"+p.Socket)
	for step, want := range direct {
		if got := proxied[step]; got != want {
			t.Errorf("crictl %s differs through pleg-nri:\n--- direct:\n%s\n--- through pleg-nri:\n%s", step, want, got)
		}
	}
	for _, step := range []string{"exec", "logs", "inspect", "images"} {
		t.Logf("crictl %s through pleg-nri: %q", step, proxied[step])
		if proxied[step] == "" {
			t.Errorf("crictl %s printed nothing", step)
		}
	}
	if len(proxied) != len(direct) {
		t.Errorf("%d steps through pleg-nri, %d direct", len(proxied), len(direct))
	}
}

// crictlLifecycle runs the lifecycle against endpoint and returns each step's normalized output.
func crictlLifecycle(t *testing.T, endpoint string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	pod := env.PodConfig("crictl")
	ctr := containerConfig("app", "echo started; sleep 3600")
	writeJSON(t, filepath.Join(dir, "pod.json"), pod)
	writeJSON(t, filepath.Join(dir, "ctr.json"), ctr)
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(env.BinDir, "crictl"), append([]string{"--runtime-endpoint", endpoint,
			"--image-endpoint", endpoint, "--timeout", "20s"}, args...)...)
		cmd.Env = append(os.Environ(), "CRI_CONFIG_FILE=/dev/null")
		out, err := cmd.Output()
		if err != nil {
			stderr := ""
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("crictl %s against %s: %v\n%s%s", strings.Join(args, " "), endpoint, err, out, stderr)
		}
		return strings.TrimSpace(string(out))
	}
	res := map[string]string{}
	podID := run("runp", filepath.Join(dir, "pod.json"))
	ctrID := run("create", podID, filepath.Join(dir, "ctr.json"), filepath.Join(dir, "pod.json"))
	run("start", ctrID)
	res["exec"] = run("exec", ctrID, "sh", "-c", "echo out; echo $((6*7))")
	res["logs"] = run("logs", ctrID)
	var inspect struct {
		Status struct {
			State    string
			Metadata struct{ Name string }
			Image    struct{ Image string }
			Labels   map[string]string
		}
	}
	if err := json.Unmarshal([]byte(run("inspect", ctrID)), &inspect); err != nil {
		t.Fatalf("crictl inspect: %v", err)
	}
	res["inspect"] = inspect.Status.State + " " + inspect.Status.Metadata.Name + " " + inspect.Status.Image.Image
	// containerd reports usageNanoCores once its stats collector has two samples of the container
	// (stats_collect_period, 1 s; later on a loaded machine): wait for it, so both sides show it.
	var stats string
	if err := testutil.PollEvery(t.Context(), 30*time.Second, time.Second, "crictl stats to show usageNanoCores", func() (bool, error) {
		stats = run("stats", "--id", ctrID, "-o", "json")
		return strings.Contains(stats, `"usageNanoCores"`), nil
	}); err != nil {
		t.Fatalf("%v: crictl stats printed\n%s", err, stats)
	}
	res["stats"] = normalize(stats, ctrID, podID, `"(value|timestamp)":\s*"?[0-9]+"?`)
	res["ps"] = normalize(run("ps", "--pod", podID, "-o", "json"), ctrID, podID, `"(createdAt)":\s*"[0-9]+"`)
	res["pods"] = normalize(run("pods", "--id", podID, "-o", "json"), ctrID, podID, `"(createdAt|uid)":\s*"[0-9a-f]+"`)
	res["images"] = run("images")
	run("stop", "--timeout", "1", ctrID)
	run("rm", ctrID)
	run("stopp", podID)
	run("rmp", podID)
	res["ps-after"] = run("ps", "-a", "--pod", podID, "-q")
	return res
}

// normalize replaces ids and volatile fields, so two runs of the same steps compare equal. crictl
// prints JSON with protojson, which puts one or two spaces after a colon depending on a hash of the
// binary (on purpose, so that nobody compares its bytes): the patterns take either, and the two runs
// are of the same crictl.
func normalize(s, ctrID, podID, volatile string) string {
	s = strings.ReplaceAll(s, ctrID, "<ctr>")
	s = strings.ReplaceAll(s, podID, "<pod>")
	s = regexp.MustCompile(`"(io.kubernetes.pod.name|plegit/test)":\s*"[^"]*"`).ReplaceAllString(s, `"$1": "<name>"`)
	s = regexp.MustCompile(`plegit_crictl_[0-9a-f]+`).ReplaceAllString(s, "<logdir>")
	return regexp.MustCompile(volatile).ReplaceAllString(s, `"$1": <v>`)
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

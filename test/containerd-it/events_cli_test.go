package containerdit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// cliProc is a command whose standard output is collected while it runs.
type cliProc struct {
	name string
	cmd  *exec.Cmd
	// mu guards out (written by the command through Write).
	mu   sync.Mutex
	out  bytes.Buffer
	errb bytes.Buffer
	done chan error
}

func (p *cliProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *cliProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// startCLI starts bin with args and extra environment; it is killed when the test ends if still running.
func startCLI(t *testing.T, name, bin string, extraEnv []string, args ...string) *cliProc {
	t.Helper()
	p := &cliProc{name: name, done: make(chan error, 1)}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(append(os.Environ(), "CRI_CONFIG_FILE=/dev/null"), extraEnv...)
	p.cmd.Stdout, p.cmd.Stderr = p, &p.errb
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s (%s) printed:\n%s\nstderr:\n%s", name, strings.Join(args, " "), p.output(), p.errb.String())
		}
	})
	return p
}

// interrupt ends the command with SIGINT and fails the test unless it exits 0 (as on Ctrl-C).
func (p *cliProc) interrupt(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Errorf("%s exited with %v after SIGINT; stderr:\n%s", p.name, err, p.errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("%s did not exit within 30s of SIGINT", p.name)
	}
}

// jsonEvents decodes a stream of crictl-style JSON events.
func jsonEvents(t *testing.T, name, out string) []*runtimeapi.ContainerEventResponse {
	t.Helper()
	var evs []*runtimeapi.ContainerEventResponse
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		ev := &runtimeapi.ContainerEventResponse{}
		if err := protojson.Unmarshal(raw, ev); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, raw)
		}
		evs = append(evs, ev)
	}
	return evs
}

// without leaves out the events of the objects ids names.
func without(evs []*runtimeapi.ContainerEventResponse, ids map[string]bool) []*runtimeapi.ContainerEventResponse {
	var out []*runtimeapi.ContainerEventResponse
	for _, ev := range evs {
		if !ids[ev.ContainerId] {
			out = append(out, ev)
		}
	}
	return out
}

// ofPods keeps the events whose pod is one of names.
func ofPods(evs []*runtimeapi.ContainerEventResponse, names ...string) []*runtimeapi.ContainerEventResponse {
	var out []*runtimeapi.ContainerEventResponse
	for _, ev := range evs {
		for _, n := range names {
			if ev.GetPodSandboxStatus().GetMetadata().GetName() == n {
				out = append(out, ev)
			}
		}
	}
	return out
}

// TestEventsCommand runs `pleg-nri events` in every format and with every filter against pleg-nri's
// endpoint and against containerd's, next to `crictl events`, while pods run, exit and are removed.
// Against containerd, its JSON is crictl's, event for event; through pleg-nri, the filters keep exactly
// the events they name.
func TestEventsCommand(t *testing.T) {
	logOnFailure(t)
	p := startPlegNRI(t)
	plegEP, ctrdEP := "unix://"+p.Socket, "unix://"+env.Address
	crictl := filepath.Join(env.BinDir, "crictl")
	const podA, podB, warm, otherNS = "evcli-a", "evcli-b", "evcli-warm", "evcli-other"
	procs := map[string]*cliProc{
		// The endpoint from the environment, as crictl reads it.
		"json": startCLI(t, "pleg-nri events -o json", plegNRIBinary, []string{"CONTAINER_RUNTIME_ENDPOINT=" + plegEP},
			"events", "-o", "json", "--pod", podA+","+warm),
		"containerd-json": startCLI(t, "pleg-nri events on containerd", plegNRIBinary, []string{"CONTAINER_RUNTIME_ENDPOINT=/nonexistent.sock"},
			"events", "--runtime-endpoint", ctrdEP, "-o", "json", "--pod", podA, "--pod", warm),
		"crictl": startCLI(t, "crictl events", crictl, nil, "--runtime-endpoint", ctrdEP, "events", "-o", "json"),
		"template": startCLI(t, "pleg-nri events -o go-template", plegNRIBinary, nil, "events", "-r", plegEP, "-o", "go-template",
			"--template", "{{.containerEventType}} {{.containerId}} {{.podSandboxStatus.metadata.name}}", "--type", "stopped", "--namespace", harness.PodNamespace),
		"yaml":  startCLI(t, "pleg-nri events -o yaml", plegNRIBinary, nil, "events", "-r", plegEP, "-o", "yaml", "--type", "deleted", "--pod", podA+","+warm),
		"table": startCLI(t, "pleg-nri events", plegNRIBinary, nil, "events", "-r", plegEP),
	}
	c := newCRI(t, p.Socket)

	// Every command is subscribed once each has printed the first event its filter keeps of a warm-up
	// pod (then it was subscribed before that pod started): warm-up pods run one after the other until
	// one is seen so by all, and the comparisons start with it (earlier ones are left out: a command
	// that subscribed during one printed only its end).
	var warmID string
	earlier := map[string]bool{}
	for attempt := 1; ; attempt++ {
		warmID, _ = c.runPod(warm)
		c.stopPod(warmID)
		c.removePod(warmID)
		late := waitSubscribed(procs, warmID)
		if late == "" {
			break
		}
		if attempt == 10 {
			t.Fatalf("%s printed none of the first events of 10 warm-up pods: it never subscribed", late)
		}
		t.Logf("warm-up pod %d: %s subscribed after its start; another one", attempt, late)
		earlier[warmID] = true
	}

	aID, aCfg := c.runPod(podA)
	bID := runPodIn(t, c, podB, otherNS)
	ctrA := c.create(aID, aCfg, containerConfig("app", "exit 3"))
	c.start(ctrA)
	c.waitState(ctrA, runtimeapi.ContainerState_CONTAINER_EXITED)
	for _, id := range []string{aID, bID} {
		c.stopPod(id)
		c.removePod(id)
	}
	waitPrinted(t, procs, aID)
	for name, pr := range procs {
		if name != "crictl" { // crictl events exits 1 on SIGINT ("interrupted: context canceled")
			pr.interrupt(t)
		}
	}

	// On containerd's socket, pleg-nri events -o json is crictl events -o json, event for event.
	// crictl v1.36 is built with cri-api v0.36, whose Signal enum names lack the SIGNAL_ prefix of
	// v0.37 (pleg-nri's): the same value, another name.
	crictlOut := regexp.MustCompile(`("stopSignal":\s*")(SIG)`).ReplaceAllString(procs["crictl"].output(), "${1}SIGNAL_$2")
	crictlEvs := without(ofPods(jsonEvents(t, "crictl", crictlOut), podA, warm), earlier)
	oursOnCtrd := without(jsonEvents(t, "pleg-nri events on containerd", procs["containerd-json"].output()), earlier)
	if len(oursOnCtrd) != len(crictlEvs) || len(crictlEvs) == 0 {
		t.Errorf("on containerd: pleg-nri events printed %d events of the pods, crictl %d", len(oursOnCtrd), len(crictlEvs))
	}
	for i := range min(len(oursOnCtrd), len(crictlEvs)) {
		if !proto.Equal(oursOnCtrd[i], crictlEvs[i]) {
			t.Errorf("on containerd, event %d: pleg-nri events printed\n%v\ncrictl printed\n%v", i, oursOnCtrd[i], crictlEvs[i])
		}
	}

	// Through pleg-nri: the pod filter keeps both pods' whole lifecycles and nothing else.
	type ev struct {
		id  string
		typ runtimeapi.ContainerEventType
	}
	var got []ev
	for _, e := range without(jsonEvents(t, "pleg-nri events -o json", procs["json"].output()), earlier) {
		got = append(got, ev{e.ContainerId, e.ContainerEventType})
	}
	const (
		created = runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
		started = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
		stopped = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
		deleted = runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT
	)
	want := []ev{{warmID, created}, {warmID, started}, {warmID, stopped}, {warmID, deleted},
		{aID, created}, {aID, started}, {ctrA, created}, {ctrA, started}, {ctrA, stopped}, {aID, stopped}, {ctrA, deleted}, {aID, deleted}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("pleg-nri events --pod %s,%s printed\n%v\nwant\n%v", podA, warm, got, want)
	}

	// --type stopped --namespace: the STOPPED events of the test namespace's pods, none of pod B's.
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(procs["template"].output()), "\n") {
		if f := strings.Fields(l); len(f) == 3 && !earlier[f[1]] && (f[2] == warm || f[2] == podA || f[2] == podB) {
			lines = append(lines, l)
		}
	}
	wantLines := []string{"CONTAINER_STOPPED_EVENT " + warmID + " " + warm, "CONTAINER_STOPPED_EVENT " + ctrA + " " + podA,
		"CONTAINER_STOPPED_EVENT " + aID + " " + podA}
	if strings.Join(lines, "\n") != strings.Join(wantLines, "\n") {
		t.Errorf("go-template --type stopped --namespace %s printed\n%s\nwant\n%s", harness.PodNamespace, strings.Join(lines, "\n"), strings.Join(wantLines, "\n"))
	}

	// -o yaml --type deleted: one document per DELETED of the pods.
	var deletedIDs []string
	for _, doc := range strings.Split(procs["yaml"].output(), "---\n")[1:] {
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("yaml: %v\n%s", err, doc)
		}
		e := &runtimeapi.ContainerEventResponse{}
		if err := protojson.Unmarshal(js, e); err != nil {
			t.Fatalf("yaml: %v\n%s", err, doc)
		}
		if e.ContainerEventType != deleted {
			t.Errorf("yaml --type deleted printed a %s", e.ContainerEventType)
		}
		if !earlier[e.ContainerId] {
			deletedIDs = append(deletedIDs, e.ContainerId)
		}
	}
	if fmt.Sprint(deletedIDs) != fmt.Sprint([]string{warmID, ctrA, aID}) {
		t.Errorf("yaml --type deleted printed the DELETED of %v, want %v", deletedIDs, []string{warmID, ctrA, aID})
	}

	// The table, unfiltered: both namespaces, the exit code.
	table := procs["table"].output()
	for _, s := range []string{otherNS + "/" + podB, harness.PodNamespace + "/" + podA, "STOPPED", "EXITED  3"} {
		if !strings.Contains(table, s) {
			t.Errorf("the table has no %q:\n%s", s, table)
		}
	}
}

// waitPrinted waits until every command has printed the last event it shows of the pod whose sandbox
// id is id: the DELETED of the sandbox, or its STOPPED for the command that keeps only STOPPED events.
func waitPrinted(t *testing.T, procs map[string]*cliProc, id string) {
	t.Helper()
	if name, err := waitEach(procs, 30*time.Second, printed(id, false)); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// waitSubscribed waits (up to 10 s) until every command printed the first event its filter keeps of pod
// id, and returns the name of one that did not ("" when all did).
func waitSubscribed(procs map[string]*cliProc, id string) string {
	name, _ := waitEach(procs, 10*time.Second, printed(id, true))
	return name
}

// waitEach waits, up to timeout for each, until every command's output satisfies its condition; it
// returns the name of the first that did not, and why.
func waitEach(procs map[string]*cliProc, timeout time.Duration, done map[string]func(string) bool) (string, error) {
	for name, p := range procs {
		err := harness.WaitFor(context.Background(), timeout, name+"'s output", func() (bool, error) {
			return done[name](p.output()), nil
		})
		if err != nil {
			return name, err
		}
	}
	return "", nil
}

// printed gives, per command, whether its output holds the first (first) or the last event it shows of
// the pod whose sandbox id is id: the sandbox's CREATED or DELETED, and for the commands that keep only
// STOPPED or only DELETED events, that one event.
func printed(id string, first bool) map[string]func(string) bool {
	typ, word := runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT, " DELETED "
	if first {
		typ, word = runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT, " CREATED "
	}
	jsonHas := func(out string) bool {
		for _, ev := range decodeEvents(out) {
			if ev.ContainerId == id && ev.ContainerEventType == typ {
				return true
			}
		}
		return false
	}
	return map[string]func(string) bool{
		"json": jsonHas, "containerd-json": jsonHas, "crictl": jsonHas,
		"yaml":     func(out string) bool { return strings.Contains(out, "containerId: "+id) },
		"template": func(out string) bool { return strings.Contains(out, "CONTAINER_STOPPED_EVENT "+id) },
		"table": func(out string) bool {
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, word) && strings.Contains(l, " "+id[:13]+" ") {
					return true
				}
			}
			return false
		},
	}
}

// decodeEvents decodes the complete JSON events of out (one still being written is left out).
func decodeEvents(out string) []*runtimeapi.ContainerEventResponse {
	var evs []*runtimeapi.ContainerEventResponse
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			break
		}
		ev := &runtimeapi.ContainerEventResponse{}
		if protojson.Unmarshal(raw, ev) == nil {
			evs = append(evs, ev)
		}
	}
	return evs
}

// runPodIn runs a pod in namespace ns, removed when the test ends.
func runPodIn(t *testing.T, c *cri, name, ns string) string {
	t.Helper()
	cfg := env.PodConfig(name)
	cfg.Metadata.Namespace = ns
	resp, err := c.rt.RunPodSandbox(ctx(t), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatalf("RunPodSandbox %s/%s: %v", ns, name, err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = c.rt.StopPodSandbox(cctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: resp.PodSandboxId})
		_, _ = c.rt.RemovePodSandbox(cctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: resp.PodSandboxId})
	})
	return resp.PodSandboxId
}

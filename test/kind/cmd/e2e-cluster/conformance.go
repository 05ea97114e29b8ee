package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pleg-nri/pleg-nri/test/e2eimages"
	"github.com/pleg-nri/pleg-nri/test/junit"
)

// Upstream's cluster conformance tests of SIG Node, run by e2e.test (make e2e-cluster-conformance):
// the specs labelled [Conformance] under [sig-node], on this cluster as kind made it (GenericPLEG),
// with every kubelet on containerd's own event stream (EventedPLEG), and with pleg-nri installed by the
// chart. The [Serial] ones among them run after the others, on one process, as ginkgo does for every
// spec decorated Serial.
const (
	conformanceFocus = `\[sig-node\].*\[Conformance\]`
	// conformanceSkip: none. The report lists every spec the focus selects.
	conformanceSkip = ""
)

// conformanceSetup is one way the cluster's kubelets learn of container changes.
type conformanceSetup struct {
	Name, Title string
}

var conformanceSetups = []conformanceSetup{
	{"generic", "GenericPLEG (kind's kubelets as made)"},
	{"containerd", "EventedPLEG on containerd's stream"},
	{"pleg-nri", "EventedPLEG on pleg-nri (the chart, kubelet switch on)"},
}

// conformanceRun is one setup's run of the selection.
type conformanceRun struct {
	Setup       string             `json:"setup"`
	Started     string             `json:"started"`
	WallSeconds float64            `json:"wall_seconds"`
	Procs       int                `json:"procs"`
	Tests       []junit.Result     `json:"tests"`
	StreamErrs  map[string]float64 `json:"stream_errors,omitempty"`
	GinkgoErr   string             `json:"ginkgo_error,omitempty"`
}

// conformanceResults is docs/e2e-cluster-conformance-<version>.json.
type conformanceResults struct {
	Version string             `json:"version"`
	Commit  string             `json:"commit"`
	Focus   string             `json:"focus"`
	Skip    string             `json:"skip,omitempty"`
	Images  []e2eimages.Result `json:"images"`
	// Registry says where the specs that pull find the built images ("" without a registry).
	Registry string           `json:"registry,omitempty"`
	Runs     []conformanceRun `json:"runs"`
}

// startRegistry starts the registry binary on the host, on the kind network's gateway address (every
// node reaches it there), pushes every built image to it from the control plane's containerd (kind
// load put them there), and writes on every node containerd's registry host configuration for each of
// their registries: a spec that pulls (ImageVolume's PullAlways) pulls over the network, as from
// registry.k8s.io. It returns the registry (to stop) and a line saying what it holds.
func (c *cluster) startRegistry(ctx context.Context, dir string, images []e2eimages.Result) (*e2eimages.Registry, string, error) {
	gw, err := kindGateway(ctx)
	if err != nil {
		return nil, "", err
	}
	l, err := net.Listen("tcp", net.JoinHostPort(gw, "0"))
	if err != nil {
		return nil, "", fmt.Errorf("the kind network's gateway %s: %w", gw, err)
	}
	addr := l.Addr().String()
	l.Close()
	r, err := e2eimages.StartRegistry(ctx, c.o.registry, dir, addr)
	if err != nil {
		return nil, "", err
	}
	ctr := func(args ...string) error {
		if out, err := c.onNode(ctx, c.nodes[0], append([]string{"ctr", "--namespace", "k8s.io"}, args...)...); err != nil {
			return fmt.Errorf("on %s: ctr %s: %w\n%s", c.nodes[0], strings.Join(args, " "), err, out)
		}
		return nil
	}
	names, pushed, err := r.Push(images, ctr)
	if err != nil {
		return r, "", err
	}
	for _, n := range c.nodes {
		for _, host := range names {
			d := "/etc/containerd/certs.d/" + host
			if out, err := c.onNode(ctx, n, "sh", "-c", `mkdir -p "$1" && printf '%s' "$2" >"$1/hosts.toml"`, "sh", d, e2eimages.HostsTOML(host, addr)); err != nil {
				return r, "", fmt.Errorf("%s: writing %s/hosts.toml: %w\n%s", n, d, err, out)
			}
		}
	}
	return r, fmt.Sprintf("a registry (distribution, built from the module proxy) on the host at %s holds the %d images built; "+
		"every node's containerd pulls %s from it (/etc/containerd/certs.d)", addr, pushed, strings.Join(names, ", ")), nil
}

// kindGateway is the host's IPv4 address on the kind network.
func kindGateway(ctx context.Context) (string, error) {
	out, err := cmd(ctx, "docker", "network", "inspect", "kind", "--format", "{{range .IPAM.Config}}{{.Gateway}} {{end}}")
	if err != nil {
		return "", err
	}
	for _, f := range strings.Fields(out) {
		if ip := net.ParseIP(f); ip != nil && ip.To4() != nil {
			return f, nil
		}
	}
	return "", fmt.Errorf("the kind network has no IPv4 gateway: %q", out)
}

// conformance builds the images e2e.test names offline, loads them into every node, and runs the
// selection in each setup in turn; it writes the report and fails when a spec that passed with
// GenericPLEG did not pass with pleg-nri (containerd's stream's differences are reported, not failed).
func (c *cluster) conformance(ctx context.Context, tmp string) (err error) {
	suite := filepath.Join(c.o.conformance, "e2e.test")
	names, err := e2eimages.List(ctx, suite)
	if err != nil {
		return err
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	start := time.Now()
	images, archives, err := e2eimages.Builder{Root: root, Cache: c.o.cache, Agnhost: filepath.Join(c.o.conformance, "agnhost"),
		Version: c.o.version}.Build(ctx, names)
	if err != nil {
		return fmt.Errorf("building e2e.test's images: %w", err)
	}
	for _, a := range archives {
		if out, err := cmd(ctx, c.o.kind, "load", "image-archive", a, "--name", c.o.name); err != nil {
			return fmt.Errorf("kind load image-archive %s: %w\n%s", a, err, out)
		}
	}
	built := 0
	for _, im := range images {
		if im.Built {
			built++
		} else {
			fmt.Printf("e2e-cluster: image NOT BUILT (a spec that runs it fails alike in every setup): %s: %s\n", im.Name, im.Why)
		}
	}
	fmt.Printf("e2e-cluster: %d of e2e.test's %d images built and loaded into every node in %s\n", built, len(images),
		time.Since(start).Round(time.Second))

	res := conformanceResults{Version: c.o.version, Commit: c.o.commit, Focus: conformanceFocus, Skip: conformanceSkip, Images: images}
	if c.o.registry != "" {
		r, line, err := c.startRegistry(ctx, filepath.Join(tmp, "registry"), images)
		if r != nil {
			defer r.Stop()
		}
		if err != nil {
			return err
		}
		res.Registry = line
		fmt.Printf("e2e-cluster: %s\n", line)
	}
	defer func() {
		if werr := writeConformance(c.o.conformanceReport, res); werr != nil {
			err = errors.Join(err, werr)
		}
	}()
	for _, s := range conformanceSetups {
		switch s.Name {
		case "containerd":
			if err := c.kubeletOnContainerd(ctx, true); err != nil {
				return fmt.Errorf("switching the kubelets to containerd's event stream: %w", err)
			}
		case "pleg-nri":
			if err := c.kubeletOnContainerd(ctx, false); err != nil {
				return fmt.Errorf("putting the kubelets back on GenericPLEG: %w", err)
			}
			if _, _, err := c.install(ctx); err != nil {
				return err
			}
		}
		r, err := c.runConformance(ctx, s, filepath.Join(tmp, "conformance", s.Name))
		if err != nil {
			return err
		}
		if s.Name != "generic" {
			if r.StreamErrs, err = c.kubeletErrors(ctx); err != nil {
				return err
			}
		}
		res.Runs = append(res.Runs, r)
		// Written after every setup: a later setup's failure keeps the earlier ones' results.
		if err := writeConformance(c.o.conformanceReport, res); err != nil {
			return err
		}
	}
	if _, err := c.uninstall(ctx); err != nil {
		return err
	}
	var problems []string
	if regressions := conformanceRegressions(res.Runs, "pleg-nri"); len(regressions) > 0 {
		problems = append(problems, "passed with GenericPLEG, not with pleg-nri:\n  "+strings.Join(regressions, "\n  "))
	}
	for _, r := range res.Runs {
		for n, e := range r.StreamErrs {
			if r.Setup == "pleg-nri" && e != 0 {
				problems = append(problems, fmt.Sprintf("%s: the kubelet counted %v stream errors on pleg-nri", n, e))
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// runConformance runs the selection with ginkgo in dir against the cluster and reads its JUnit report.
func (c *cluster) runConformance(ctx context.Context, s conformanceSetup, dir string) (conformanceRun, error) {
	r := conformanceRun{Setup: s.Name, Procs: c.o.conformanceProcs}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return r, err
	}
	args := []string{"--procs=" + strconv.Itoa(c.o.conformanceProcs), "--timeout=" + c.o.conformanceTimeout.String(), "--no-color",
		"--output-dir=" + dir, "--junit-report=junit.xml", "--poll-progress-after=5m", "--focus=" + conformanceFocus}
	if conformanceSkip != "" {
		args = append(args, "--skip="+conformanceSkip)
	}
	args = append(args, filepath.Join(c.o.conformance, "e2e.test"), "--",
		"--kubeconfig="+c.kubeconfig, "--provider=skeleton", "--num-nodes="+strconv.Itoa(len(c.nodes)-1),
		"--report-dir="+filepath.Join(dir, "report"), "--dump-logs-on-failure=false")
	logFile, err := os.Create(filepath.Join(dir, "ginkgo.log"))
	if err != nil {
		return r, err
	}
	defer logFile.Close()
	g := exec.CommandContext(ctx, filepath.Join(c.o.conformance, "ginkgo"), args...)
	g.Dir = dir
	g.Stdout = io.MultiWriter(logFile, os.Stdout)
	g.Stderr = g.Stdout
	g.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	g.Cancel = func() error { return syscall.Kill(-g.Process.Pid, syscall.SIGKILL) }
	fmt.Printf("e2e-cluster: conformance, %s: ginkgo %s\n", s.Title, strings.Join(args, " "))
	start := time.Now()
	r.Started = start.UTC().Format(time.RFC3339)
	runErr := g.Run()
	r.WallSeconds = time.Since(start).Seconds()
	if runErr != nil {
		r.GinkgoErr = runErr.Error()
	}
	if r.Tests, err = junit.Read(junit.Path(dir)); err != nil {
		return r, fmt.Errorf("conformance, %s: the suite left no results (%v; ginkgo: %v); see %s", s.Name, err, runErr, logFile.Name())
	}
	n := junit.Count(r.Tests)
	fmt.Printf("e2e-cluster: conformance, %s: %d passed, %d failed, %d skipped in %s (ginkgo: %v)\n", s.Title, n.Passed, n.Failed, n.Skipped,
		time.Duration(r.WallSeconds*float64(time.Second)).Round(time.Second), runErr)
	return r, nil
}

// conformanceRegressions names the specs that passed in the generic run and did not pass in setup's.
func conformanceRegressions(runs []conformanceRun, setup string) []string {
	status := map[string]map[string]string{}
	for _, r := range runs {
		status[r.Setup] = map[string]string{}
		for _, t := range r.Tests {
			status[r.Setup][t.Name] = t.Status
		}
	}
	if status["generic"] == nil || status[setup] == nil {
		return nil
	}
	var out []string
	for name, st := range status["generic"] {
		if st == "passed" && status[setup][name] != "passed" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// writeConformance writes the results as JSON and the report as markdown beside it (path: the .md).
func writeConformance(path string, res conformanceResults) error {
	if path == "" {
		return nil
	}
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(strings.TrimSuffix(path, ".md")+".json", append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(conformanceReport(res)), 0o644)
}

// conformanceReport is the markdown report: per setup the counts and the wall time, every spec whose
// outcome differs between the setups with its failure, the specs that failed in every setup, and the
// images that were not built.
func conformanceReport(res conformanceResults) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Upstream's `[sig-node]` `[Conformance]` tests on a 3-node kind cluster, Kubernetes %s\n\n", res.Version)
	fmt.Fprintf(&b, "Generated by `make e2e-cluster-conformance K8S_VERSION=%s` (tree at `%s`): `e2e.test` built from "+
		"`k8s.io/kubernetes@%s`, unmodified, run by ginkgo with `--focus='%s'` against one cluster (one control plane, "+
		"two workers, nodenet, kube-proxy) in each setup in turn. Nothing is retried.\n\n", res.Version, res.Commit, res.Version, res.Focus)
	b.WriteString("| setup | passed | failed | skipped | wall time | procs | kubelet stream errors |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	title := map[string]string{}
	for _, s := range conformanceSetups {
		title[s.Name] = s.Title
	}
	for _, r := range res.Runs {
		n := junit.Count(r.Tests)
		errs := "-"
		if r.StreamErrs != nil {
			var parts []string
			for _, n := range sortedKeys(r.StreamErrs) {
				parts = append(parts, fmt.Sprintf("%s %v", n, r.StreamErrs[n]))
			}
			errs = strings.Join(parts, ", ")
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %s | %d | %s |\n", title[r.Setup], n.Passed, n.Failed, n.Skipped,
			time.Duration(r.WallSeconds*float64(time.Second)).Round(time.Second), r.Procs, errs)
	}
	// Every spec, its status per setup.
	status := map[string]map[string]junit.Result{}
	var specs []string
	for _, r := range res.Runs {
		for _, t := range r.Tests {
			if status[t.Name] == nil {
				status[t.Name] = map[string]junit.Result{}
				specs = append(specs, t.Name)
			}
			status[t.Name][r.Setup] = t
		}
	}
	sort.Strings(specs)
	var differ, failedAll []string
	for _, name := range specs {
		same, allFailed := true, len(status[name]) == len(res.Runs)
		var first string
		for i, r := range res.Runs {
			st := status[name][r.Setup].Status
			if st == "" {
				st = "not run"
			}
			if i == 0 {
				first = st
			} else if st != first {
				same = false
			}
			if st == "passed" || st == "skipped" {
				allFailed = false
			}
		}
		switch {
		case !same:
			var parts []string
			for _, r := range res.Runs {
				t, ok := status[name][r.Setup]
				switch {
				case !ok:
					parts = append(parts, r.Setup+": not run")
				case t.Failure != "" && t.Status != "passed":
					parts = append(parts, fmt.Sprintf("%s: %s (%s)", r.Setup, t.Status, t.Failure))
				default:
					parts = append(parts, fmt.Sprintf("%s: %s", r.Setup, t.Status))
				}
			}
			differ = append(differ, fmt.Sprintf("- %s: %s", name, strings.Join(parts, "; ")))
		case allFailed && len(res.Runs) > 0:
			failedAll = append(failedAll, fmt.Sprintf("- %s: %s", name, status[name][res.Runs[0].Setup].Failure))
		}
	}
	fmt.Fprintf(&b, "\n## Specs whose outcome differs between the setups (%d)\n\n", len(differ))
	if len(differ) == 0 {
		b.WriteString("None.\n")
	} else {
		b.WriteString(strings.Join(differ, "\n") + "\n")
	}
	fmt.Fprintf(&b, "\n## Specs that failed in every setup (%d)\n\n", len(failedAll))
	if len(failedAll) == 0 {
		b.WriteString("None.\n")
	} else {
		b.WriteString(strings.Join(failedAll, "\n") + "\n")
	}
	var notBuilt []string
	for _, im := range res.Images {
		if !im.Built {
			notBuilt = append(notBuilt, fmt.Sprintf("- `%s`: %s", im.Name, im.Why))
		}
	}
	fmt.Fprintf(&b, "\n## Images\n\n%d of the %d images `e2e.test --list-images` names were built offline (package "+
		"`test/e2eimages`) and loaded into every node; a spec that runs one of the others fails alike in every setup:\n\n",
		len(res.Images)-len(notBuilt), len(res.Images))
	if res.Registry != "" {
		fmt.Fprintf(&b, "For the specs that pull: %s.\n\n", res.Registry)
	}
	b.WriteString(strings.Join(notBuilt, "\n") + "\n")
	return b.String()
}

func sortedKeys(m map[string]float64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

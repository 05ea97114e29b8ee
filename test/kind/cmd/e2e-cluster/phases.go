package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
	"github.com/pleg-nri/pleg-nri/test/kind/internal/crashbench"
)

// The crash-to-restart samples of the idle setups: crashIdlePerNode pods on every node, each of whose
// container crashes once; the exits start crashIdleFirstExit after the batch is released (every pod
// runs) and are crashIdleSpacing apart on a node, so that each finds the node idle. On a slow machine
// here (containerd 150-200 ms to handle an exit, a replacement's start about a second of the shared
// CPU) exits 530 ms apart on each of the three nodes queued behind each other: the idle rounds gave
// created p50 1.0-2.2 s while the rollout's batch, 7.53 s apart, gave 150-270 ms in the same run.
// 5.03 s still leaves a node four seconds idle between a replacement's start and the next exit
// (not a multiple of the 1 s relist period either), and makes a round 25 s shorter.
const (
	crashIdlePerNode   = 10
	crashIdleFirstExit = 10 * time.Second
	crashIdleSpacing   = 5030 * time.Millisecond
	// The batch made just before an upgrade or a rollback, released as the upgrade starts: its exits
	// are spread over the time the DaemonSet takes to roll through the nodes (rollMinReadySeconds and
	// about 6 s a node on a quiet machine, minutes on a starved one), so that every node has samples
	// while it runs the old pleg-nri, while its own is replaced, and after. 15 a node span 10 s +
	// 14 x 7.53 s = 115 s, as long as a rollout of 3 nodes at 30 s + 6 s each with its helm call
	// (1m51s in the last runs); the first exit 10 s in falls while the first node's pleg-nri is being
	// replaced. The 36 used before took up to 9 minutes to start on a starved machine, and starved the
	// nodes further; 24 (20 s + 181 s) outlasted the rollout by a minute that measured nothing, and
	// 18 (20 s + 148 s) by half a minute, each rollout phase that much longer.
	crashRollPerNode   = 15
	crashRollFirstExit = 10 * time.Second
	crashRollSpacing   = 7530 * time.Millisecond
	// rollMinReadySeconds is the chart's minReadySeconds in this cluster: each node's new pleg-nri
	// stays ready this long before the rollout moves on, so that a rollout lasts long enough for a
	// per-node figure (about 2 minutes for 3 nodes here; the exits span as long).
	rollMinReadySeconds = 30
	// crashStartTimeout bounds the wait for a batch's pods to run: the upgrade's 108 pods took more
	// than 3 minutes on a machine here whose three nodes were starved (CPU pressure near 60 %).
	crashStartTimeout = 10 * time.Minute
	// slowSample is a rollout's crash to creation that the log explains: the kubelet's and pleg-nri's
	// journal lines of the node around it.
	slowSample = 2 * time.Second
)

// phase is one setup or moment of the cluster and its crash-to-restart samples.
type phase struct {
	name    string
	samples []crashbench.Sample
	// from and to bound the rollout of an upgrade or a rollback (zero for an idle setup): the samples
	// whose exit fell between them are the ones the phase is about.
	from, to time.Time
	// slow are the report's lines about the rollout's samples slower than slowSample.
	slow []string
}

// inWindow is the phase's samples that count: all of an idle phase, those of the rollout window.
func (p phase) inWindow() []crashbench.Sample {
	if p.from.IsZero() {
		return p.samples
	}
	return crashbench.Between(p.samples, p.from, p.to)
}

// crashes runs a batch of pods on every node whose containers crash once each, runs during (if any)
// once they all run, and returns the batch's samples once every container was replaced.
func (c *cluster) crashes(ctx context.Context, ns string, perNode int, firstExit, spacing time.Duration, during func() error) ([]crashbench.Sample, error) {
	p := crashbench.Plan{Namespace: ns, Nodes: c.nodes, PerNode: perNode, FirstExit: firstExit, Spacing: spacing, Image: busybox,
		StartTimeout: crashStartTimeout}
	samples, err := p.Run(ctx, c.k, during)
	if err != nil {
		return samples, err
	}
	fmt.Printf("e2e-cluster: crash batch %s: %s\n", ns, crashbench.Of(samples))
	return samples, nil
}

// kubeletSetup is where a node's kubelet takes its container events from.
type kubeletSetup struct {
	name     string // as the report names it
	endpoint string // the kubelet's containerRuntimeEndpoint
	gate     string // the EventedPLEG gate: "true", or "remove" for kind's default (GenericPLEG)
	// image is the kubelet's imageServiceEndpoint: containerd's socket with pleg-nri (as its kubelet
	// switch sets it), or "remove" for kind's default (unset: the runtime endpoint, containerd's).
	image string
}

const (
	containerdSocket = "unix:///run/containerd/containerd.sock"
	plegNRISocket    = "unix:///run/pleg-nri/cri.sock"
)

var (
	onGeneric    = kubeletSetup{"GenericPLEG (kind's default)", containerdSocket, "remove", "remove"}
	onContainerd = kubeletSetup{"EventedPLEG on containerd's stream", containerdSocket, "true", "remove"}
	onPlegNRI    = kubeletSetup{"pleg-nri", plegNRISocket, "true", containerdSocket}
	// sideBySide are the setups measured side by side, one per node in each round.
	sideBySide = []kubeletSetup{onGeneric, onContainerd, onPlegNRI}
)

// rotation is round r's setup of each node: node i runs setups[(i+r) mod len(setups)], so that over
// len(setups) rounds every setup runs once on every node (with as many nodes as setups), and in every
// round each setup runs beside the others at the same moments.
func rotation(nodes []string, setups []kubeletSetup, r int) map[string]kubeletSetup {
	out := make(map[string]kubeletSetup, len(nodes))
	for i, n := range nodes {
		out[n] = setups[(i+r)%len(setups)]
	}
	return out
}

// sideBySidePhases measures crash to restart for every setup of sideBySide at once, one setup per
// node, in len(sideBySide) rounds that rotate the setups over the nodes (the control plane is busier
// than a worker: each setup has it once). pleg-nri runs on every node, as the chart installed it;
// a node's setup is only where its kubelet takes its events from (as in make bench-kubelet, where
// every setup's kubelet runs against the same containerd with pleg-nri attached). It leaves every
// kubelet on pleg-nri, and returns a phase per setup and what the evented kubelets counted.
func (c *cluster) sideBySidePhases(ctx context.Context) ([]phase, []string, error) {
	phases := make([]phase, len(sideBySide))
	for i, s := range sideBySide {
		phases[i].name = s.name
	}
	var notes []string
	for r := range sideBySide {
		want := rotation(c.nodes, sideBySide, r)
		if err := c.switchKubelets(ctx, want); err != nil {
			return phases, notes, fmt.Errorf("round %d: %w", r+1, err)
		}
		var desc []string
		for _, n := range c.nodes {
			desc = append(desc, n+": "+want[n].name)
		}
		fmt.Printf("e2e-cluster: side by side, round %d of %d: %s\n", r+1, len(sideBySide), strings.Join(desc, "; "))
		samples, err := c.crashes(ctx, fmt.Sprintf("crash-round%d", r+1), crashIdlePerNode, crashIdleFirstExit, crashIdleSpacing, nil)
		if err != nil {
			return phases, notes, err
		}
		for _, smp := range samples {
			for i, s := range sideBySide {
				if want[smp.Node] == s {
					phases[i].samples = append(phases[i].samples, smp)
				}
			}
		}
		// The evented kubelets' stream errors, before the next round restarts them.
		var errs []string
		for _, n := range c.nodes {
			if want[n].gate != "true" {
				continue
			}
			m, err := c.kubeletMetrics(ctx, n)
			if err != nil {
				return phases, notes, err
			}
			e := metric(m, "kubelet_evented_pleg_connection_error_count")
			errs = append(errs, fmt.Sprintf("%s on %s: %v", want[n].name, n, e))
			if want[n] == onPlegNRI && e != 0 {
				return phases, notes, fmt.Errorf("round %d: the kubelet on %s counted %v stream errors on pleg-nri", r+1, n, e)
			}
		}
		notes = append(notes, fmt.Sprintf("round %d: %s; kubelet stream errors at its end: %s", r+1, strings.Join(desc, ", "), strings.Join(errs, ", ")))
	}
	all := map[string]kubeletSetup{}
	for _, n := range c.nodes {
		all[n] = onPlegNRI
	}
	if err := c.switchKubelets(ctx, all); err != nil {
		return phases, notes, fmt.Errorf("putting every kubelet back on pleg-nri: %w", err)
	}
	return phases, notes, nil
}

// compareSetups states the goals of the crash-to-restart figures of the side-by-side phases: created
// at most 0.5x of containerd's stream's and at least 10x sooner than GenericPLEG's, started at least
// 50 ms sooner than containerd's stream's, at p50 (and p90 alongside).
//
// A third line gives pleg-nri's differences at p50 with their bootstrap intervals, which say whether
// a difference this close tells a gain from the rounds' noise.
func compareSetups(phases []phase) []string {
	by := map[string]crashbench.Stats{}
	created, started := map[string][]float64{}, map[string][]float64{}
	for _, p := range phases {
		by[p.name] = crashbench.Of(p.samples)
		created[p.name], started[p.name] = crashbench.Latencies(p.samples)
	}
	g, cd, pn := by[onGeneric.name], by[onContainerd.name], by[onPlegNRI.name]
	if g.N == 0 || cd.N == 0 || pn.N == 0 {
		return nil
	}
	diff := func(of map[string][]float64, than kubeletSetup) benchreport.Diff {
		return benchreport.QuantileDiff(of[onPlegNRI.name], of[than.name], 0.5)
	}
	yes := func(ok bool) string {
		if ok {
			return "met"
		}
		return "not met"
	}
	return []string{
		fmt.Sprintf("side by side, created p50: pleg-nri %.0f ms, containerd's stream %.0f ms (%.2fx; goal <= 0.5x: %s), "+
			"GenericPLEG %.0f ms (%.1fx sooner; goal >= 10x: %s); p90 %.0f / %.0f / %.0f ms",
			pn.CreatedP50, cd.CreatedP50, pn.CreatedP50/cd.CreatedP50, yes(pn.CreatedP50 <= 0.5*cd.CreatedP50),
			g.CreatedP50, g.CreatedP50/pn.CreatedP50, yes(g.CreatedP50 >= 10*pn.CreatedP50), pn.CreatedP90, cd.CreatedP90, g.CreatedP90),
		fmt.Sprintf("side by side, started p50: pleg-nri %.0f ms, containerd's stream %.0f ms (%+.0f ms; goal >= 50 ms sooner: %s), "+
			"GenericPLEG %.0f ms; p90 %.0f / %.0f / %.0f ms (%+.0f ms against containerd's stream: %s)",
			pn.StartedP50, cd.StartedP50, pn.StartedP50-cd.StartedP50, yes(cd.StartedP50-pn.StartedP50 >= 50),
			g.StartedP50, pn.StartedP90, cd.StartedP90, g.StartedP90, pn.StartedP90-cd.StartedP90, yes(cd.StartedP90-pn.StartedP90 >= 50)),
		fmt.Sprintf("side by side, pleg-nri's p50 minus the other setup's: created, against containerd's stream %s, against GenericPLEG %s; "+
			"started, against containerd's stream %s",
			diff(created, onContainerd), diff(created, onGeneric), diff(started, onContainerd)),
	}
}

// compareRoll states the goal for an upgrade or a rollback: on every node, crash to restart
// (created, p50) within 2x of pleg-nri's idle figure on the cluster (its 30 side-by-side samples;
// the node's own idle row, 10 samples from one round, is given beside it).
func compareRoll(idle []phase, roll phase, nodes []string) string {
	var base crashbench.Stats
	var byNode map[string][]crashbench.Sample
	for _, p := range idle {
		if p.name == onPlegNRI.name {
			base = crashbench.Of(p.samples)
			byNode = crashbench.ByNode(p.samples)
		}
	}
	in := roll.inWindow()
	rolled := crashbench.ByNode(in)
	var parts []string
	met := base.N > 0
	for _, n := range nodes {
		st := crashbench.Of(rolled[n])
		if st.N == 0 || base.N == 0 {
			parts = append(parts, fmt.Sprintf("%s: no sample", n))
			met = false
			continue
		}
		r := st.CreatedP50 / base.CreatedP50
		met = met && r <= 2
		parts = append(parts, fmt.Sprintf("%s %.0f ms (%.2fx; the node idle %.0f ms)", n, st.CreatedP50, r, crashbench.Of(byNode[n]).CreatedP50))
	}
	verdict := "met"
	if !met {
		verdict = "not met"
	}
	return fmt.Sprintf("%s: rolled through %d nodes in %s, %d of %d samples in the rollout; created p50 per node against pleg-nri idle (%.0f ms): %s; goal within 2x: %s",
		roll.name, len(nodes), roll.to.Sub(roll.from).Round(time.Second), len(in), len(roll.samples), base.CreatedP50, strings.Join(parts, ", "), verdict)
}

// kubeletOnContainerd points every node's kubelet at containerd's socket, with containerd's event
// stream (on) or kind's default GenericPLEG.
func (c *cluster) kubeletOnContainerd(ctx context.Context, on bool) error {
	want := map[string]kubeletSetup{}
	for _, n := range c.nodes {
		want[n] = onGeneric
		if on {
			want[n] = onContainerd
		}
	}
	return c.switchKubelets(ctx, want)
}

// switchKubelets points each node's kubelet where want says, with pleg-nri's own kubelet-config
// command copied to the node (/usr/local/bin: the node's /tmp is a tmpfs, which docker cp does not
// reach), and restarts the kubelets that changed; then waits until the nodes are Ready and each
// evented kubelet holds its event stream (pleg-nri's: one subscriber, no error).
func (c *cluster) switchKubelets(ctx context.Context, want map[string]kubeletSetup) error {
	for _, n := range c.nodes {
		s, ok := want[n]
		if !ok {
			continue
		}
		if _, err := cmd(ctx, "docker", "cp", c.o.plegNRIBin, n+":/usr/local/bin/e2e-pleg-nri"); err != nil {
			return err
		}
		out, err := c.onNode(ctx, n, "/usr/local/bin/e2e-pleg-nri", "kubelet-config", "--config", "/var/lib/kubelet/config.yaml",
			"--kubeadm-flags", "/var/lib/kubelet/kubeadm-flags.env", "--container-runtime-endpoint", s.endpoint,
			"--image-service-endpoint", s.image, "--evented-pleg", s.gate)
		if err != nil {
			return fmt.Errorf("%s: kubelet-config: %w", n, err)
		}
		if out == "changed" {
			if _, err := c.onNode(ctx, n, "systemctl", "restart", "kubelet"); err != nil {
				return err
			}
		}
		if _, err := c.onNode(ctx, n, "rm", "-f", "/usr/local/bin/e2e-pleg-nri"); err != nil {
			return err
		}
	}
	for _, n := range c.nodes {
		s, ok := want[n]
		if !ok {
			continue
		}
		// The restarted kubelet posts Ready again within its status period; the node may still show the
		// old kubelet's Ready for a moment, which is why the stream is waited for too.
		if _, err := c.k(ctx, "wait", "--for=condition=Ready", "node/"+n, "--timeout=180s"); err != nil {
			return fmt.Errorf("node %s is not Ready after its kubelet restarted: %w", n, err)
		}
		switch {
		case s == onPlegNRI:
			if _, err := c.waitStreaming(ctx, n); err != nil {
				return err
			}
		case s.gate == "true":
			if err := testutil.PollEvery(ctx, 2*time.Minute, 2*time.Second, "the kubelet on "+n+" to hold containerd's event stream", func() (bool, error) {
				m, err := c.kubeletMetrics(ctx, n)
				return err == nil && metric(m, "kubelet_evented_pleg_connection_success_count") >= 1, nil
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

// kubeletErrors reads every node's kubelet stream error count.
func (c *cluster) kubeletErrors(ctx context.Context) (map[string]float64, error) {
	out := map[string]float64{}
	for _, n := range c.nodes {
		m, err := c.kubeletMetrics(ctx, n)
		if err != nil {
			return nil, err
		}
		out[n] = metric(m, "kubelet_evented_pleg_connection_error_count")
	}
	return out, nil
}

// roll upgrades (or rolls back) the release with helmArgs while a crash batch runs, waits for the
// DaemonSet to roll through every node, and checks every node: it runs wantVersion, its kubelet kept
// its event stream (no error, no new connection, one subscriber) and no container is duplicated.
func (c *cluster) roll(ctx context.Context, name, ns, wantVersion string, before map[string]streamState, helmArgs ...string) (phase, error) {
	ph := phase{name: name}
	samples, err := c.crashes(ctx, ns, crashRollPerNode, crashRollFirstExit, crashRollSpacing, func() error {
		ph.from = time.Now()
		args := append([]string{"--kubeconfig", c.kubeconfig, "-n", "kube-system"}, helmArgs...)
		if out, err := cmd(ctx, c.o.helm, append(args, "--wait", "--timeout", "10m")...); err != nil {
			return fmt.Errorf("helm %s: %w\n%s", helmArgs[0], err, out)
		}
		if _, err := c.k(ctx, "-n", "kube-system", "rollout", "status", "daemonset/pleg-nri", "--timeout=10m"); err != nil {
			return fmt.Errorf("the pleg-nri DaemonSet did not roll out (%s): %w", name, err)
		}
		ph.to = time.Now()
		fmt.Printf("e2e-cluster: %s: rolled through %d nodes in %s\n", name, len(c.nodes), ph.to.Sub(ph.from).Round(time.Second))
		return nil
	})
	ph.samples = samples
	if err != nil {
		return ph, err
	}
	ph.slow = c.explainSlow(ctx, ph)
	var failures []string
	for _, n := range c.nodes {
		v, err := c.onNode(ctx, n, "/usr/local/bin/pleg-nri", "version")
		if err != nil {
			return ph, err
		}
		if v != "pleg-nri "+wantVersion {
			failures = append(failures, fmt.Sprintf("%s: runs %q after %s, want pleg-nri %s", n, v, name, wantVersion))
		}
		st, err := c.stream(ctx, n)
		if err != nil {
			return ph, err
		}
		fmt.Printf("e2e-cluster: %s: after %s: %s\n", n, name, st)
		if !st.keeps(before[n]) {
			failures = append(failures, fmt.Sprintf("%s: the kubelet's event stream after %s: %s, before: %s; want 0 errors, "+
				"the same connections, 1 subscriber", n, name, st, before[n]))
		}
		dup, err := c.duplicated(ctx, n, "after "+name)
		if err != nil {
			return ph, err
		}
		if dup != "" {
			failures = append(failures, dup)
		}
	}
	if len(failures) > 0 {
		return ph, errors.New(strings.Join(failures, "\n"))
	}
	return ph, nil
}

// explainSlow prints, for every sample of the rollout slower than slowSample to its replacement's
// creation, the node's kubelet journal about the pod and pleg-nri's journal around it (what the
// kubelet waited for: a failed call and its back-off, a sync of the pod in progress, pleg-nri's
// core restarting), and returns a line per sample for the report.
func (c *cluster) explainSlow(ctx context.Context, ph phase) []string {
	var lines []string
	for _, s := range ph.inWindow() {
		if s.Created.Sub(s.Exited) <= slowSample {
			continue
		}
		line := fmt.Sprintf("%s: slow sample on %s: %s exited %s into the rollout, replacement created %.0f ms and started %.0f ms after the exit",
			ph.name, s.Node, s.Pod, s.Exited.Sub(ph.from).Round(100*time.Millisecond), s.CreatedMs(), s.StartedMs())
		fmt.Printf("e2e-cluster: %s\n", line)
		since, until := s.Exited.Add(-2*time.Second).Unix(), s.Created.Add(2*time.Second).Unix()
		for _, q := range []string{
			fmt.Sprintf("journalctl -u kubelet --since @%d --until @%d -o short-precise --no-pager | grep -F %q | tail -n 40", since, until, s.Pod),
			fmt.Sprintf("journalctl -u pleg-nri --since @%d --until @%d -o short-precise --no-pager | tail -n 40", since, until),
		} {
			out, err := c.onNode(ctx, s.Node, "sh", "-c", q)
			if err != nil {
				out = err.Error()
			}
			fmt.Printf("---- %s: %s ----\n%s\n", s.Node, q, out)
		}
		lines = append(lines, line)
	}
	return lines
}

// uninstall runs helm uninstall and checks that every node is back as it was before the install: the
// kubelet on containerd's socket without the EventedPLEG gate or an imageServiceEndpoint, Ready, and nothing of pleg-nri left on
// it (no unit, no binary, no process) nor in the cluster (no DaemonSet, ConfigMap, Job or pod). It
// returns a line for the report.
func (c *cluster) uninstall(ctx context.Context) (string, error) {
	start := time.Now()
	if out, err := cmd(ctx, c.o.helm, "--kubeconfig", c.kubeconfig, "-n", "kube-system", "uninstall", "pleg-nri", "--wait", "--timeout", "10m"); err != nil {
		return "", fmt.Errorf("helm uninstall: %w\n%s", err, out)
	}
	took := time.Since(start)
	var left []string
	for _, n := range c.nodes {
		kcfg, err := c.onNode(ctx, n, "cat", "/var/lib/kubelet/config.yaml")
		if err != nil {
			return "", err
		}
		// imageServiceEndpoint as before the chart's switch: unset, as kind's kubeadm writes it.
		if !strings.Contains(kcfg, "containerRuntimeEndpoint: "+containerdSocket) || strings.Contains(kcfg, "EventedPLEG") ||
			strings.Contains(kcfg, "imageServiceEndpoint") {
			left = append(left, fmt.Sprintf("%s: the kubelet's configuration after uninstall:\n%s", n, kcfg))
		}
		if out, err := c.onNode(ctx, n, "systemctl", "cat", "pleg-nri.service"); err == nil {
			left = append(left, fmt.Sprintf("%s: pleg-nri.service is still there:\n%s", n, out))
		}
		if out, _ := c.onNode(ctx, n, "sh", "-c", "ls -d /usr/local/bin/pleg-nri /run/pleg-nri/cri.sock 2>/dev/null; pgrep -a -x pleg-nri"); out != "" {
			left = append(left, fmt.Sprintf("%s: left after uninstall: %s", n, out))
		}
		if _, err := c.k(ctx, "wait", "--for=condition=Ready", "node/"+n, "--timeout=180s"); err != nil {
			left = append(left, fmt.Sprintf("node %s is not Ready after uninstall: %v", n, err))
		}
	}
	// The hook's Job is deleted once it succeeded; its pods go in the background.
	var objs string
	if err := testutil.PollEvery(ctx, time.Minute, 2*time.Second, "the chart's objects to be gone", func() (bool, error) {
		out, err := c.k(ctx, "-n", "kube-system", "get", "daemonsets,configmaps,jobs,pods", "-l", "app.kubernetes.io/name=pleg-nri", "-o", "name")
		objs = out
		return err == nil && out == "", nil
	}); err != nil {
		left = append(left, "in kube-system: "+strings.Join(strings.Fields(objs), " "))
	}
	if len(left) > 0 {
		return "", errors.New("helm uninstall left things behind:\n" + strings.Join(left, "\n"))
	}
	line := fmt.Sprintf("helm uninstall in %s: every kubelet back on containerd's socket without EventedPLEG, Ready; nothing of pleg-nri left",
		took.Round(time.Second))
	fmt.Println("e2e-cluster:", line)
	return line, nil
}

// report is the crash-to-restart table of every phase, cluster-wide and per node, in markdown.
func report(version string, phases []phase, extra []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# make e2e-cluster on Kubernetes %s: crash to restart, per setup and per node\n\n", version)
	b.WriteString("Written by `make e2e-cluster` (test/kind/cmd/e2e-cluster). A kind cluster of 3 nodes on this machine " +
		"(2 cores, shared); each sample is a pod whose container crashes once: its exit to the creation and the start of the " +
		"container the kubelet replaces it with, from the node's containerd. The three idle setups run side by side: in each of 3 " +
		"rounds every node's kubelet takes its events from one setup, rotated so that each setup runs once on every node (a " +
		"setup's row for a node is its round there), with pleg-nri installed by the chart on every node throughout. An " +
		"upgrade's or a rollback's figures count the samples whose exit fell while the DaemonSet rolled.\n\n")
	b.WriteString("| phase | node | samples | created p50 | created p90 | started p50 | started p90 |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, p := range phases {
		rows := []struct {
			node string
			s    []crashbench.Sample
		}{{"all", p.inWindow()}}
		byNode := crashbench.ByNode(p.inWindow())
		nodes := make([]string, 0, len(byNode))
		for n := range byNode {
			nodes = append(nodes, n)
		}
		sort.Strings(nodes)
		for _, n := range nodes {
			rows = append(rows, struct {
				node string
				s    []crashbench.Sample
			}{n, byNode[n]})
		}
		for _, r := range rows {
			st := crashbench.Of(r.s)
			fmt.Fprintf(&b, "| %s | %s | %d | %.0f ms | %.0f ms | %.0f ms | %.0f ms |\n", p.name, r.node, st.N,
				st.CreatedP50, st.CreatedP90, st.StartedP50, st.StartedP90)
		}
	}
	if len(extra) > 0 {
		b.WriteString("\n")
		for _, e := range extra {
			b.WriteString("- " + e + "\n")
		}
	}
	return b.String()
}

// writeReport writes the report where -report says (nothing without it).
func writeReport(path, version string, phases []phase, extra []string) error {
	if path == "" {
		return nil
	}
	return os.WriteFile(path, []byte(report(version, phases, extra)), 0o644)
}

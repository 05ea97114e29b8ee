package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/kind/internal/crashbench"
)

// fault is one fault injected on one node, and the alert of the shipped rules it must fire.
type fault struct {
	what, node, alert string
	// inject makes the fault; repair undoes it.
	inject, repair func(ctx context.Context) error
	// occurred, if set, is when the fault took effect, read after its alert fired, when that is not
	// the moment its injection began (the stuck subscriber is evicted only once the churn filled its
	// queue); the alert's figures count from it.
	occurred func(ctx context.Context, injected time.Time) (time.Time, error)
	// clears says whether the alert must clear within the test once repaired: an alert on
	// increase(...[15m]) clears 15 minutes after the fault by its rule's design, and is not waited for.
	clears bool
	// pendingAfter and firedAfter are how long after the injection the alert was pending (the scrape
	// and the rule evaluation that saw the fault; zero for an alert with no for:) and fired, from
	// Prometheus' own ALERTS series; clearedAfter is how long after the repair it no longer fired.
	pendingAfter, firedAfter, clearedAfter time.Duration
	// tookEffect is how long after the injection began the fault took effect (with occurred).
	tookEffect time.Duration
}

// line describes the fault's alert for the report, against the issue's goal: fired within its for:
// plus one scrape interval. The evaluation interval is the scrape interval here, so the scrape and
// the evaluation that see a fault can together take up to two intervals: a figure between the two is
// reported as such.
func (f *fault) line(forDur, interval time.Duration) string {
	s := fmt.Sprintf("%s on %s (%s): ", f.alert, f.node, f.what)
	if f.tookEffect > 0 {
		s += fmt.Sprintf("the fault took effect %s after its injection began; ", f.tookEffect.Round(time.Second))
	}
	if f.pendingAfter > 0 {
		s += fmt.Sprintf("pending %s after the fault, ", f.pendingAfter.Round(time.Second))
	}
	s += fmt.Sprintf("firing %s after it (for: %s; ", f.firedAfter.Round(time.Second), forDur)
	switch {
	case f.firedAfter <= forDur+interval:
		s += fmt.Sprintf("within for: + one scrape interval, %s)", forDur+interval)
	case f.firedAfter <= forDur+2*interval:
		s += fmt.Sprintf("over for: + one scrape interval, %s, within for: + one scrape and one evaluation interval, %s)", forDur+interval, forDur+2*interval)
	default:
		s += fmt.Sprintf("later than for: + one scrape and one evaluation interval, %s)", forDur+2*interval)
	}
	if f.clears {
		s += fmt.Sprintf("; cleared %s after the repair", f.clearedAfter.Round(time.Second))
	} else {
		s += fmt.Sprintf("; %s, not waited for", clearsByDesign)
	}
	return s
}

// clearsByDesign is why a counter's alert is not waited for to clear.
const clearsByDesign = "its rule looks back 15 minutes, so it clears 15 minutes after the fault"

// faultChurnPods is the pods made and deleted on the node of the stuck subscriber: with a 4 KiB
// annotation each (as pods often carry), their events fill the stuck stream's windows and queue.
const faultChurnPods = 40

// injectFaults injects, each on its own node and all at once, the faults the shipped alerts are for:
// pleg-nri's core stopped and kept down (PlegNRIDown), containerd stopped, which also cuts the
// front's own connection to it (PlegNRIUpstreamDisconnected), and an event subscriber that stops
// reading (PlegNRISubscriberEvicted; that node's subscriber-queue set to 16 for the time of the fault,
// since a default queue of 1024 outlasts anything a kind node can make). Each alert must fire in
// Prometheus within its for: plus two scrape intervals, and the first two clear once repaired. Every
// node is then Ready with its kubelet's event stream unbroken.
func (c *cluster) injectFaults(ctx context.Context, p *promServer, rulesFor map[string]time.Duration, before map[string]streamState) ([]*fault, error) {
	cp, w1, w2 := c.nodes[0], c.nodes[1], c.nodes[2]
	var stuck *stuckStream
	faults := []*fault{
		{what: "pleg-nri's core stopped and kept down", node: w2, alert: "PlegNRIDown", clears: true,
			inject: c.systemctl(w2, "stop", "pleg-nri"), repair: c.systemctl(w2, "start", "pleg-nri")},
		{what: "containerd stopped (the core's and the front's connections to it lost)", node: w1, alert: "PlegNRIUpstreamDisconnected", clears: true,
			inject: c.systemctl(w1, "stop", "containerd"), repair: c.systemctl(w1, "start", "containerd")},
		{what: "an event subscriber that stops reading", node: cp, alert: "PlegNRISubscriberEvicted",
			occurred: func(ctx context.Context, injected time.Time) (time.Time, error) {
				return c.evictedAt(ctx, cp, injected)
			},
			inject: func(ctx context.Context) error {
				if err := c.setSubscriberQueue(ctx, cp, 16); err != nil {
					return err
				}
				var err error
				if stuck, err = c.openStuck(ctx, cp); err != nil {
					return err
				}
				return c.churn(ctx, cp)
			},
			repair: func(ctx context.Context) error {
				if stuck != nil {
					stuck.close()
				}
				if _, err := c.k(ctx, "delete", "namespace", "fault-churn", "--wait=true", "--timeout=3m"); err != nil {
					return err
				}
				return c.setSubscriberQueue(ctx, cp, 0)
			}},
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(faults))
	for i, f := range faults {
		wg.Go(func() {
			// The fault's moment is when its injection began: the stuck subscriber's churn
			// fills its queue, and evicts it, before the injection returns.
			injected := time.Now()
			if err := f.inject(ctx); err != nil {
				errs[i] = fmt.Errorf("%s on %s: injecting: %w", f.what, f.node, err)
				return
			}
			fmt.Printf("e2e-cluster: fault on %s: %s\n", f.node, f.what)
			limit := rulesFor[f.alert] + 2*promScrapeInterval + time.Minute + time.Since(injected)
			err := testutil.PollEvery(ctx, limit, promScrapeInterval, f.alert+" to fire for "+f.node, func() (bool, error) {
				res, err := p.query(ctx, fmt.Sprintf(`ALERTS{alertname=%q,alertstate="firing",node=%q}`, f.alert, f.node))
				return err == nil && len(res) > 0, nil
			})
			f.firedAfter = time.Since(injected)
			if err == nil && f.occurred != nil {
				if at, oerr := f.occurred(ctx, injected); oerr != nil {
					fmt.Printf("e2e-cluster: %s on %s: when the fault took effect: %v (counted from the injection's beginning)\n", f.alert, f.node, oerr)
				} else {
					f.tookEffect = at.Sub(injected)
					injected = at
				}
			}
			if err == nil {
				// Prometheus' own moments, not the poll's (one interval coarser).
				if a, qerr := p.alertStarts(ctx, f.alert, f.node, injected, time.Now()); qerr != nil {
					fmt.Printf("e2e-cluster: %s on %s: reading its ALERTS series: %v (the poll's figure is kept)\n", f.alert, f.node, qerr)
				} else if !a.firing.IsZero() {
					f.firedAfter = a.firing.Sub(injected)
					if !a.pending.IsZero() {
						f.pendingAfter = a.pending.Sub(injected)
					}
				}
			}
			if rerr := f.repair(ctx); rerr != nil {
				err = errors.Join(err, fmt.Errorf("repairing: %w", rerr))
			}
			if err != nil {
				errs[i] = fmt.Errorf("%s on %s: %w", f.what, f.node, err)
				return
			}
			fmt.Printf("e2e-cluster: %s fired %s after the fault on %s (for: %s)\n", f.alert, f.firedAfter.Round(time.Second), f.node, rulesFor[f.alert])
			if !f.clears {
				return
			}
			repaired := time.Now()
			if err := testutil.PollEvery(ctx, 2*time.Minute, promScrapeInterval, f.alert+" to clear for "+f.node, func() (bool, error) {
				res, err := p.query(ctx, fmt.Sprintf(`ALERTS{alertname=%q,node=%q}`, f.alert, f.node))
				return err == nil && len(res) == 0, nil
			}); err != nil {
				errs[i] = fmt.Errorf("%s on %s: %w", f.what, f.node, err)
				return
			}
			f.clearedAfter = time.Since(repaired)
			if a, qerr := p.alertStarts(ctx, f.alert, f.node, repaired, time.Now()); qerr == nil && !a.lastFiring.IsZero() {
				// The series ends at the staleness marker of the first evaluation that no longer
				// fired: the last 1 s step that shows it is the second before that evaluation.
				f.clearedAfter = a.lastFiring.Sub(repaired) + time.Second
			}
			fmt.Printf("e2e-cluster: %s cleared %s after the repair on %s\n", f.alert, f.clearedAfter.Round(time.Second), f.node)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return faults, err
	}
	fmt.Printf("e2e-cluster: faults injected, fired and repaired in %s\n", time.Since(start).Round(time.Second))
	// Every node back: Ready, pleg-nri active, the kubelet's stream unbroken.
	var failures []string
	for _, n := range c.nodes {
		if _, err := c.k(ctx, "wait", "--for=condition=Ready", "node/"+n, "--timeout=180s"); err != nil {
			failures = append(failures, fmt.Sprintf("node %s is not Ready after the faults: %v", n, err))
			continue
		}
		var st streamState
		err := testutil.PollEvery(ctx, time.Minute, 2*time.Second, "pleg-nri on "+n+" to serve its subscriber again", func() (bool, error) {
			var err error
			st, err = c.stream(ctx, n)
			return err == nil && st.subscribers == 1, nil
		})
		fmt.Printf("e2e-cluster: %s: after the faults: %s\n", n, st)
		if err != nil || st.errors != 0 || st.connections != before[n].connections {
			failures = append(failures, fmt.Sprintf("%s: the kubelet's event stream after the faults: %s, before: %s (%v)", n, st, before[n], err))
		}
	}
	if len(failures) > 0 {
		return faults, errors.New(strings.Join(failures, "\n"))
	}
	return faults, nil
}

// systemctl is a fault's step: systemctl verb unit on node.
func (c *cluster) systemctl(node, verb, unit string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := c.onNode(ctx, node, "systemctl", verb, unit)
		return err
	}
}

// setSubscriberQueue sets (n > 0) or removes (n == 0) subscriber-queue in node's pleg-nri
// configuration and restarts its core (the front, and the kubelet's stream, stay).
func (c *cluster) setSubscriberQueue(ctx context.Context, node string, n int) error {
	script := `sed -i '/^subscriber-queue:/d' /etc/pleg-nri/config.yaml`
	if n > 0 {
		script += fmt.Sprintf(` && echo 'subscriber-queue: %d' >> /etc/pleg-nri/config.yaml`, n)
	}
	if _, err := c.onNode(ctx, node, "sh", "-c", script+" && systemctl restart pleg-nri"); err != nil {
		return err
	}
	return testutil.PollEvery(ctx, time.Minute, time.Second, "pleg-nri on "+node+" to be ready", func() (bool, error) {
		_, err := c.onNode(ctx, node, "curl", "-fsS", "127.0.0.1:9810/readyz")
		return err == nil, nil
	})
}

// evictLog is what pleg-nri logs when it evicts a subscriber (pleg/fanout.go).
const evictLog = "event subscriber cannot keep up: evicted"

// evictedAt is when pleg-nri on node first evicted a subscriber since since, from its journal.
func (c *cluster) evictedAt(ctx context.Context, node string, since time.Time) (time.Time, error) {
	out, err := c.onNode(ctx, node, "sh", "-c", fmt.Sprintf("journalctl -u pleg-nri --since @%d -o short-unix --no-pager | grep -m1 -F %q",
		since.Unix(), evictLog))
	if err != nil {
		return time.Time{}, fmt.Errorf("no eviction in pleg-nri's journal since %s: %w", since.Format(time.TimeOnly), err)
	}
	return shortUnixTime(out)
}

// shortUnixTime is the time of a journal line in journalctl's short-unix format ("<seconds>.<µs>
// host unit: message").
func shortUnixTime(line string) (time.Time, error) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return time.Time{}, errors.New("an empty journal line")
	}
	sec, frac, _ := strings.Cut(f[0], ".")
	s, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("journal line %q: %w", line, err)
	}
	var ns int64
	if frac != "" {
		frac = (frac + "000000000")[:9]
		if ns, err = strconv.ParseInt(frac, 10, 64); err != nil {
			return time.Time{}, fmt.Errorf("journal line %q: %w", line, err)
		}
	}
	return time.Unix(s, ns), nil
}

// stuckStream is a GetContainerEvents stream on a node's pleg-nri socket whose client never reads:
// the smallest HTTP/2 windows (64 KiB, no growth), so that it holds back little.
type stuckStream struct {
	conn   *grpc.ClientConn
	cancel context.CancelFunc
}

// openStuck opens a stuck stream on node's pleg-nri socket, reached from the host through the node
// container's root (/proc/<its pid>/root).
func (c *cluster) openStuck(ctx context.Context, node string) (*stuckStream, error) {
	pid, err := cmd(ctx, "docker", "inspect", "-f", "{{.State.Pid}}", node)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("unix:///proc/"+pid+"/root/run/pleg-nri/cri.sock", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	if _, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(sctx, &runtimeapi.GetEventsRequest{}); err != nil {
		cancel()
		conn.Close()
		return nil, fmt.Errorf("GetContainerEvents on %s: %w", node, err)
	}
	return &stuckStream{conn: conn, cancel: cancel}, nil
}

func (s *stuckStream) close() {
	s.cancel()
	s.conn.Close()
}

// churn makes faultChurnPods pods on node, waits for them to run, and deletes them.
func (c *cluster) churn(ctx context.Context, node string) error {
	var b strings.Builder
	pad := strings.Repeat("x", 4096)
	for i := 0; i < faultChurnPods; i++ {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata:
  name: churn-%02d
  namespace: fault-churn
  annotations:
    padding: %s
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 0
  tolerations:
  - operator: Exists
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: [sleep, "3600"]
`, i, pad, node, busybox)
	}
	if err := crashbench.CreateNamespace(ctx, c.k, "fault-churn"); err != nil {
		return err
	}
	if err := c.applyText(ctx, b.String()); err != nil {
		return err
	}
	if _, err := c.k(ctx, "-n", "fault-churn", "wait", "--for=condition=Ready", "pod", "--all", "--timeout=180s"); err != nil {
		return err
	}
	_, err := c.k(ctx, "-n", "fault-churn", "delete", "pods", "--all", "--wait=true", "--timeout=180s")
	return err
}

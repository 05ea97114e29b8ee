package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/kind/internal/crashbench"
)

// drainReplicas is the drain check's Deployment's size (drainCheck): pods the scheduler placed on the
// drained node, beside the node's workloads.
const drainReplicas = 3

// drain drains node as an operator does before maintenance (kubectl drain: the node cordoned, every pod
// but the DaemonSets' evicted, the bare ones deleted), checks what pleg-nri must keep through it, and
// uncordons the node:
//   - the drain ends: every pod it evicted is gone from the API, which the kubelet allows only once it
//     saw the pod's containers stop, and containerd on the node runs none of them;
//   - while the node is cordoned, the drain check's Deployment has no pod on it;
//   - pleg-nri's service stays active and the kubelet keeps its event stream (no error, no new
//     connection, one subscriber); no container is duplicated;
//   - once uncordoned, the Deployment is back on the node; the node's workloads are applied again (the
//     drain deleted its bare pods) and behave as they should.
//
// It returns a line for the report.
func (c *cluster) drain(ctx context.Context, node string, before map[string]streamState) (string, error) {
	if err := c.apply(ctx, drainCheck, map[string]any{"Node": node, "Replicas": drainReplicas, "Busybox": busybox}); err != nil {
		return "", err
	}
	placed := func() ([]string, error) {
		out, err := c.k(ctx, "-n", "drain-check", "get", "pods", "-l", "app=placed", "-o", `jsonpath={range .items[*]}{.spec.nodeName} {end}`)
		return strings.Fields(out), err
	}
	onNode := func(want int) func() (bool, error) {
		return func() (bool, error) {
			ns, err := placed()
			if err != nil {
				return false, nil
			}
			k := 0
			for _, n := range ns {
				if n == node {
					k++
				}
			}
			return k == want && (want == 0 || len(ns) == want), nil
		}
	}
	if _, err := c.k(ctx, "-n", "drain-check", "rollout", "status", "deployment/placed", "--timeout=3m"); err != nil {
		return "", fmt.Errorf("the drain check's Deployment did not roll out: %w", err)
	}
	if ok, _ := onNode(drainReplicas)(); !ok {
		ns, _ := placed()
		return "", fmt.Errorf("the drain check's pods are on %v, want all %d on %s", ns, drainReplicas, node)
	}
	// The pods the drain evicts or deletes: all but the DaemonSets' (a bare pod has no owner, which a
	// jsonpath filter on the owner's kind would leave out).
	onIt, err := c.k(ctx, "get", "pods", "-A", "--field-selector", "spec.nodeName="+node,
		"-o", `jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}={.metadata.ownerReferences[0].kind}{"\n"}{end}`)
	if err != nil {
		return "", err
	}
	var pods []string
	for _, l := range strings.Fields(onIt) {
		if name, owner, _ := strings.Cut(l, "="); owner != "DaemonSet" {
			pods = append(pods, name)
		}
	}

	start := time.Now()
	if out, err := c.k(ctx, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=5m"); err != nil {
		return "", fmt.Errorf("kubectl drain %s: %w\n%s", node, err, out)
	}
	drained := time.Since(start)
	fmt.Printf("e2e-cluster: %s drained in %s (%d pods evicted or deleted)\n", node, drained.Round(time.Second), len(pods))

	var failures []string
	// The drain returned once the pods were gone from the API: their containers must have stopped.
	cs, err := crashbench.Containers(ctx, node, "drain-check")
	if err != nil {
		return "", err
	}
	for _, ct := range cs {
		if ct.State == "CONTAINER_RUNNING" {
			failures = append(failures, fmt.Sprintf("%s: container %s of the evicted pod %s still runs after the drain", node, ct.ID, ct.Pod()))
		}
	}
	// The ReplicaSet makes new pods at once; the scheduler must keep them off the cordoned node.
	time.Sleep(5 * time.Second)
	if ok, _ := onNode(0)(); !ok {
		ns, _ := placed()
		failures = append(failures, fmt.Sprintf("the drain check's pods are on %v while %s is cordoned", ns, node))
	}
	if st, err := c.onNode(ctx, node, "systemctl", "is-active", "pleg-nri"); err != nil || st != "active" {
		failures = append(failures, fmt.Sprintf("%s: pleg-nri.service is %q after the drain (%v)", node, st, err))
	}
	st, err := c.stream(ctx, node)
	if err != nil {
		return "", err
	}
	fmt.Printf("e2e-cluster: %s: after the drain: %s\n", node, st)
	if !st.keeps(before[node]) {
		failures = append(failures, fmt.Sprintf("%s: the kubelet's event stream after the drain: %s, before: %s; want 0 errors, "+
			"the same connections, 1 subscriber", node, st, before[node]))
	}
	if dup, err := c.duplicated(ctx, node, "after the drain"); err != nil {
		return "", err
	} else if dup != "" {
		failures = append(failures, dup)
	}

	start = time.Now()
	if _, err := c.k(ctx, "uncordon", node); err != nil {
		return "", err
	}
	if err := testutil.PollEvery(ctx, 3*time.Minute, time.Second, "the drain check's pods back on "+node, onNode(drainReplicas)); err != nil {
		failures = append(failures, err.Error())
	} else if _, err := c.k(ctx, "-n", "drain-check", "rollout", "status", "deployment/placed", "--timeout=3m"); err != nil {
		failures = append(failures, fmt.Sprintf("the drain check's Deployment is not ready again after the uncordon: %v", err))
	}
	back := time.Since(start)
	if err := c.apply(ctx, workloads, map[string]any{"Nodes": c.nodes, "Busybox": busybox}); err != nil {
		return "", fmt.Errorf("applying the workloads again: %w", err)
	}
	if err := c.checkWorkloads(ctx); err != nil {
		failures = append(failures, fmt.Sprintf("after the drain of %s: %v", node, err))
	}
	if st2, err := c.stream(ctx, node); err != nil {
		return "", err
	} else if !st2.keeps(before[node]) {
		failures = append(failures, fmt.Sprintf("%s: the kubelet's event stream after the uncordon: %s, before: %s", node, st2, before[node]))
	}
	if _, err := c.k(ctx, "delete", "namespace", "drain-check", "--wait=true", "--timeout=3m"); err != nil {
		return "", err
	}
	if len(failures) > 0 {
		return "", errors.New(strings.Join(failures, "\n"))
	}
	line := fmt.Sprintf("drain of %s: %d pods evicted or deleted in %s (kubectl drain); the scheduled Deployment back and ready %s after the uncordon; "+
		"pleg-nri active throughout, kubelet stream kept (%s)", node, len(pods), drained.Round(time.Second), back.Round(time.Second), st)
	fmt.Println("e2e-cluster:", line)
	return line, nil
}

// loseNode kills node's container at once (a power loss: no process on it stops cleanly; /run and
// /tmp are gone, /var stays, as on a machine's disk), waits for the control plane to see the node lost,
// starts it again, and checks that pleg-nri came back with it before the kubelet, that the new
// kubelet holds pleg-nri's stream with no error, that every workload of the node runs again (each of
// its containers restarted once by the loss, none duplicated), and that the stream is still unbroken
// after that. before[node] becomes the new kubelet's stream. It returns a line for the report.
func (c *cluster) loseNode(ctx context.Context, node string, before map[string]streamState) (string, error) {
	ready := func(want string) func() (bool, error) {
		return func() (bool, error) {
			out, err := c.k(ctx, "get", "node", node, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
			return err == nil && out == want, nil
		}
	}
	if _, err := cmd(ctx, "docker", "kill", node); err != nil {
		return "", err
	}
	killed := time.Now()
	fmt.Printf("e2e-cluster: %s killed\n", node)
	// The node controller marks a node whose kubelet stopped posting Unknown after its grace period.
	if err := testutil.PollEvery(ctx, 3*time.Minute, time.Second, "the control plane to see "+node+" lost", ready("Unknown")); err != nil {
		return "", err
	}
	lost := time.Since(killed)
	if _, err := cmd(ctx, "docker", "start", node); err != nil {
		return "", err
	}
	c.reboots[node]++
	started := time.Now()
	if err := testutil.PollEvery(ctx, 4*time.Minute, time.Second, node+" to be Ready after its restart", ready("True")); err != nil {
		return "", err
	}
	readyAfter := time.Since(started)
	var failures []string
	// pleg-nri is ordered before the kubelet: it must have been running when the kubelet started.
	if order, err := c.onNode(ctx, node, "sh", "-c",
		"echo $(systemctl show -P ActiveEnterTimestampMonotonic pleg-nri) $(systemctl show -P ExecMainStartTimestampMonotonic kubelet)"); err != nil {
		return "", err
	} else if plegNRI, kubelet, ok := monotonicPair(order); !ok || plegNRI == 0 || plegNRI > kubelet {
		failures = append(failures, fmt.Sprintf("%s: pleg-nri active and the kubelet started at %q (monotonic µs): pleg-nri must come first", node, order))
	}
	st, err := c.waitStreaming(ctx, node)
	if err != nil {
		return "", err
	}
	streaming := time.Since(started)
	fmt.Printf("e2e-cluster: %s: back after its loss: Ready %s, kubelet streaming from pleg-nri %s after the start: %s\n",
		node, readyAfter.Round(time.Second), streaming.Round(time.Second), st)
	if err := c.checkWorkloads(ctx); err != nil {
		failures = append(failures, fmt.Sprintf("after the loss of %s: %v", node, err))
	}
	if dup, err := c.duplicated(ctx, node, "after its restart"); err != nil {
		return "", err
	} else if dup != "" {
		failures = append(failures, dup)
	}
	st2, err := c.stream(ctx, node)
	if err != nil {
		return "", err
	}
	if !st2.keeps(st) {
		failures = append(failures, fmt.Sprintf("%s: the new kubelet's event stream once the workloads ran again: %s, when it first held it: %s", node, st2, st))
	}
	before[node] = st
	if len(failures) > 0 {
		return "", errors.New(strings.Join(failures, "\n"))
	}
	line := fmt.Sprintf("loss of %s (docker kill, then docker start): seen lost by the control plane %s after the kill; Ready %s and the new kubelet "+
		"streaming from pleg-nri %s after the start, with 0 errors; its workloads running again, no container duplicated (%s)",
		node, lost.Round(time.Second), readyAfter.Round(time.Second), streaming.Round(time.Second), st2)
	fmt.Println("e2e-cluster:", line)
	return line, nil
}

// monotonicPair parses two systemd monotonic timestamps (µs) separated by white space.
func monotonicPair(s string) (a, b uint64, ok bool) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return 0, 0, false
	}
	a, errA := strconv.ParseUint(f[0], 10, 64)
	b, errB := strconv.ParseUint(f[1], 10, 64)
	return a, b, errA == nil && errB == nil
}

// duplicated describes the containers duplicated on node (two of one attempt, or two running at once)
// as a failure "when" (empty: none).
func (c *cluster) duplicated(ctx context.Context, node, when string) (string, error) {
	cs, err := crashbench.Containers(ctx, node, "")
	if err != nil {
		return "", err
	}
	if d := crashbench.Duplicates(cs); len(d) > 0 {
		return fmt.Sprintf("%s: duplicated containers %s: %s", node, when, strings.Join(d, "; ")), nil
	}
	return "", nil
}

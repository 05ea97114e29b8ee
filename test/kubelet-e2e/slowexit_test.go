package kubelete2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// slowDelete is how long the runc wrapper of TestSlowExitHandling makes `runc delete` take.
const slowDelete = "2"

// TestSlowExitHandling: containerd updates an exited container's CRI status only after the runtime
// deleted its task (handleContainerExit: task.Delete, then the status), but publishes /tasks/exit at
// once, and pleg-nri sends STOPPED on that. Here `runc delete` takes 2 s (a wrapper), so for 2 s
// containerd's CRI says RUNNING for a container pleg-nri already reported STOPPED. A kubelet 1.36
// (PLEGOnDemandRelist, on by default) relists a pod right after a sync that started a container, gets
// containerd's RUNNING, and caches it with a newer timestamp than pleg-nri's events (the CRI answer has
// no timestamp of its own, so the kubelet uses its own clock): it then reports the exited container as
// running, and keeps doing so until its next relist of the pod (up to 300 s) or the pod's next event.
// pleg-nri now holds such reads until containerd's answer catches up with the events it sent. With
// containerd's own stream (setup 2) the STOPPED event comes after the status update.
//
// Each setup wants the waiter restarted once with its last state "terminated, exit code 7".
func TestSlowExitHandling(t *testing.T) {
	ctx := context.Background()
	wrapper := filepath.Join(env.Dir, "slow-runc")
	script := fmt.Sprintf("#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = delete ] && sleep %s && break; done\nexec %s/runc \"$@\"\n",
		slowDelete, env.BinDir)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(env.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	slow := strings.Replace(string(orig), `BinaryName = "`+env.BinDir+`/runc"`, `BinaryName = "`+wrapper+`"`, 1)
	if slow == string(orig) {
		t.Fatal("no runc BinaryName in containerd's config")
	}
	restart := func(config []byte) {
		if err := env.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(env.ConfigPath, config, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := env.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	restart([]byte(slow))
	t.Cleanup(func() { restart(orig) })

	for _, s := range []setup{setupEventedDirect, setupEventedPlegNRI} {
		t.Run(s.Name, func(t *testing.T) {
			n := startNode(t, s)
			if err := n.k.WritePod(triggerPod("slow")); err != nil {
				t.Fatal(err)
			}
			p := n.waitPod("slow", "running", running)
			n.triggerExit(p, n.waiterPID(p))
			p = n.waitPod("slow", "waiter restarted once, running, last state terminated", restartedTo("waiter", 1))
			if last := p.Container("waiter").LastState.Terminated; last.ExitCode != 7 {
				t.Errorf("last state of waiter: exit code %d reason %q, want 7", last.ExitCode, last.Reason)
			}
		})
	}
}

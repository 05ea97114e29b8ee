package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// checkPauseKilled kills a pod's pause process (its pid from the runtime's verbose PodSandboxStatus,
// as containerd gives it) and then stops and removes the pod: the sandbox's STOPPED must come once,
// from the kill, not again from StopPodSandbox.
func checkPauseKilled(ctx context.Context, s *suite) (string, error) {
	rec, err := s.subscribeSynced(ctx)
	if err != nil {
		return "", err
	}
	defer rec.stop()
	podID, _, err := s.sleeperPod(ctx, "pause-killed")
	if err != nil {
		return "", err
	}
	cctx, cancel := callCtx(ctx)
	defer cancel()
	st, err := s.rt.PodSandboxStatus(cctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: podID, Verbose: true})
	if err != nil {
		return "", fmt.Errorf("failed to get the verbose status of pod %s: %w", short(podID), err)
	}
	pid := verbosePid(st.Info)
	if pid == 0 {
		return "", skipf("the runtime's verbose PodSandboxStatus gives no pid of the pause process")
	}
	if err := s.opts.Kill(pid, podID); err != nil {
		return "", skipf("cannot kill the pause process %d from here: %v", pid, err)
	}
	rec.waitFor(ctx, s.opts.EventWait, hasEvent(podID, stopped))
	if err := removePod(cctx, s.rt, podID); err != nil {
		return "", err
	}
	rec.waitFor(ctx, s.opts.EventWait, hasEvent(podID, deleted))
	s.quiet(ctx)
	n := counts(rec.events(s.keep), podID)
	return countsFigure(n), exactlyOnce("the sandbox whose pause process was killed", n, allTypes...)
}

// killInCgroup SIGKILLs pid if this host's /proc shows it in a cgroup named with id (a sandbox's or a
// container's: containerd names their cgroups with it, under cgroupfs as under systemd): the pid a
// runtime reports is in its own pid namespace, which may not be this one (a runtime in a container,
// or on another host through tcp://), and another process must never be killed in its place.
func killInCgroup(pid int, id string) error {
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return fmt.Errorf("failed to read the cgroup of pid %d: %w", pid, err)
	}
	if !strings.Contains(string(cg), id) {
		return fmt.Errorf("pid %d here is not in %s's cgroup (the runtime is in another pid namespace?)", pid, short(id))
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("failed to kill pid %d: %w", pid, err)
	}
	return nil
}

// verbosePid is the pid a runtime's verbose status gives (info["info"], JSON with "pid", as
// containerd's): 0 if none.
func verbosePid(info map[string]string) int {
	var v struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(info["info"]), &v); err != nil || v.Pid <= 0 {
		return 0
	}
	return v.Pid
}

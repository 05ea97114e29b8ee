package plugin

import (
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"

	"github.com/pleg-nri/pleg-nri/pleg"
)

var (
	at       = time.Unix(1700000100, 0)
	created  = int64(1700000000_000000001)
	started  = int64(1700000001_000000002)
	finished = int64(1700000002_000000003)
)

func TestConvertPodSandbox(t *testing.T) {
	pod := &api.PodSandbox{Id: "sb1", Name: "web", Uid: "u1", Namespace: "default", Pid: 42}
	base := pleg.Observation{Source: pleg.SourceNRI, Kind: pleg.KindSandbox, ID: "sb1", SandboxID: "sb1", SourceTime: at}
	with := func(src pleg.Source, ph pleg.Phase) pleg.Observation {
		o := base
		o.Source, o.Phase = src, ph
		return o
	}
	for _, tc := range []struct {
		name string
		cb   Callback
		pod  *api.PodSandbox
		want pleg.Observation
		ok   bool
	}{
		{"run", CallbackRunPodSandbox, pod, with(pleg.SourceNRI, pleg.PhaseRunning), true},
		{"stop", CallbackStopPodSandbox, pod, with(pleg.SourceNRI, pleg.PhaseExited), true},
		{"remove", CallbackRemovePodSandbox, pod, with(pleg.SourceNRI, pleg.PhaseRemoved), true},
		{"sync with pid", CallbackSynchronize, pod, with(pleg.SourceNRISync, pleg.PhaseRunning), true},
		{"sync without pid (NotReady)", CallbackSynchronize, &api.PodSandbox{Id: "sb1"}, with(pleg.SourceNRISync, pleg.PhaseNone), true},
		{"nil pod", CallbackRunPodSandbox, nil, pleg.Observation{}, false},
		{"no id", CallbackRunPodSandbox, &api.PodSandbox{Name: "x"}, pleg.Observation{}, false},
		{"container callback", CallbackPostStartContainer, pod, pleg.Observation{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ConvertPodSandbox(tc.cb, tc.pod, at)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("observation (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConvertContainer(t *testing.T) {
	pod := &api.PodSandbox{Id: "sb1"}
	ctr := func(state api.ContainerState, mod ...func(*api.Container)) *api.Container {
		c := &api.Container{Id: "c1", PodSandboxId: "sb1", Name: "app", State: state, CreatedAt: created}
		for _, m := range mod {
			m(c)
		}
		return c
	}
	startedC := func(c *api.Container) { c.StartedAt = started; c.Pid = 1234 }
	exited := func(code int32) func(*api.Container) {
		return func(c *api.Container) { c.StartedAt = started; c.FinishedAt = finished; c.ExitCode = code; c.Pid = 0 }
	}
	reason := func(r, m string) func(*api.Container) {
		return func(c *api.Container) { c.StatusReason = r; c.StatusMessage = m }
	}
	obs := func(src pleg.Source, ph pleg.Phase, mod ...func(*pleg.Observation)) pleg.Observation {
		o := pleg.Observation{Source: src, Kind: pleg.KindContainer, ID: "c1", SandboxID: "sb1", Phase: ph,
			CreatedAt: time.Unix(0, created), SourceTime: at}
		for _, m := range mod {
			m(&o)
		}
		return o
	}
	oStarted := func(o *pleg.Observation) { o.StartedAt = time.Unix(0, started) }
	oExit := func(code int32) func(*pleg.Observation) {
		return func(o *pleg.Observation) {
			o.StartedAt = time.Unix(0, started)
			o.FinishedAt = time.Unix(0, finished)
			o.ExitCode, o.HasExitCode = code, true
		}
	}
	nri, sync := pleg.SourceNRI, pleg.SourceNRISync

	for _, tc := range []struct {
		name string
		cb   Callback
		pod  *api.PodSandbox
		ctr  *api.Container
		want pleg.Observation
		ok   bool
	}{
		{"post-create", CallbackPostCreateContainer, pod, ctr(api.ContainerState_CONTAINER_CREATED),
			obs(nri, pleg.PhaseCreated), true},
		{"post-start", CallbackPostStartContainer, pod, ctr(api.ContainerState_CONTAINER_RUNNING, startedC),
			obs(nri, pleg.PhaseRunning, oStarted), true},
		{"post-start, runtime without times", CallbackPostStartContainer, pod,
			&api.Container{Id: "c1", PodSandboxId: "sb1"},
			pleg.Observation{Source: nri, Kind: pleg.KindContainer, ID: "c1", SandboxID: "sb1", Phase: pleg.PhaseRunning, SourceTime: at}, true},
		// containerd's exit path: NotifyContainerExit reports STOPPED with the exit event's time and status.
		{"stop after own exit", CallbackStopContainer, pod, ctr(api.ContainerState_CONTAINER_STOPPED, exited(137)),
			obs(nri, pleg.PhaseExited, oExit(137)), true},
		// containerd's CRI StopContainer path: the CRI state is EXITED, which GetStatus reports as UNKNOWN.
		{"stop after CRI stop", CallbackStopContainer, pod, ctr(api.ContainerState_CONTAINER_UNKNOWN, exited(0)),
			obs(nri, pleg.PhaseExited, oExit(0)), true},
		{"stop, OOM killed", CallbackStopContainer, pod,
			ctr(api.ContainerState_CONTAINER_STOPPED, exited(137), reason("OOMKilled", "out of memory")),
			obs(nri, pleg.PhaseExited, oExit(137), func(o *pleg.Observation) {
				o.OOMKilled, o.Reason, o.Message = true, "OOMKilled", "out of memory"
			}), true},
		{"stop, reason Error", CallbackStopContainer, pod,
			ctr(api.ContainerState_CONTAINER_UNKNOWN, exited(1), reason("Error", "")),
			obs(nri, pleg.PhaseExited, oExit(1), func(o *pleg.Observation) { o.Reason = "Error" }), true},
		{"stop, STOPPED without exit facts", CallbackStopContainer, pod,
			&api.Container{Id: "c1", PodSandboxId: "sb1", State: api.ContainerState_CONTAINER_STOPPED},
			pleg.Observation{Source: nri, Kind: pleg.KindContainer, ID: "c1", SandboxID: "sb1", Phase: pleg.PhaseExited, SourceTime: at}, true},
		// A never-started container, a failed start (container_start.go defer), an undone create.
		{"stop, never started", CallbackStopContainer, pod, ctr(api.ContainerState_CONTAINER_CREATED), pleg.Observation{}, false},
		{"stop, undone create", CallbackStopContainer, pod, &api.Container{Id: "c1"}, pleg.Observation{}, false},
		{"stop, running", CallbackStopContainer, pod, ctr(api.ContainerState_CONTAINER_RUNNING, startedC), pleg.Observation{}, false},
		{"remove", CallbackRemoveContainer, pod, ctr(api.ContainerState_CONTAINER_UNKNOWN, exited(0)),
			obs(nri, pleg.PhaseRemoved, oStarted), true},
		{"sandbox id from the pod", CallbackRemoveContainer, pod, &api.Container{Id: "c1"},
			pleg.Observation{Source: nri, Kind: pleg.KindContainer, ID: "c1", SandboxID: "sb1", Phase: pleg.PhaseRemoved, SourceTime: at}, true},
		{"sync created", CallbackSynchronize, nil, ctr(api.ContainerState_CONTAINER_CREATED), obs(sync, pleg.PhaseCreated), true},
		{"sync running", CallbackSynchronize, nil, ctr(api.ContainerState_CONTAINER_RUNNING, startedC), obs(sync, pleg.PhaseRunning, oStarted), true},
		{"sync paused", CallbackSynchronize, nil, ctr(api.ContainerState_CONTAINER_PAUSED, startedC), obs(sync, pleg.PhaseRunning, oStarted), true},
		{"sync stopped", CallbackSynchronize, nil, ctr(api.ContainerState_CONTAINER_STOPPED, exited(2)), obs(sync, pleg.PhaseExited, oExit(2)), true},
		{"sync unknown, exited", CallbackSynchronize, nil, ctr(api.ContainerState_CONTAINER_UNKNOWN, exited(2)), obs(sync, pleg.PhaseExited, oExit(2)), true},
		{"sync unknown", CallbackSynchronize, nil, ctr(api.ContainerState_CONTAINER_UNKNOWN), obs(sync, pleg.PhaseNone), true},
		// The cgroup, for the OOM check of an exit with status 137 (issue 11).
		{"post-create, cgroup", CallbackPostCreateContainer, pod,
			ctr(api.ContainerState_CONTAINER_CREATED, func(c *api.Container) {
				c.Linux = &api.LinuxContainer{CgroupsPath: "kubepods-pod1.slice:cri-containerd:c1"}
			}),
			obs(nri, pleg.PhaseCreated, func(o *pleg.Observation) { o.CgroupsPath = "kubepods-pod1.slice:cri-containerd:c1" }), true},
		// UpdateContainerResources (issue 11): no phase, the CRI status is asked again.
		{"post-update", CallbackPostUpdateContainer, pod, ctr(api.ContainerState_CONTAINER_RUNNING, startedC),
			obs(nri, pleg.PhaseNone, oStarted, func(o *pleg.Observation) { o.StatusChanged = true }), true},
		{"nil container", CallbackPostStartContainer, pod, nil, pleg.Observation{}, false},
		{"no id", CallbackPostStartContainer, pod, &api.Container{PodSandboxId: "sb1"}, pleg.Observation{}, false},
		{"sandbox callback", CallbackRunPodSandbox, pod, ctr(api.ContainerState_CONTAINER_RUNNING), pleg.Observation{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ConvertContainer(tc.cb, tc.pod, tc.ctr, at)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("observation (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCallbackNames(t *testing.T) {
	seen := map[string]bool{}
	for _, cb := range Callbacks() {
		name := cb.String()
		if name == "unknown" || seen[name] {
			t.Errorf("callback %d: name %q unknown or duplicate", cb, name)
		}
		seen[name] = true
	}
	if got := Callback(200).String(); got != "unknown" {
		t.Errorf("Callback(200) = %q", got)
	}
}

// checkInvariants fails t when an observation the conversion accepted is malformed.
func checkInvariants(t *testing.T, o pleg.Observation, kind pleg.Kind, id string, at time.Time) {
	t.Helper()
	if o.ID == "" || o.ID != id {
		t.Fatalf("ID = %q, want %q", o.ID, id)
	}
	if o.Kind != kind {
		t.Fatalf("Kind = %s, want %s", o.Kind, kind)
	}
	if o.Phase > pleg.PhaseRemoved {
		t.Fatalf("phase %s out of range", o.Phase)
	}
	if o.Source != pleg.SourceNRI && o.Source != pleg.SourceNRISync {
		t.Fatalf("source %s", o.Source)
	}
	if !o.SourceTime.Equal(at) {
		t.Fatalf("SourceTime = %v, want %v", o.SourceTime, at)
	}
	if kind == pleg.KindSandbox && o.SandboxID != o.ID {
		t.Fatalf("sandbox SandboxID = %q, want its ID %q", o.SandboxID, o.ID)
	}
	if o.HasExitCode && o.Phase != pleg.PhaseExited {
		t.Fatalf("exit code on a %s observation", o.Phase)
	}
	if o.OOMKilled && o.Reason != oomKilledReason {
		t.Fatalf("OOMKilled with reason %q", o.Reason)
	}
	if o.SandboxStatus != nil || o.ContainerStatus != nil {
		t.Fatal("NRI observation carries a CRI status")
	}
	for _, ts := range []time.Time{o.CreatedAt, o.StartedAt, o.FinishedAt} {
		if !ts.IsZero() && ts.UnixNano() <= 0 {
			t.Fatalf("time %v not positive", ts)
		}
	}
}

func FuzzConvertContainer(f *testing.F) {
	f.Add(uint8(CallbackStopContainer), "c1", "sb1", "sb1", int32(api.ContainerState_CONTAINER_STOPPED), created, started, finished, int32(137), "OOMKilled", "msg")
	f.Add(uint8(CallbackSynchronize), "c1", "", "", int32(api.ContainerState_CONTAINER_UNKNOWN), int64(0), int64(-1), int64(5), int32(-1), "", "")
	f.Add(uint8(CallbackPostStartContainer), "", "sb1", "sb2", int32(99), int64(1), int64(2), int64(3), int32(0), "Error", "")
	f.Fuzz(func(t *testing.T, cb uint8, id, ctrSandbox, podID string, state int32, cAt, sAt, fAt int64, code int32, reason, msg string) {
		var pod *api.PodSandbox
		if podID != "" {
			pod = &api.PodSandbox{Id: podID}
		}
		ctr := &api.Container{Id: id, PodSandboxId: ctrSandbox, State: api.ContainerState(state), CreatedAt: cAt,
			StartedAt: sAt, FinishedAt: fAt, ExitCode: code, StatusReason: reason, StatusMessage: msg}
		o, ok := ConvertContainer(Callback(cb), pod, ctr, at)
		if !ok {
			return
		}
		checkInvariants(t, o, pleg.KindContainer, id, at)
		if o.SandboxID != ctrSandbox && (ctrSandbox != "" || o.SandboxID != podID) {
			t.Fatalf("SandboxID = %q from container %q, pod %q", o.SandboxID, ctrSandbox, podID)
		}
		if Callback(cb) == CallbackStopContainer && o.Phase != pleg.PhaseExited {
			t.Fatalf("StopContainer gave %s", o.Phase)
		}
	})
}

func FuzzConvertPodSandbox(f *testing.F) {
	f.Add(uint8(CallbackRunPodSandbox), "sb1", uint32(42))
	f.Add(uint8(CallbackSynchronize), "sb1", uint32(0))
	f.Add(uint8(CallbackStopContainer), "", uint32(0))
	f.Fuzz(func(t *testing.T, cb uint8, id string, pid uint32) {
		o, ok := ConvertPodSandbox(Callback(cb), &api.PodSandbox{Id: id, Pid: pid}, at)
		if !ok {
			return
		}
		checkInvariants(t, o, pleg.KindSandbox, id, at)
	})
}

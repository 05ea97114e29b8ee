package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// faults break the fake runtime's stream (or its reads) in one way each, for the self-tests.
type faults struct {
	// drop, if set, drops the events it returns true for (name: the container's name, or "sandbox").
	drop func(name string, typ runtimeapi.ContainerEventType) bool
	// duplicate, if set, sends the events it returns true for twice.
	duplicate func(name string, typ runtimeapi.ContainerEventType) bool
	// reorder is a container whose CREATED is held back and sent after its STARTED.
	reorder string
	// leaveOutExited leaves exited containers out of containers_statuses.
	leaveOutExited bool
	// queue, if set, is each subscriber's queue once a send to it has been blocked for 20 ms (a
	// consumer that does not read blocks it for good): an event that does not fit is dropped silently.
	queue int
	// seconds sends created_at in seconds.
	seconds bool
	// nilPodStatus sends events without pod_sandbox_status.
	nilPodStatus bool
	// sandboxIDPrefix is prefixed to a sandbox event's container_id.
	sandboxIDPrefix string
	// wrongReason says Completed for every exit.
	wrongReason bool
	// staleList makes ListContainers say RUNNING for an exited container.
	staleList bool
	// timestampAlone sets PodSandboxStatus's timestamp without containers_statuses.
	timestampAlone bool
	// sandboxStopFirst sends the sandbox's STOPPED before its containers' on StopPodSandbox.
	sandboxStopFirst bool
	// subscribeErr, if set, ends every stream at once with it (io.EOF: a nil return).
	subscribeErr error
	// endAtOnce ends every stream at once with io.EOF.
	endAtOnce bool
	// pauseStopTwice leaves a sandbox READY after its pause process was killed, so StopPodSandbox
	// sends its STOPPED again.
	pauseStopTwice bool
	// restart is how the streams take a restart of the runtime (restartEnds by default).
	restart restartMode
	// forgetWhileDown makes a restarted runtime miss what happened while it was down: a container
	// killed then still says RUNNING.
	forgetWhileDown bool
	// holdUnheard keeps the events sent while nobody listens and sends them to the next subscriber
	// first (as containerd does for 5 minutes); replayTwice sends them twice, replayReversed newest
	// first.
	holdUnheard, replayTwice, replayReversed bool
	// lateHang leaves a stream that got held events silent after them.
	lateHang bool
	// logUnheard logs a line for each event sent while nobody listens.
	logUnheard bool
	// delay is slept in each RunPodSandbox and RemovePodSandbox: a runtime that takes its time, so
	// that a blocked send to a consumer that does not read lasts long enough to count as stuck.
	delay time.Duration
	// onRunPod is called after each RunPodSandbox.
	onRunPod func()
	// removedAfterStatus removes a container once ContainerStatus answered for it: a removal between
	// two reads.
	removedAfterStatus bool
	// systemd makes the fake a runtime of the systemd cgroup driver (RuntimeConfig says so), which
	// refuses a sandbox without a parent slice, as runc does.
	systemd bool
}

// restartMode is how the fake's streams take a restart of the runtime.
type restartMode int

const (
	// restartEnds ends every stream with Unavailable (containerd's).
	restartEnds restartMode = iota
	// restartHangs leaves every stream open, and silent from then on.
	restartHangs
	// restartSurvives leaves every stream open; what happens while the runtime is down is sent once it
	// is back (pleg-nri's).
	restartSurvives
	// restartSurvivesForgetful leaves every stream open, but never sends what happened while the
	// runtime was down.
	restartSurvivesForgetful
)

type fakePod struct {
	// pid is its pause process's pid, for the verbose status and killPause.
	pid     int
	cfg     *runtimeapi.PodSandboxConfig
	id      string
	state   runtimeapi.PodSandboxState
	created int64
}

type fakeCtr struct {
	cfg                        *runtimeapi.ContainerConfig
	id, podID                  string
	state                      runtimeapi.ContainerState
	created, started, finished int64
	exitCode                   int32
	reason                     string
	// pid is its process's pid, for the verbose status and kill.
	pid int
}

// fakeRuntime is a CRI runtime in memory with an event stream: busybox's `sh -c "exit N"` exits with
// N at once, `exec tail /dev/zero` is OOM-killed, a command under /pleg-nri-conformance-no-such fails
// to start, anything else runs until stopped.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	f faults

	// mu guards everything below; events are sent under it, so they are in the order of the changes.
	mu   sync.Mutex
	pods map[string]*fakePod
	ctrs map[string]*fakeCtr
	subs map[*fakeSub]bool
	held *runtimeapi.ContainerEventResponse
	last int64
	pids int
	// down says the runtime is stopped (restart); whileDown are the events of that time that
	// restartSurvives sends once it is back.
	down      bool
	whileDown []*runtimeapi.ContainerEventResponse
	// unheard are the events sent while nobody listened (holdUnheard).
	unheard []*runtimeapi.ContainerEventResponse
	// parents are the cgroup parents of every RunPodSandbox, in order.
	parents []string
	// lines counts the lines the fake "logged": one per CRI call that changes something, one per
	// event sent to nobody with logUnheard.
	lines int
}

// logLines is Options.LogLines of the fake.
func (fr *fakeRuntime) logLines() (int, error) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	return fr.lines, nil
}

// kill kills the process pid: a pause process's sandbox stops (twice with faults.pauseStopTwice), a
// container's exits with 137 (with forgetWhileDown, a container killed while the runtime is down
// stays RUNNING).
func (fr *fakeRuntime) kill(pid int, _ string) error {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	for _, p := range fr.pods {
		if p.pid == pid {
			p.state = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
			fr.emit(p.id, p.id, "sandbox", stopped)
			if fr.f.pauseStopTwice {
				p.state = runtimeapi.PodSandboxState_SANDBOX_READY
			}
			return nil
		}
	}
	for _, c := range fr.ctrs {
		if c.pid == pid && c.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
			if !(fr.down && fr.f.forgetWhileDown) {
				fr.exitLocked(c.id, 137, "")
			}
			return nil
		}
	}
	return syscall.ESRCH
}

// fakeSub is one subscriber: its queue, unbounded unless faults.queue.
type fakeSub struct {
	mu    sync.Mutex
	queue []*runtimeapi.ContainerEventResponse
	wake  chan struct{}
	// sending is when the send in progress began (zero: none).
	sending time.Time
	// ended ends the stream with Unavailable (a restart of the runtime).
	ended bool
}

// restart stops the runtime, calls whileDown and starts it again: the streams take it as
// faults.restart says.
func (fr *fakeRuntime) restart(ctx context.Context, whileDown func(context.Context) error) error {
	fr.mu.Lock()
	fr.down = true
	if fr.f.restart == restartEnds || fr.f.restart == restartHangs {
		for s := range fr.subs {
			delete(fr.subs, s)
			if fr.f.restart == restartEnds {
				s.mu.Lock()
				s.ended = true
				s.mu.Unlock()
				select {
				case s.wake <- struct{}{}:
				default:
				}
			}
		}
	}
	fr.mu.Unlock()
	err := whileDown(ctx)
	fr.mu.Lock()
	defer fr.mu.Unlock()
	fr.down = false
	for _, ev := range fr.whileDown {
		fr.send(ev)
	}
	fr.whileDown = nil
	return err
}

func newFake(t *testing.T, f faults) (*fakeRuntime, string) {
	t.Helper()
	fr := &fakeRuntime{f: f, pods: map[string]*fakePod{}, ctrs: map[string]*fakeCtr{}, subs: map[*fakeSub]bool{}}
	path := filepath.Join(testutil.ShortTempDir(t, "conf-"), "cri.sock")
	testutil.ServeGRPC(t, path, func(s *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(s, fr) })
	return fr, "unix://" + path
}

func newID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// stamp is a created_at that never goes back, even on a coarse clock.
func (fr *fakeRuntime) stamp() int64 {
	n := time.Now().UnixNano()
	if n <= fr.last {
		n = fr.last + 1
	}
	fr.last = n
	return n
}

func (fr *fakeRuntime) podStatus(p *fakePod) *runtimeapi.PodSandboxStatus {
	return &runtimeapi.PodSandboxStatus{Id: p.id, Metadata: p.cfg.Metadata, State: p.state, CreatedAt: p.created,
		Labels: p.cfg.Labels, Annotations: p.cfg.Annotations}
}

func (fr *fakeRuntime) ctrStatus(c *fakeCtr) *runtimeapi.ContainerStatus {
	return &runtimeapi.ContainerStatus{Id: c.id, Metadata: c.cfg.Metadata, State: c.state, CreatedAt: c.created,
		StartedAt: c.started, FinishedAt: c.finished, ExitCode: c.exitCode, Reason: c.reason, Image: c.cfg.Image}
}

func (fr *fakeRuntime) statusesOf(podID string) []*runtimeapi.ContainerStatus {
	var out []*runtimeapi.ContainerStatus
	for _, c := range fr.ctrs {
		if c.podID == podID && !(fr.f.leaveOutExited && c.state == runtimeapi.ContainerState_CONTAINER_EXITED) {
			out = append(out, fr.ctrStatus(c))
		}
	}
	return out
}

// emit sends an event about id (a container, or the sandbox when id == podID) to every subscriber.
func (fr *fakeRuntime) emit(id, podID, name string, typ runtimeapi.ContainerEventType) {
	if fr.f.drop != nil && fr.f.drop(name, typ) {
		return
	}
	p := fr.pods[podID]
	ev := &runtimeapi.ContainerEventResponse{ContainerId: id, ContainerEventType: typ, CreatedAt: fr.stamp(),
		ContainersStatuses: fr.statusesOf(podID)}
	if !fr.f.nilPodStatus {
		ev.PodSandboxStatus = fr.podStatus(p)
	}
	if fr.f.seconds {
		ev.CreatedAt /= 1e9
	}
	if id == podID {
		ev.ContainerId = fr.f.sandboxIDPrefix + id
	}
	if name == fr.f.reorder && typ == created {
		fr.held = ev
		return
	}
	if fr.down {
		if fr.f.restart == restartSurvives {
			fr.whileDown = append(fr.whileDown, ev)
		}
		return
	}
	fr.send(ev)
	if fr.f.duplicate != nil && fr.f.duplicate(name, typ) {
		fr.send(ev)
	}
	if name == fr.f.reorder && typ == started && fr.held != nil {
		fr.send(fr.held)
		fr.held = nil
	}
}

func (fr *fakeRuntime) send(ev *runtimeapi.ContainerEventResponse) {
	if len(fr.subs) == 0 {
		if fr.f.logUnheard {
			fr.lines++
		}
		if fr.f.holdUnheard {
			fr.unheard = append(fr.unheard, ev)
		}
	}
	for s := range fr.subs {
		s.mu.Lock()
		stuck := !s.sending.IsZero() && time.Since(s.sending) > 20*time.Millisecond
		if fr.f.queue == 0 || !stuck || len(s.queue) < fr.f.queue {
			s.queue = append(s.queue, ev)
		}
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

func (fr *fakeRuntime) GetContainerEvents(_ *runtimeapi.GetEventsRequest, stream runtimeapi.RuntimeService_GetContainerEventsServer) error {
	if fr.f.endAtOnce {
		return nil
	}
	if fr.f.subscribeErr != nil {
		return fr.f.subscribeErr
	}
	s := &fakeSub{wake: make(chan struct{}, 1)}
	fr.mu.Lock()
	replay := fr.unheard
	fr.unheard = nil
	if fr.f.replayReversed {
		slices.Reverse(replay)
	}
	if fr.f.replayTwice {
		replay = append(replay, replay...)
	}
	s.queue = replay
	if !(fr.f.lateHang && len(replay) > 0) {
		fr.subs[s] = true
	}
	fr.mu.Unlock()
	defer func() {
		fr.mu.Lock()
		delete(fr.subs, s)
		fr.mu.Unlock()
	}()
	for {
		s.mu.Lock()
		q, ended := s.queue, s.ended
		s.queue = nil
		s.mu.Unlock()
		if ended {
			return status.Error(codes.Unavailable, "the runtime restarted")
		}
		for _, ev := range q {
			s.mu.Lock()
			s.sending = time.Now()
			s.mu.Unlock()
			err := stream.Send(ev)
			s.mu.Lock()
			s.sending = time.Time{}
			s.mu.Unlock()
			if err != nil {
				return err
			}
		}
		select {
		case <-s.wake:
		case <-stream.Context().Done():
			return nil
		}
	}
}

func (fr *fakeRuntime) RuntimeConfig(context.Context, *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	driver := runtimeapi.CgroupDriver_CGROUPFS
	if fr.f.systemd {
		driver = runtimeapi.CgroupDriver_SYSTEMD
	}
	return &runtimeapi.RuntimeConfigResponse{Linux: &runtimeapi.LinuxRuntimeConfiguration{CgroupDriver: driver}}, nil
}

func (fr *fakeRuntime) RunPodSandbox(_ context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	parent := req.GetConfig().GetLinux().GetCgroupParent()
	fr.mu.Lock()
	fr.parents = append(fr.parents, parent)
	fr.mu.Unlock()
	if fr.f.systemd && !strings.HasSuffix(parent, ".slice") {
		return nil, fmt.Errorf(`runc create failed: expected cgroupsPath to be of format "slice:prefix:name" for systemd cgroups, got %q`, parent)
	}
	time.Sleep(fr.f.delay)
	fr.mu.Lock()
	fr.lines++
	fr.pids++
	p := &fakePod{pid: 1000 + fr.pids, cfg: req.Config, id: newID(), state: runtimeapi.PodSandboxState_SANDBOX_READY, created: time.Now().UnixNano()}
	fr.pods[p.id] = p
	fr.emit(p.id, p.id, "sandbox", created)
	fr.emit(p.id, p.id, "sandbox", started)
	fr.mu.Unlock()
	if fr.f.onRunPod != nil {
		fr.f.onRunPod()
	}
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: p.id}, nil
}

func (fr *fakeRuntime) CreateContainer(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	fr.mu.Lock()
	fr.lines++
	defer fr.mu.Unlock()
	if fr.pods[req.PodSandboxId] == nil {
		return nil, status.Errorf(codes.NotFound, "pod %s", req.PodSandboxId)
	}
	c := &fakeCtr{cfg: req.Config, id: newID(), podID: req.PodSandboxId, state: runtimeapi.ContainerState_CONTAINER_CREATED, created: time.Now().UnixNano()}
	fr.ctrs[c.id] = c
	fr.emit(c.id, c.podID, c.cfg.Metadata.Name, created)
	return &runtimeapi.CreateContainerResponse{ContainerId: c.id}, nil
}

func (fr *fakeRuntime) StartContainer(_ context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	fr.mu.Lock()
	fr.lines++
	defer fr.mu.Unlock()
	c := fr.ctrs[req.ContainerId]
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "container %s", req.ContainerId)
	}
	cmd := c.cfg.Command
	if strings.HasPrefix(cmd[0], "/pleg-nri-conformance-no-such") {
		c.state, c.finished, c.exitCode, c.reason = runtimeapi.ContainerState_CONTAINER_EXITED, time.Now().UnixNano(), 128, "StartError"
		return nil, status.Errorf(codes.Unknown, "exec: %q: no such file or directory", cmd[0])
	}
	fr.pids++
	c.state, c.started, c.pid = runtimeapi.ContainerState_CONTAINER_RUNNING, time.Now().UnixNano(), 1000+fr.pids
	fr.emit(c.id, c.podID, c.cfg.Metadata.Name, started)
	script := ""
	if len(cmd) == 3 && cmd[0] == "sh" {
		script = cmd[2]
	}
	switch {
	case strings.HasPrefix(script, "exit "):
		code, _ := strconv.Atoi(strings.TrimPrefix(script, "exit "))
		time.AfterFunc(5*time.Millisecond, func() { fr.exit(c.id, int32(code), "") })
	case strings.Contains(script, "tail /dev/zero"):
		time.AfterFunc(5*time.Millisecond, func() { fr.exit(c.id, 137, "OOMKilled") })
	}
	return &runtimeapi.StartContainerResponse{}, nil
}

func (fr *fakeRuntime) exit(id string, code int32, reason string) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	fr.exitLocked(id, code, reason)
}

func (fr *fakeRuntime) exitLocked(id string, code int32, reason string) {
	c := fr.ctrs[id]
	if c == nil || c.state != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return
	}
	if reason == "" {
		reason = "Error"
		if code == 0 {
			reason = "Completed"
		}
	}
	if fr.f.wrongReason {
		reason = "Completed"
	}
	c.state, c.finished, c.exitCode, c.reason = runtimeapi.ContainerState_CONTAINER_EXITED, time.Now().UnixNano(), code, reason
	fr.emit(c.id, c.podID, c.cfg.Metadata.Name, stopped)
}

func (fr *fakeRuntime) StopContainer(_ context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	fr.mu.Lock()
	fr.lines++
	defer fr.mu.Unlock()
	if fr.ctrs[req.ContainerId] == nil {
		return nil, status.Errorf(codes.NotFound, "container %s", req.ContainerId)
	}
	fr.exitLocked(req.ContainerId, 137, "")
	return &runtimeapi.StopContainerResponse{}, nil
}

func (fr *fakeRuntime) RemoveContainer(_ context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	fr.mu.Lock()
	fr.lines++
	defer fr.mu.Unlock()
	fr.removeLocked(req.ContainerId)
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (fr *fakeRuntime) removeLocked(id string) {
	c := fr.ctrs[id]
	if c == nil {
		return
	}
	fr.exitLocked(id, 137, "")
	delete(fr.ctrs, id)
	fr.emit(c.id, c.podID, c.cfg.Metadata.Name, deleted)
}

func (fr *fakeRuntime) StopPodSandbox(_ context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	fr.mu.Lock()
	fr.lines++
	defer fr.mu.Unlock()
	p := fr.pods[req.PodSandboxId]
	if p == nil {
		return nil, status.Errorf(codes.NotFound, "pod %s", req.PodSandboxId)
	}
	if p.state != runtimeapi.PodSandboxState_SANDBOX_READY {
		return &runtimeapi.StopPodSandboxResponse{}, nil
	}
	stopPod := func() {
		p.state = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
		fr.emit(p.id, p.id, "sandbox", stopped)
	}
	if fr.f.sandboxStopFirst {
		stopPod()
	}
	for _, c := range fr.ctrs {
		if c.podID == p.id {
			fr.exitLocked(c.id, 137, "")
		}
	}
	if !fr.f.sandboxStopFirst {
		stopPod()
	}
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (fr *fakeRuntime) RemovePodSandbox(_ context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	time.Sleep(fr.f.delay)
	fr.mu.Lock()
	fr.lines++
	defer fr.mu.Unlock()
	p := fr.pods[req.PodSandboxId]
	if p == nil {
		return &runtimeapi.RemovePodSandboxResponse{}, nil
	}
	for _, c := range fr.ctrs {
		if c.podID == p.id {
			fr.removeLocked(c.id)
		}
	}
	fr.emit(p.id, p.id, "sandbox", deleted)
	delete(fr.pods, p.id)
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func (fr *fakeRuntime) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	c := fr.ctrs[req.ContainerId]
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "container %s", req.ContainerId)
	}
	resp := &runtimeapi.ContainerStatusResponse{Status: fr.ctrStatus(c)}
	if fr.f.removedAfterStatus {
		delete(fr.ctrs, c.id)
	}
	if req.Verbose && c.pid != 0 {
		resp.Info = map[string]string{"info": fmt.Sprintf(`{"pid": %d}`, c.pid)}
	}
	return resp, nil
}

func (fr *fakeRuntime) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	var out []*runtimeapi.Container
	for _, c := range fr.ctrs {
		if id := req.GetFilter().GetId(); id != "" && id != c.id {
			continue
		}
		st := c.state
		if fr.f.staleList && st == runtimeapi.ContainerState_CONTAINER_EXITED {
			st = runtimeapi.ContainerState_CONTAINER_RUNNING
		}
		out = append(out, &runtimeapi.Container{Id: c.id, PodSandboxId: c.podID, Metadata: c.cfg.Metadata, State: st})
	}
	return &runtimeapi.ListContainersResponse{Containers: out}, nil
}

func (fr *fakeRuntime) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	p := fr.pods[req.PodSandboxId]
	if p == nil {
		return nil, status.Errorf(codes.NotFound, "pod %s", req.PodSandboxId)
	}
	resp := &runtimeapi.PodSandboxStatusResponse{Status: fr.podStatus(p), Timestamp: time.Now().UnixNano()}
	if req.Verbose {
		resp.Info = map[string]string{"info": fmt.Sprintf(`{"pid": %d}`, p.pid)}
	}
	if !fr.f.timestampAlone {
		resp.ContainersStatuses = fr.statusesOf(p.id)
	}
	return resp, nil
}

func (fr *fakeRuntime) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	var out []*runtimeapi.PodSandbox
	for _, p := range fr.pods {
		match := true
		for k, v := range req.GetFilter().GetLabelSelector() {
			if p.cfg.Labels[k] != v {
				match = false
			}
		}
		if match {
			out = append(out, &runtimeapi.PodSandbox{Id: p.id, Metadata: p.cfg.Metadata, State: p.state, Labels: p.cfg.Labels})
		}
	}
	return &runtimeapi.ListPodSandboxResponse{Items: out}, nil
}

// podCount is the number of pods the fake holds.
func (fr *fakeRuntime) podCount() int {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	return len(fr.pods)
}

var _ runtimeapi.RuntimeServiceServer = (*fakeRuntime)(nil)

// String names the fake in failures.
func (fr *fakeRuntime) String() string { return fmt.Sprintf("fake runtime (%d pods)", fr.podCount()) }

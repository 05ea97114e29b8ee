package pleg

// The kubelet's reads answered from the state: ListPodSandbox, ListContainers, PodSandboxStatus and
// ContainerStatus (not verbose), when the state is known to be current for what is asked. The CRI
// endpoint asks (endpoint.StateReader) and asks containerd when the answer is "not current".
//
// The rule that makes the state current (docs/internals.md, "Reads answered from the state"):
//
//  1. Nothing was missed. containerd calls NRI's hooks synchronously, and the hook's observation is in
//     the inbox before containerd goes on: a create, a start, a stop, an exit (NRI's StopContainer
//     from containerd's exit handler, before it updates its status), a removal, an update. A read first
//     applies the inbox (drain), so it sees every hook containerd made before the read. That holds
//     only while every input is live and was reconciled since it (re)connected: Config.Inputs says the
//     NRI connection and the task event subscription are up, and its generation (bumped by every
//     reconnection) must be the one a relist, completed since, read before it listed; the startup
//     reconciliation (the first relist, after a checkpoint's state was loaded) must be done; and the
//     last relist must have found nothing to repair (a repair says an input missed something: the state
//     is trusted again after a relist that repairs nothing).
//  2. What is asked is settled: each object the answer covers has containerd's own status, taken in
//     this process's life (not only restored from the checkpoint), all its events are emitted, no
//     status call about it is outstanding (a first status, a retry, a refresh after an update, an OOM
//     check, an exit verification), and its state is containerd's: an exit pleg-nri reported is only
//     settled once containerd's status shows it (a container's exit verification, a sandbox's
//     confirmation). For a list, every object of the state is settled, and no task event of an id the
//     state does not know yet is held.
//  3. What containerd shows between an NRI hook and the CRI call's answer (a StartContainer's new
//     state before its PostStartContainer hook, a removed container still listed after the
//     RemoveContainer hook, a CreateContainer's container in the store before PostCreateContainer) is
//     the endpoint's part: it forwards the reads a mutating call in flight through it may change
//     (kubelet.ProxyConfig.ReadSource).
//
// An answer built from the state is what containerd answers: each status is the one events carry
// (containerd's answer with the facts of the fast inputs applied), a list entry is containerd's own
// list entry (from a relist, or the filtered list asked for a new container) with the state's state,
// filters are applied as containerd's (exact ids only: a truncated id is forwarded), and an unknown id
// is forwarded (containerd answers NotFound). Lists come sorted by creation time then id: containerd's
// order is its store's map order, which differs from one call to the next.

import (
	"cmp"
	"context"
	"slices"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// InputState reports whether every input that tells the state about containerd's changes is live (the
// NRI plugin is registered, the task event subscription is up), and a generation that changes each time
// one of them (re)connects.
type InputState func() (live bool, generation uint64)

// SandboxResponseSource is a StatusSource that also gives the whole (non-verbose) PodSandboxStatus
// answer: its info map, which containerd fills even when not verbose, is part of what a read gets.
type SandboxResponseSource interface {
	PodSandboxStatusResponse(ctx context.Context, id string) (*runtimeapi.PodSandboxStatusResponse, error)
}

// ContainerEntrySource lists one container (ListContainers filtered on its id): a list entry holds
// the image spec of the container's config, which its status does not.
type ContainerEntrySource interface {
	ListContainer(ctx context.Context, id string) (*runtimeapi.Container, error)
}

// readable says whether the state is current as a whole (rule 1); p.mu is held and the inbox applied.
func (p *PLEG) readable() bool {
	if !p.cfg.ServeReads || !p.startupDone.Load() || p.st.repaired || p.cfg.Inputs == nil {
		return false
	}
	live, gen := p.cfg.Inputs()
	return live && p.st.relistGen == gen && p.st.relisted
}

// readLocked takes p.mu, applies the inbox and reports whether the state is current as a whole; the
// caller unlocks p.mu.
func (p *PLEG) readLocked(ctx context.Context) bool {
	p.mu.Lock()
	p.drainLocked(ctx)
	return p.readable()
}

// settled says whether o's status in the state is containerd's current answer (rule 2).
func settled(o *object) bool {
	if o.dropped || o.pod.dropped || o.restored || o.emitted != o.phase || o.queued || o.needCorrection ||
		o.fetching || o.verifying || o.stale || o.refreshing || o.oomChecking || o.fetchGaveUp {
		return false
	}
	switch o.kind {
	case KindContainer:
		if o.ctrAnswer == nil || o.ctrSent == nil || !o.complete {
			return false
		}
		switch o.phase {
		case PhaseCreated:
			return o.ctrSent.State == runtimeapi.ContainerState_CONTAINER_CREATED
		case PhaseRunning:
			return o.ctrSent.State == runtimeapi.ContainerState_CONTAINER_RUNNING
		case PhaseExited:
			// Only containerd's own exit: it updates its status after its exit handling.
			return o.ctrAnswer.State == runtimeapi.ContainerState_CONTAINER_EXITED
		}
	case KindSandbox:
		if o.sbAnswer == nil || o.sbSent == nil {
			return false
		}
		switch o.phase {
		case PhaseRunning:
			return o.sbSent.State == runtimeapi.PodSandboxState_SANDBOX_READY
		case PhaseExited:
			return o.sbAnswer.State == runtimeapi.PodSandboxState_SANDBOX_NOTREADY
		}
	}
	return false
}

// ContainerStatus answers a non-verbose ContainerStatus of a container the state knows by its full id,
// when its status is current; ok is false otherwise (the caller asks containerd).
func (p *PLEG) ContainerStatus(ctx context.Context, r *runtimeapi.ContainerStatusRequest) (_ *runtimeapi.ContainerStatusResponse, ok bool) {
	if r.GetVerbose() {
		return nil, false
	}
	defer p.mu.Unlock()
	if !p.readLocked(ctx) {
		return nil, false
	}
	o := p.st.objects[r.GetContainerId()]
	if o == nil || o.kind != KindContainer || !settled(o) {
		return nil, false
	}
	return &runtimeapi.ContainerStatusResponse{Status: o.ctrSent}, true
}

// PodSandboxStatus answers a non-verbose PodSandboxStatus of a sandbox the state knows by its full id,
// when its status is current; ok is false otherwise. A stopped sandbox whose status still has its IPs
// is not current: containerd drops them when StopPodSandbox tears the network down, which no input
// reports.
func (p *PLEG) PodSandboxStatus(ctx context.Context, r *runtimeapi.PodSandboxStatusRequest) (_ *runtimeapi.PodSandboxStatusResponse, ok bool) {
	if r.GetVerbose() {
		return nil, false
	}
	defer p.mu.Unlock()
	if !p.readLocked(ctx) {
		return nil, false
	}
	o := p.st.objects[r.GetPodSandboxId()]
	if o == nil || o.kind != KindSandbox || !settled(o) || o.info == nil {
		return nil, false
	}
	if o.phase == PhaseExited && hasIPs(o.sbSent) {
		return nil, false
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: o.sbSent, Info: o.info}, true
}

// ListPodSandbox answers ListPodSandbox when the state is current for every sandbox the filter can
// match; ok is false otherwise.
func (p *PLEG) ListPodSandbox(ctx context.Context, r *runtimeapi.ListPodSandboxRequest) (_ *runtimeapi.ListPodSandboxResponse, ok bool) {
	defer p.mu.Unlock()
	if !p.readLocked(ctx) || !p.listable() {
		return nil, false
	}
	f := r.GetFilter()
	var pods []*pod
	if id := f.GetId(); id != "" {
		// containerd resolves a truncated id; only a full id is answered here.
		pd := p.st.pods[id]
		if pd == nil {
			return nil, false
		}
		pods = []*pod{pd}
	} else {
		pods = make([]*pod, 0, len(p.st.pods))
		for _, pd := range p.st.pods {
			pods = append(pods, pd)
		}
	}
	items := make([]*runtimeapi.PodSandbox, 0, len(pods))
	for _, pd := range pods {
		sb := pd.sandbox
		if !settled(sb) {
			return nil, false
		}
		e := sandboxEntry(sb.sbSent)
		if (f.GetState() != nil && f.GetState().GetState() != e.State) || !labelsMatch(e.Labels, f.GetLabelSelector()) {
			continue
		}
		items = append(items, e)
	}
	slices.SortFunc(items, func(a, b *runtimeapi.PodSandbox) int {
		return cmp.Or(cmp.Compare(a.CreatedAt, b.CreatedAt), strings.Compare(a.Id, b.Id))
	})
	return &runtimeapi.ListPodSandboxResponse{Items: items}, true
}

// ListContainers answers ListContainers when the state is current for every container the filter can
// match and holds their list entries; ok is false otherwise.
func (p *PLEG) ListContainers(ctx context.Context, r *runtimeapi.ListContainersRequest) (_ *runtimeapi.ListContainersResponse, ok bool) {
	defer p.mu.Unlock()
	if !p.readLocked(ctx) || !p.listable() {
		return nil, false
	}
	f := r.GetFilter()
	var objs []*object
	switch {
	case f.GetId() != "":
		o := p.st.objects[f.GetId()]
		if o == nil || o.kind != KindContainer {
			return nil, false // a truncated id, or one the state does not know
		}
		if sb := f.GetPodSandboxId(); sb != "" && p.st.pods[sb] == nil {
			return nil, false
		}
		objs = []*object{o}
	case f.GetPodSandboxId() != "":
		pd := p.st.pods[f.GetPodSandboxId()]
		if pd == nil {
			return nil, false
		}
		if !settled(pd.sandbox) {
			return nil, false
		}
		for _, o := range pd.containers {
			objs = append(objs, o)
		}
	default:
		for _, o := range p.st.objects {
			if o.kind == KindContainer {
				objs = append(objs, o)
			} else if !settled(o) {
				return nil, false // a container of an unsettled sandbox may not be known yet
			}
		}
	}
	out := make([]*runtimeapi.Container, 0, len(objs))
	for _, o := range objs {
		if !settled(o) || o.entry == nil || o.entry.PodSandboxId != o.pod.id {
			return nil, false
		}
		if sb := f.GetPodSandboxId(); sb != "" && sb != o.pod.id {
			continue
		}
		e := containerEntry(o.entry, o.ctrSent)
		if (f.GetState() != nil && f.GetState().GetState() != e.State) || !labelsMatch(e.Labels, f.GetLabelSelector()) {
			continue
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *runtimeapi.Container) int {
		return cmp.Or(cmp.Compare(a.CreatedAt, b.CreatedAt), strings.Compare(a.Id, b.Id))
	})
	return &runtimeapi.ListContainersResponse{Containers: out}, true
}

// listable says whether no observation of an id the state does not know yet is held (a task event
// can come before the NRI hook or the status that makes its object).
func (p *PLEG) listable() bool { return p.st.heldN == 0 }

// sandboxEntry is a sandbox's list entry as containerd builds it: everything is in its status.
func sandboxEntry(st *runtimeapi.PodSandboxStatus) *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{
		Id: st.Id, Metadata: st.Metadata, State: st.State, CreatedAt: st.CreatedAt,
		Labels: st.Labels, Annotations: st.Annotations, RuntimeHandler: st.RuntimeHandler,
	}
}

// containerEntry is a container's list entry: containerd's (listed) with the state of st, its status.
func containerEntry(listed *runtimeapi.Container, st *runtimeapi.ContainerStatus) *runtimeapi.Container {
	return &runtimeapi.Container{
		Id: listed.Id, PodSandboxId: listed.PodSandboxId, Metadata: listed.Metadata, Image: listed.Image,
		ImageRef: listed.ImageRef, State: st.State, CreatedAt: listed.CreatedAt, Labels: listed.Labels,
		Annotations: listed.Annotations, ImageId: listed.ImageId,
	}
}

// labelsMatch is containerd's label selector: every key present with the same value.
func labelsMatch(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

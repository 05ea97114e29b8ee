package fresh

import (
	"sync"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// podIndex knows, from the events the endpoint sent, which sandbox each container belongs to and which
// containers each sandbox has: the refresh after a stop takes a stopped container's pod from it instead
// of asking the runtime. It holds the objects the events named until their DELETED (a sandbox's
// forgets its containers too). It is safe for concurrent use.
type podIndex struct {
	mu sync.Mutex
	// sandboxOf maps a container to its sandbox; members a sandbox to its containers.
	sandboxOf map[string]string
	members   map[string]map[string]struct{}
}

func newPodIndex() *podIndex {
	return &podIndex{sandboxOf: map[string]string{}, members: map[string]map[string]struct{}{}}
}

// observe records an event (encoded): its object, its sandbox and the containers its statuses list.
// It reads ids only, never a status.
func (x *podIndex) observe(b []byte) {
	h, ok := scanEvent(b, true)
	id, typ, sandbox, containers := h.id, h.typ, h.sandbox, h.containers
	if !ok || id == "" || sandbox == "" {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if typ == runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT {
		if id == sandbox {
			for c := range x.members[sandbox] {
				delete(x.sandboxOf, c)
			}
			delete(x.members, sandbox)
			return
		}
		delete(x.sandboxOf, id)
		delete(x.members[sandbox], id)
		return
	}
	if id != sandbox {
		containers = append(containers, id)
	}
	m := x.members[sandbox]
	if m == nil {
		m = map[string]struct{}{}
		x.members[sandbox] = m
	}
	for _, c := range containers {
		if c != sandbox {
			x.sandboxOf[c] = sandbox
			m[c] = struct{}{}
		}
	}
}

// pod returns the sandbox of object id (a container, or a sandbox when isSandbox) and its containers,
// as the events sent them; ok false when the events named neither.
func (x *podIndex) pod(id string, isSandbox bool) (sandbox string, containers []string, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	sandbox = id
	if !isSandbox {
		if sandbox, ok = x.sandboxOf[id]; !ok {
			return "", nil, false
		}
	}
	m, ok := x.members[sandbox]
	if !ok {
		return "", nil, false
	}
	for c := range m {
		containers = append(containers, c)
	}
	return sandbox, containers, true
}

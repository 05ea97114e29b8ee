package fresh

import (
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
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
	id, typ, sandbox, containers, ok := eventIDs(b)
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

// eventIDs reads an encoded ContainerEventResponse's container_id (1), type (2), the id of its
// pod_sandbox_status (4) and the ids of its containers_statuses (5), skipping everything else.
func eventIDs(b []byte) (id string, typ runtimeapi.ContainerEventType, sandbox string, containers []string, ok bool) {
	for len(b) > 0 {
		num, wt, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", 0, "", nil, false
		}
		b = b[n:]
		switch {
		case num == 1 && wt == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return "", 0, "", nil, false
			}
			id, b = string(v), b[n:]
			continue
		case num == 2 && wt == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return "", 0, "", nil, false
			}
			typ, b = runtimeapi.ContainerEventType(v), b[n:]
			continue
		case (num == 4 || num == 5) && wt == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return "", 0, "", nil, false
			}
			b = b[n:]
			// As a decoder merges them: the last id of all the sandbox status's parts, and each
			// container status's own last id.
			if v, found := idField(v); num == 4 && found {
				sandbox = v
			} else if num == 5 && v != "" {
				containers = append(containers, v)
			}
			continue
		}
		if n = protowire.ConsumeFieldValue(num, wt, b); n < 0 {
			return "", 0, "", nil, false
		}
		b = b[n:]
	}
	return id, typ, sandbox, containers, true
}

// idField returns field 1 of an encoded message when it is a string (a status's id): its last
// occurrence, as a decoder keeps it, and whether there was one.
func idField(b []byte) (id string, found bool) {
	for len(b) > 0 {
		num, wt, n := protowire.ConsumeTag(b)
		if n < 0 {
			return id, found
		}
		b = b[n:]
		if num == 1 && wt == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return id, found
			}
			id, found, b = string(v), true, b[n:]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, wt, b); n < 0 {
			return id, found
		}
		b = b[n:]
	}
	return id, found
}

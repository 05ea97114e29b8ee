package kubelet

import "github.com/pleg-nri/pleg-nri/test/containerd-it/harness"

// Namespace is the namespace of every static pod of the tests.
const Namespace = "plegkube"

// StateMount is where a Container with State set finds the pod's emptyDir volume: it outlives the
// container, so a script can tell its first run from a restart.
const StateMount = "/state"

// Pod is a static pod to write into the kubelet's manifest directory.
type Pod struct {
	// Name is the manifest's pod name (the kubelet names the pod Name-NodeName).
	Name string
	// Containers run the busybox test image.
	Containers []Container
	// InitContainers run one after the other, each to its exit, before Containers start.
	InitContainers []Container
	// RestartPolicy is Always unless set.
	RestartPolicy string
	// HostNetwork runs the pod in the host's network namespace instead of the CNI network.
	HostNetwork bool
}

// Container is one busybox container of a Pod, running `sh -c Script`.
type Container struct {
	Name, Script string
	// MemoryLimit is its memory limit ("32Mi"); none when empty.
	MemoryLimit string
	// State mounts the pod's emptyDir volume at StateMount.
	State bool
	// RestartPolicy "Always" on an init container makes it a sidecar (a restartable init container,
	// started before the pod's containers and restarted whenever it exits); empty elsewhere.
	RestartPolicy string
}

// manifest renders the pod as a v1 Pod object.
func (p Pod) manifest() map[string]any {
	policy := p.RestartPolicy
	if policy == "" {
		policy = "Always"
	}
	state := false
	render := func(c Container) any {
		ctr := map[string]any{
			"name":                     c.Name,
			"image":                    harness.BusyboxImage,
			"imagePullPolicy":          "Never",
			"command":                  []string{"sh", "-c", c.Script},
			"terminationMessagePolicy": "File",
		}
		if c.MemoryLimit != "" {
			ctr["resources"] = map[string]any{"limits": map[string]string{"memory": c.MemoryLimit}}
		}
		if c.RestartPolicy != "" {
			ctr["restartPolicy"] = c.RestartPolicy
		}
		if c.State {
			state = true
			ctr["volumeMounts"] = []any{map[string]string{"name": "state", "mountPath": StateMount}}
		}
		return ctr
	}
	var containers, initContainers []any
	for _, c := range p.Containers {
		containers = append(containers, render(c))
	}
	for _, c := range p.InitContainers {
		initContainers = append(initContainers, render(c))
	}
	spec := map[string]any{
		"restartPolicy":                 policy,
		"terminationGracePeriodSeconds": 1,
		"enableServiceLinks":            false,
		"hostNetwork":                   p.HostNetwork,
		"containers":                    containers,
	}
	if len(initContainers) > 0 {
		spec["initContainers"] = initContainers
	}
	if state {
		spec["volumes"] = []any{map[string]any{"name": "state", "emptyDir": map[string]any{}}}
	}
	return map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": p.Name, "namespace": Namespace, "labels": map[string]string{"plegkube": "true"}},
		"spec":       spec,
	}
}

// PodStatus is the part of a v1 Pod the tests read from the kubelet's /pods.
type PodStatus struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		UID       string `json:"uid"`
	} `json:"metadata"`
	Status struct {
		Phase             string            `json:"phase"`
		PodIP             string            `json:"podIP"`
		ContainerStatuses []ContainerStatus `json:"containerStatuses"`
		// InitContainerStatuses are the statuses of the pod's init containers, in order.
		InitContainerStatuses []ContainerStatus `json:"initContainerStatuses"`
	} `json:"status"`
}

// Container returns the status of the container named name (nil when the pod has none).
func (p *PodStatus) Container(name string) *ContainerStatus {
	if p == nil {
		return nil
	}
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == name {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// ContainerStatus is a v1 ContainerStatus.
type ContainerStatus struct {
	Name         string         `json:"name"`
	Ready        bool           `json:"ready"`
	RestartCount int32          `json:"restartCount"`
	ContainerID  string         `json:"containerID"`
	State        ContainerState `json:"state"`
	LastState    ContainerState `json:"lastState"`
}

// ContainerState is a v1 ContainerState.
type ContainerState struct {
	Waiting *struct {
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"waiting,omitempty"`
	Running *struct {
		StartedAt string `json:"startedAt"`
	} `json:"running,omitempty"`
	Terminated *struct {
		ExitCode    int32  `json:"exitCode"`
		Reason      string `json:"reason"`
		ContainerID string `json:"containerID"`
		StartedAt   string `json:"startedAt"`
		FinishedAt  string `json:"finishedAt"`
	} `json:"terminated,omitempty"`
}

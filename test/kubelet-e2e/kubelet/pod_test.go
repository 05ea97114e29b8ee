package kubelet

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestManifestInitContainers(t *testing.T) {
	p := Pod{Name: "chain", Containers: []Container{{Name: "app", Script: "exec sleep 3600"}},
		InitContainers: []Container{{Name: "init1", Script: "exit 0"}, {Name: "init2", Script: "exit 0", State: true},
			{Name: "sidecar", Script: "exec sleep 3600", RestartPolicy: "Always"}}}
	data, err := json.Marshal(p.manifest())
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Spec struct {
			InitContainers []struct {
				Name          string `json:"name"`
				VolumeMounts  []any  `json:"volumeMounts"`
				RestartPolicy string `json:"restartPolicy"`
			} `json:"initContainers"`
			Containers []struct{ Name string } `json:"containers"`
			Volumes    []any                   `json:"volumes"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Spec.InitContainers) != 3 || m.Spec.InitContainers[0].Name != "init1" || m.Spec.InitContainers[1].Name != "init2" {
		t.Fatalf("init containers = %+v, want init1, init2, sidecar", m.Spec.InitContainers)
	}
	// Only the sidecar is restartable: an init container with any restartPolicy is one.
	if m.Spec.InitContainers[0].RestartPolicy != "" || m.Spec.InitContainers[2].RestartPolicy != "Always" {
		t.Errorf("restart policies = %+v, want only the sidecar's Always", m.Spec.InitContainers)
	}
	if len(m.Spec.Containers) != 1 || m.Spec.Containers[0].Name != "app" {
		t.Errorf("containers = %+v, want app", m.Spec.Containers)
	}
	// An init container's State mount needs the pod's volume.
	if len(m.Spec.InitContainers[1].VolumeMounts) != 1 || len(m.Spec.Volumes) != 1 {
		t.Errorf("init2's state mount and the pod's volume missing: %s", data)
	}
	plain, _ := json.Marshal(Pod{Name: "plain", Containers: p.Containers}.manifest())
	if strings.Contains(string(plain), "initContainers") {
		t.Errorf("a pod without init containers has initContainers: %s", plain)
	}
}

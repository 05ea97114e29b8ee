package kubelet

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestManifestInitContainers(t *testing.T) {
	p := Pod{Name: "chain", Containers: []Container{{Name: "app", Script: "exec sleep 3600"}},
		InitContainers: []Container{{Name: "init1", Script: "exit 0"}, {Name: "init2", Script: "exit 0", State: true}}}
	data, err := json.Marshal(p.manifest())
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Spec struct {
			InitContainers []struct {
				Name         string `json:"name"`
				VolumeMounts []any  `json:"volumeMounts"`
			} `json:"initContainers"`
			Containers []struct{ Name string } `json:"containers"`
			Volumes    []any                   `json:"volumes"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Spec.InitContainers) != 2 || m.Spec.InitContainers[0].Name != "init1" || m.Spec.InitContainers[1].Name != "init2" {
		t.Errorf("init containers = %+v, want init1 then init2", m.Spec.InitContainers)
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

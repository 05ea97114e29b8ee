package main

import (
	"strings"
	"testing"
	"text/template"

	"sigs.k8s.io/yaml"
)

// TestManifestsRender: every manifest renders to documents that are YAML objects with a kind, and the
// ones a run checks are there (a failure here would otherwise show only minutes into a cluster run).
func TestManifestsRender(t *testing.T) {
	nodes := []string{"c-control-plane", "c-worker", "c-worker2"}
	for _, tc := range []struct {
		name  string
		data  any
		kinds []string
	}{
		{"kind config", map[string]any{"Nodes": []struct{ Role, CNIDir string }{{"control-plane", "/tmp/a"}, {"worker", "/tmp/b"}},
			"PodSubnet": podSubnet, "ServiceSubnet": serviceSubnet}, []string{"Cluster"}},
		{"nodenet", map[string]any{"Image": "nodenet:x", "PodSubnet": podSubnet, "APIServerHost": nodes[0]},
			[]string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"}},
		{"service", map[string]any{"ServerNode": nodes[2], "ClientNode": nodes[1], "Busybox": busybox},
			[]string{"Namespace", "Pod", "Service", "Pod"}},
		{"workloads", map[string]any{"Nodes": nodes, "Busybox": busybox}, nil},
		{"drain", map[string]any{"Node": nodes[1], "Replicas": drainReplicas, "Busybox": busybox}, []string{"Namespace", "Deployment"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := map[string]*template.Template{"kind config": clusterConfig, "nodenet": nodenetManifest,
				"service": serviceCheck, "workloads": workloads, "drain": drainCheck}[tc.name]
			s, err := render(tmpl, tc.data)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, doc := range strings.Split(s, "\n---\n") {
				var obj map[string]any
				if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
					t.Fatalf("not YAML: %v\n%s", err, doc)
				}
				k, _ := obj["kind"].(string)
				if k == "" {
					t.Fatalf("a document without a kind:\n%s", doc)
				}
				kinds = append(kinds, k)
			}
			if tc.kinds != nil && strings.Join(kinds, " ") != strings.Join(tc.kinds, " ") {
				t.Errorf("kinds %v, want %v", kinds, tc.kinds)
			}
			if tc.name == "workloads" {
				// The Namespace and Service, then 6 objects per node.
				if len(kinds) != 2+6*len(nodes) {
					t.Errorf("%d objects: %v", len(kinds), kinds)
				}
				for _, n := range nodes {
					if strings.Count(s, "nodeName: "+n+"\n") != 6 {
						t.Errorf("node %s does not have its 6 workloads:\n%s", n, s)
					}
				}
			}
		})
	}
}

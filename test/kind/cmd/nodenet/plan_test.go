package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMakePlan(t *testing.T) {
	nodes := []nodeInfo{
		{name: "cp", podCIDRs: []string{"10.244.0.0/24"}, internalIP: "172.18.0.2"},
		{name: "w1", podCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, internalIP: "172.18.0.3"},
		{name: "w2", podCIDRs: []string{"10.244.2.0/24"}, internalIP: "172.18.0.4"},
		// Not allocated yet, or no address yet: no route.
		{name: "w3", internalIP: "172.18.0.5"},
		{name: "w4", podCIDRs: []string{"10.244.4.0/24"}},
	}
	for _, tc := range []struct {
		self, podCIDR string
		routes        []string
	}{
		{"cp", "10.244.0.0/24", []string{"10.244.1.0/24 via 172.18.0.3", "10.244.2.0/24 via 172.18.0.4"}},
		{"w1", "10.244.1.0/24", []string{"10.244.0.0/24 via 172.18.0.2", "10.244.2.0/24 via 172.18.0.4"}},
		{"w3", "", []string{"10.244.0.0/24 via 172.18.0.2", "10.244.1.0/24 via 172.18.0.3", "10.244.2.0/24 via 172.18.0.4"}},
	} {
		t.Run(tc.self, func(t *testing.T) {
			p, err := makePlan(nodes, tc.self)
			if err != nil {
				t.Fatal(err)
			}
			if p.podCIDR != tc.podCIDR {
				t.Errorf("podCIDR %q, want %q", p.podCIDR, tc.podCIDR)
			}
			if d := cmp.Diff(tc.routes, sortedRoutes(p.routes)); d != "" {
				t.Errorf("routes (-want +got):\n%s", d)
			}
			if tc.podCIDR == "" {
				if p.conf != nil {
					t.Errorf("a CNI configuration without a podCIDR:\n%s", p.conf)
				}
				return
			}
			var conf struct {
				Plugins []struct {
					Type   string `json:"type"`
					IPMasq bool   `json:"ipMasq"`
					IPAM   struct {
						Ranges [][]struct {
							Subnet string `json:"subnet"`
						} `json:"ranges"`
					} `json:"ipam"`
				} `json:"plugins"`
			}
			if err := json.Unmarshal(p.conf, &conf); err != nil {
				t.Fatalf("the CNI configuration is not JSON: %v\n%s", err, p.conf)
			}
			if len(conf.Plugins) != 1 || conf.Plugins[0].Type != "bridge" || conf.Plugins[0].IPMasq ||
				conf.Plugins[0].IPAM.Ranges[0][0].Subnet != tc.podCIDR {
				t.Errorf("CNI configuration:\n%s", p.conf)
			}
		})
	}
}

func TestMakePlanErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []nodeInfo
		want  string
	}{
		{"bad podCIDR", []nodeInfo{{name: "a", podCIDRs: []string{"10.244.1.0"}}}, `node a: podCIDR "10.244.1.0"`},
		{"bad address", []nodeInfo{{name: "a", podCIDRs: []string{"10.244.1.0/24"}, internalIP: "x"}}, `node a: InternalIP "x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := makePlan(tc.nodes, "self")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestIPv4CIDRNormalizes(t *testing.T) {
	got, err := ipv4CIDR([]string{"fd00::/64", "10.244.1.7/24"})
	if err != nil || got != "10.244.1.0/24" {
		t.Fatalf("ipv4CIDR = %q, %v", got, err)
	}
}

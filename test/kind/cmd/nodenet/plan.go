package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
)

// nodeInfo is what nodenet needs of a node.
type nodeInfo struct {
	name string
	// podCIDRs is spec.podCIDRs (spec.podCIDR where only that is set); empty until the controller
	// manager allocated one.
	podCIDRs []string
	// internalIP is the node's first IPv4 InternalIP.
	internalIP string
}

// plan is what this node should have.
type plan struct {
	// podCIDR is this node's IPv4 pod CIDR; conf its CNI configuration over it. Both are empty while
	// the node has no podCIDR yet (then nothing is written, and the node stays NotReady).
	podCIDR string
	conf    []byte
	// routes: every other node's IPv4 pod CIDR -> that node's InternalIP.
	routes map[string]string
}

// makePlan works out this node's (self's) configuration from every node. A node without a podCIDR or an
// InternalIP yet gets no route (it will, on the update that gives it one); a podCIDR that is not an IPv4
// prefix is an error.
func makePlan(nodes []nodeInfo, self string) (plan, error) {
	p := plan{routes: map[string]string{}}
	for _, n := range nodes {
		cidr, err := ipv4CIDR(n.podCIDRs)
		if err != nil {
			return plan{}, fmt.Errorf("node %s: %w", n.name, err)
		}
		if n.name == self {
			p.podCIDR = cidr
			continue
		}
		if cidr == "" || n.internalIP == "" {
			continue
		}
		if _, err := netip.ParseAddr(n.internalIP); err != nil {
			return plan{}, fmt.Errorf("node %s: InternalIP %q: %w", n.name, n.internalIP, err)
		}
		p.routes[cidr] = n.internalIP
	}
	if p.podCIDR != "" {
		conf, err := cniConfig(p.podCIDR)
		if err != nil {
			return plan{}, err
		}
		p.conf = conf
	}
	return p, nil
}

// ipv4CIDR returns the first IPv4 prefix among cidrs ("" if there is none), normalized.
func ipv4CIDR(cidrs []string) (string, error) {
	for _, c := range cidrs {
		pfx, err := netip.ParsePrefix(c)
		if err != nil {
			return "", fmt.Errorf("podCIDR %q: %w", c, err)
		}
		if pfx.Addr().Is4() {
			return pfx.Masked().String(), nil
		}
	}
	return "", nil
}

// cniConfig is the node's CNI configuration list: a bridge that is the pods' gateway (so traffic to other
// nodes' pods leaves through the node's routes), host-local addresses from the node's podCIDR, no
// masquerade of its own (ensureMasquerade's rules leave pod-to-pod traffic alone), hairpin so that a pod
// reaches itself through a Service.
func cniConfig(podCIDR string) ([]byte, error) {
	type obj = map[string]any
	conf := obj{
		"cniVersion": "1.0.0",
		"name":       "nodenet",
		"plugins": []obj{{
			"type":        "bridge",
			"bridge":      "cni0",
			"isGateway":   true,
			"ipMasq":      false,
			"hairpinMode": true,
			"ipam": obj{
				"type":   "host-local",
				"ranges": [][]obj{{{"subnet": podCIDR}}},
				"routes": []obj{{"dst": "0.0.0.0/0"}},
			},
		}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// sortedRoutes lists routes as "dst via gw", sorted (for logs and tests).
func sortedRoutes(routes map[string]string) []string {
	out := make([]string, 0, len(routes))
	for dst, gw := range routes {
		out = append(out, dst+" via "+gw)
	}
	sort.Strings(out)
	return out
}

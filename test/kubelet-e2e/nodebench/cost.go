package nodebench

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// Cost is what one phase of one setup cost the node (make bench-node, make bench-storm).
type Cost struct {
	Setup string `json:"setup"`
	Phase string `json:"phase"`
	// Seconds is the phase's length.
	Seconds float64 `json:"seconds"`
	// CPU seconds per minute (user+system) of each process. pleg-nri is two processes: the core (NRI,
	// state, events) and the front, which serves the kubelet's CRI socket and forwards every call to
	// containerd.
	KubeletCPU    float64  `json:"kubelet_cpu_seconds_per_minute"`
	ContainerdCPU float64  `json:"containerd_cpu_seconds_per_minute"`
	PlegNRICPU    *float64 `json:"plegnri_cpu_seconds_per_minute,omitempty"`
	FrontCPU      *float64 `json:"plegnri_front_cpu_seconds_per_minute,omitempty"`
	// PlegNRIRSSMiB and FrontRSSMiB are the core's and the front's resident memory at the phase's end.
	PlegNRIRSSMiB *float64 `json:"plegnri_rss_mib,omitempty"`
	FrontRSSMiB   *float64 `json:"plegnri_front_rss_mib,omitempty"`
	// ProxyCallsPerSec are the CRI calls pleg-nri forwarded to containerd, per second.
	ProxyCallsPerSec *float64 `json:"proxy_calls_per_second,omitempty"`
	// Relists are the kubelet's generic relists during the phase.
	Relists float64 `json:"kubelet_relists"`
	// Load is the load average at the phase's end.
	Load string `json:"load_at_end"`
	// ContainerdMethods are the gRPC calls containerd served per second, by method, with their
	// handling time per second (PLEG_NRI_CONTAINERD_PROFILE).
	ContainerdMethods map[string]harness.MethodCount `json:"containerd_calls_per_second,omitempty"`
	// Profile is containerd's CPU profile of the phase (PLEG_NRI_CONTAINERD_PROFILE; idle and no kubelet).
	Profile *harness.ProfileSummary `json:"containerd_profile,omitempty"`
	// Limits are the host's limits at the phase's end (the idle phase only).
	Limits *Limits `json:"limits,omitempty"`
}

// Node is the CPU seconds per minute of the kubelet, containerd and pleg-nri (core and front) together.
func (c Cost) Node() float64 {
	total := c.KubeletCPU + c.ContainerdCPU
	for _, v := range []*float64{c.PlegNRICPU, c.FrontCPU} {
		if v != nil {
			total += *v
		}
	}
	return total
}

// PlegNRICells renders pleg-nri's core CPU, front CPU and RSS (core + front) for a table ("-" for a setup
// without pleg-nri).
func (c Cost) PlegNRICells() (core, front, rss string) {
	core, front, rss = "-", "-", "-"
	if c.PlegNRICPU != nil {
		core = fmt.Sprintf("%.2f", *c.PlegNRICPU)
	}
	if c.FrontCPU != nil {
		front = fmt.Sprintf("%.2f", *c.FrontCPU)
	}
	if c.PlegNRIRSSMiB != nil {
		rss = fmt.Sprintf("%.1f MiB", *c.PlegNRIRSSMiB)
		if c.FrontRSSMiB != nil {
			rss = fmt.Sprintf("%.1f + %.1f MiB", *c.PlegNRIRSSMiB, *c.FrontRSSMiB)
		}
	}
	return core, front, rss
}

// ReportPath is where a node benchmark of pods pods writes its report: path itself at the default
// count, else path with "-<pods>pods" before its extension (docs/kubelet-node-cost-v1.37.2-250pods.md),
// so that runs at other densities do not overwrite it.
func ReportPath(path string, pods, defaultPods int) string {
	if pods == defaultPods {
		return path
	}
	ext := ""
	if i := strings.LastIndexByte(path, '.'); i > strings.LastIndexByte(path, '/') {
		path, ext = path[:i], path[i:]
	}
	return path + "-" + strconv.Itoa(pods) + "pods" + ext
}

// MakeCommand renders the command that reproduces a run: the environment overrides it ran with
// (name=value, sorted; empty values left out), then make target with KUBELET_VERSION, and NODE_PODS
// when pods is not the default.
func MakeCommand(target, kubelet string, pods, defaultPods int, overrides map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(overrides)) {
		if overrides[k] != "" {
			parts = append(parts, k+"="+overrides[k])
		}
	}
	parts = append(parts, "make", target, "KUBELET_VERSION="+kubelet)
	if pods != defaultPods {
		parts = append(parts, "NODE_PODS="+strconv.Itoa(pods))
	}
	return strings.Join(parts, " ")
}

// Package corelink is the private link between pleg-nri's two processes: the core (NRI plugin, state,
// fan-out) and the front (the kubelet's CRI endpoint, package kubelet), over the core's socket in the
// run directory.
//
//	front: kubelet.Proxy --EventSource--> Relay ==core.sock==> Core (core process) --> pleg fan-out
//	                     --Refresh------> Relay.RefreshStopped ==> Core --> pleg.PLEG.RefreshStopped
//
// The core's socket serves two things, and nothing else (every other method is UNIMPLEMENTED: it is
// not a CRI endpoint; `pleg-nri events` and the tests use the kubelet's endpoint or containerd's):
//   - runtime.v1.RuntimeService/GetContainerEvents: the core's events, one subscription of its fan-out
//     per stream (the method keeps the CRI's name, so that any CRI client can read the core's stream);
//   - RefreshStoppedMethod: send an object's STOPPED again (after a stop the kubelet made:
//     refresh-after-stop).
//
// The front's Relay resubscribes across the core's restarts and holds each event until the runtime
// serves (RuntimeGate); see docs/restarts.md.
package corelink

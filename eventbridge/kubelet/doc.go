// Package kubelet is the kubelet's side of pleg-nri: the CRI endpoint the kubelet talks to.
//
// A Server serves a Proxy: a gRPC server with no registered service that forwards every call, unary or
// streaming, known or not, byte for byte to the runtime (containerd), and answers GetContainerEvents
// itself from an EventSource (EventService: one subscription per stream). What adjusts the answers after
// the events sits behind one seam, ReadHook (hook.go): status reads kept consistent with the events
// already sent and the refresh after a stop (package fresh).
//
// The kubelet's endpoint runs in pleg-nri's front process (package front), whose EventSource is a
// corelink.Relay of the core's socket (see docs/restarts.md); a Server hands its listening socket to a
// successor with ListenerFile, SendFiles, ReceiveFiles and FileListener.
//
//	kubelet --CRI--> Server/Proxy --every call, bytes--> containerd CRI
//	                      ^ GetContainerEvents (EventService)
//	                      |
//	                 EventSource: corelink.Relay of the core's socket (corelink.Core over the pleg fan-out)
//
// The package knows nothing of pleg-nri's state: events reach it as CRI messages.
package kubelet

// Package eventbridge connects pleg-nri to containerd and to the kubelet.
//
// Toward containerd it holds two clients:
//   - TaskEvents subscribes to containerd's task events (/tasks/exit, /tasks/oom, /tasks/start) of one
//     namespace and turns them into pleg.Observations (DecodeEnvelope), resubscribing with backoff
//     whenever containerd restarts;
//   - CRIClient is the CRI client of containerd's runtime service, the core's pleg.StatusSource and
//     pleg.Lister.
//
// Toward the kubelet it serves the CRI endpoint (Server, Proxy): a gRPC server with no registered service
// that forwards every call, unary or streaming, known or not, byte for byte to containerd, and answers
// GetContainerEvents itself from an EventSource (the core's fan-out), one subscription per stream.
//
// The kubelet's endpoint runs in pleg-nri's front process, whose EventSource is a Relay of the core's
// own endpoint (see cmd/pleg-nri/front.go and docs/restarts.md); a Server hands its listening socket to
// a successor with ListenerFile, SendFiles, ReceiveFiles and FileListener.
//
//	kubelet --CRI--> Server/Proxy --every call, bytes--> containerd CRI
//	                      ^ GetContainerEvents
//	                      |
//	                 EventSource (pleg fan-out) <-- pleg core <-- TaskEvents <-- containerd events
//	                                                         <-- CRIClient (statuses, relist)
package eventbridge

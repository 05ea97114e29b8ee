// Package containerd is pleg-nri's side of containerd: what the core learns from it besides NRI.
//
//   - TaskEvents subscribes to containerd's task events (/tasks/exit, /tasks/oom, /tasks/start) of one
//     namespace and turns them into pleg.Observations (DecodeEnvelope), resubscribing with backoff
//     whenever containerd restarts;
//   - CRIClient is the CRI client of containerd's runtime service, the core's pleg.StatusSource and
//     pleg.Lister;
//   - OOMChecker tells whether an exited container was OOM-killed, as containerd's own exit handler does.
//
// Each takes a connection to containerd (see package internal/dial), shared by every client of the
// same socket.
//
//	containerd events --TaskEvents--> pleg.Observation --> pleg core
//	containerd CRI    <--CRIClient--  statuses, relists
//	containerd tasks  <--OOMChecker-- OOM kills
package containerd

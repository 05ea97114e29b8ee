// Package front is pleg-nri's front process.
//
// The front is the small, long-lived process that owns the kubelet's CRI endpoint (--listen) and its
// connections: it forwards every CRI call to containerd (kubelet.Proxy) and relays the event stream
// it gets from the core over the core's event socket (corelink.Relay). The core (NRI plugin, state,
// relist, checkpoint) can then be restarted, killed or upgraded without ending the kubelet's stream: the
// front subscribes again and the core's startup replay fills the gap. See docs/restarts.md.
//
//	kubelet --CRI--> front (--listen) --every call--> containerd CRI
//	                   ^ GetContainerEvents, relayed
//	                   |
//	                 core (<run-dir>/core.sock) <-- NRI, containerd events, relist
//
// `pleg-nri` (the daemon) starts the core and makes sure a compatible front runs for its --listen: it
// spawns one, detached in its own session (like containerd's shims), when none answers on
// <run-dir>/front.sock, and leaves a running one alone. An incompatible front (another front protocol,
// another runtime endpoint) is replaced: the new front takes the listening socket over from the old one
// (fd passing), so the socket never goes away; the old front's open streams end once.

package front

import "time"

// Protocol is the version of what a front and a core expect of each other (the control socket's
// messages, the core's event socket, the front's flags). A core leaves a running front of the same
// protocol alone, whatever its binary's version, and replaces one of another. Protocol 2 added the
// "share" request of the core's Supervisor.
const Protocol = 2

// The files of the run directory.
const (
	CoreSocketName    = "core.sock"
	ControlSocketName = "front.sock"
	logName           = "front.log"
)

// Bounds of the front's control exchanges.
const (
	startTimeout   = 20 * time.Second
	controlTimeout = 5 * time.Second
	StopTimeout    = 5 * time.Second
	// maxControlLine bounds a request line on the control socket (a request is a few bytes of JSON).
	maxControlLine = 4 << 10
	// acceptRetryMin and acceptRetryMax bound the wait after a failed accept on the control socket
	// (as net/http's Server.Serve does).
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
)

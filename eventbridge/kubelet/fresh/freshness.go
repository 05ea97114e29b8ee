package fresh

import (
	"fmt"
)

// ReadFreshness says how the CRI endpoint keeps its status reads consistent with the events it already
// sent (see Config.ReadFreshness).
//
// containerd updates an exited container's CRI status only once its exit handler deleted the task,
// milliseconds to seconds after the exit that pleg-nri reports; a client that got the STOPPED and then
// reads the status (kubelet 1.37 relists the pod through this endpoint because of the STOPPED; 1.35 and
// 1.36 relist a pod after each sync and cache the answer with their own, newer timestamp) must not get
// the older state.
type ReadFreshness string

const (
	// ReadFreshnessOverlay answers a read that shows running an object the stream already reported
	// stopped with the stopped status that was sent: for a container, state EXITED, exit_code,
	// finished_at, reason and message from the STOPPED event (everything else from the runtime's
	// answer); for a sandbox, state NOTREADY. That is what the runtime answers once it catches up.
	ReadFreshnessOverlay ReadFreshness = "overlay"
	// ReadFreshnessOff forwards status reads like any other call.
	ReadFreshnessOff ReadFreshness = "off"
)

// ParseReadFreshness checks a read-freshness mode's name; "" is DefaultReadFreshness.
func ParseReadFreshness(s string) (ReadFreshness, error) {
	switch m := ReadFreshness(s); m {
	case "":
		return DefaultReadFreshness, nil
	case ReadFreshnessOverlay, ReadFreshnessOff:
		return m, nil
	}
	return "", fmt.Errorf("unknown read freshness %q: want %q or %q", s, ReadFreshnessOverlay, ReadFreshnessOff)
}

// DefaultReadFreshness is the mode of a config that names none (docs/internals.md gives the measurements
// behind the choice).
const DefaultReadFreshness = ReadFreshnessOverlay

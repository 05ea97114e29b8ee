// Package fresh keeps what the kubelet's endpoint answers consistent with the events it already sent.
// containerd shows an exit in its CRI only once its exit handler ran, milliseconds to seconds after the
// exit pleg-nri reports; a kubelet that got the STOPPED and then reads the pod must not get the older
// state, and a kubelet 1.35/1.36 that caches a status as newer than the STOPPED must be told again.
//
// Each mechanism is a kubelet.ReadHook (the endpoint's one seam), built by Hooks from the front's
// configuration:
//   - read freshness (ReadFreshness: overlay; freshread.go, stopped.go, readfix.go): a status read
//     whose answer shows running what the stream reported stopped is overlaid with the status sent;
//   - the refresh after a stop (refresh-after-stop; afterstop.go): once the kubelet's calls about a pod
//     it stopped are quiet, the core is asked to send the STOPPED again.
//
// The refreshes are the core's (Config.Refresh: corelink.Relay.RefreshStopped): the front builds no event
// of its own.
package fresh

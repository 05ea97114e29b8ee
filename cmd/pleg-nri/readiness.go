package main

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pleg-nri/pleg-nri/eventbridge/containerd"
	"github.com/pleg-nri/pleg-nri/eventbridge/front"
	"github.com/pleg-nri/pleg-nri/internal/promutil"
	"github.com/pleg-nri/pleg-nri/pleg"
	"github.com/pleg-nri/pleg-nri/plugin"
)

// readiness is what /readyz answers: the daemon is ready while a front serves the kubelet's endpoint,
// the NRI plugin is registered and has answered the runtime's Synchronize on that connection, the
// containerd event subscription is up and a relist has completed. It is fed by the hooks that feed
// the metrics: the plugin's connection state and Synchronize answer (nriHooks), the event
// subscription's state (taskHooks) and the core's relists (coreHooks).
//
// The NRI plugin's Synchronize answer is what containerd waits for before it lets the node's pod and
// container starts through again (NRI's BlockPluginSync, held from the plugin's connection to that
// answer): once ready, pod starts are not held for pleg-nri. Registration alone comes before (see the
// order of events above plugin.sessionHandlers, plugin/plugin.go): a rolling upgrade that waits for
// /readyz would otherwise go on while the sync still holds them.
type readiness struct {
	// front says whether a front serves the kubelet's endpoint (the front supervisor watches one).
	front atomic.Bool
	// nri and events are the states of the NRI connection and of the event subscription.
	nri, events atomic.Bool
	// nriSynced says the NRI plugin answered the runtime's Synchronize on its current connection
	// (plugin.Metrics.Synchronized). It is set whether the plugin's ConnectionState(true) came before
	// or after (nothing orders them), and unset when the connection goes down.
	nriSynced atomic.Bool
	// relisted is set after the first successful relist.
	relisted atomic.Bool
}

// check says whether the daemon is ready, and if not, what it waits for.
func (r *readiness) check() error {
	switch {
	case !r.front.Load():
		return fmt.Errorf("no front serves the CRI endpoint")
	case !r.nri.Load():
		return fmt.Errorf("NRI plugin not registered")
	case !r.nriSynced.Load():
		return fmt.Errorf("NRI plugin not synchronized with the runtime yet (the runtime holds pod starts until it is)")
	case !r.events.Load():
		return fmt.Errorf("containerd events not subscribed")
	case !r.relisted.Load():
		return fmt.Errorf("no relist has completed yet")
	}
	return nil
}

// nriHooks are the NRI plugin's hooks: its metrics, and its connection state and Synchronize answer
// for readiness.
type nriHooks struct {
	plugin.Metrics
	ready *readiness
}

// ConnectionState records the plugin's registration; a connection that goes down is no longer
// synchronized either (up leaves nriSynced alone: it may come after the Synchronize answer).
func (h nriHooks) ConnectionState(up bool) {
	h.Metrics.ConnectionState(up)
	if !up {
		h.ready.nriSynced.Store(false)
	}
	h.ready.nri.Store(up)
}

// Synchronized records that the plugin answered its connection's Synchronize (done), or that this
// connection is gone.
func (h nriHooks) Synchronized(done bool) {
	h.Metrics.Synchronized(done)
	h.ready.nriSynced.Store(done)
}

// coreHooks are the core's hooks: its metrics (with the OOM checks'), and its first relist for
// readiness.
type coreHooks struct {
	*pleg.PrometheusMetrics
	ready *readiness
}

func (h coreHooks) RelistCompleted(d time.Duration, err error) {
	if err == nil {
		h.ready.relisted.Store(true)
	}
	h.PrometheusMetrics.RelistCompleted(d, err)
}

// taskHooks are the task event subscription's hooks: metrics, readiness, and a relist after every
// (re)subscribe.
type taskHooks struct {
	upstreams *promutil.Upstreams
	ready     *readiness
	relist    func()
}

func (h taskHooks) OnReconnect() { h.relist() }

func (h taskHooks) OnConnectionState(up bool) {
	h.upstreams.Set("events", up, false)
	h.ready.events.Store(up)
}

// frontHooks are the front supervisor's hooks: its metrics, whether a front serves for readiness, and
// the core's replay for the subscribers that reconnect through the next front.
type frontHooks struct {
	*front.SupervisorMetrics
	ready *readiness
	core  *pleg.PLEG
}

func (h frontHooks) FrontGone() { h.core.ReplayForReconnects() }

func (h frontHooks) FrontUp(up bool) {
	h.SupervisorMetrics.FrontUp(up)
	h.ready.front.Store(up)
}

var (
	_ front.SupervisorHooks      = frontHooks{}
	_ plugin.Metrics             = nriHooks{}
	_ pleg.Metrics               = coreHooks{}
	_ pleg.OOMCheckMetrics       = coreHooks{}
	_ containerd.TaskEventsHooks = taskHooks{}
)

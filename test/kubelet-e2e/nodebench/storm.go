package nodebench

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// The storm benchmark (make bench-storm): per setup, with idle pods running, many pods deleted at
// once, many created at once, then many containers crash-looping, each phase measured for what it cost
// the node, the events it sent to the kubelet, and how long containerd took to answer a probe meanwhile.

// Storm phases.
const (
	PhaseDelete = "delete"
	PhaseCreate = "create"
	PhaseCrash  = "crash loop"
)

// StormReport is a run of the storm benchmark: its parameters and each setup's phases.
type StormReport struct {
	Kubelet string `json:"kubelet"`
	Date    string `json:"date"`
	CPUs    int    `json:"cpus"`
	// Command reproduces the run.
	Command string `json:"command"`
	// IdlePods run before the storm; StormPods are deleted at once, then as many created at once;
	// Crashers crash-loop for Crash.
	IdlePods  int `json:"idle_pods"`
	StormPods int `json:"storm_pods"`
	Crashers  int `json:"crashers"`
	// CrashScript is the crash-looping containers' script.
	CrashScript string `json:"crash_script"`
	// MaxPods is the kubelet's maxPods (0: its default).
	MaxPods int `json:"max_pods,omitempty"`
	// Window is the least time the delete and create phases are measured over (from the storm on);
	// Crash the crash-loop phase's length.
	Window time.Duration `json:"window_ns"`
	Crash  time.Duration `json:"crash_ns"`
	// Poll is the period of the test's reads of the kubelet's /pods and containerd's sandboxes; Probe
	// that of the probe.
	Poll  time.Duration `json:"poll_ns"`
	Probe time.Duration `json:"probe_ns"`
	Runs  []StormRun    `json:"runs"`
}

// StormRun is one setup's storm.
type StormRun struct {
	Setup string `json:"setup"`
	// Evented and PlegNRI say what the kubelet's events came from: none (GenericPLEG), containerd's
	// CRI stream, or pleg-nri.
	Evented bool `json:"evented"`
	PlegNRI bool `json:"plegnri"`
	// Limits are the host's limits with the idle pods running, before the storm.
	Limits *Limits      `json:"limits,omitempty"`
	Phases []StormPhase `json:"phases"`
}

// StormPhase is one phase of one setup's storm.
type StormPhase struct {
	Phase string `json:"phase"`
	// Pods are the pods deleted, created, or crash-looping.
	Pods int `json:"pods"`
	// Kubelet is, per pod, the time from its manifest's removal to the kubelet's /pods no longer having
	// it (delete), or from its manifest's writing to the kubelet reporting it Running (create), in ms;
	// KubeletLastMs from the storm's first manifest to the last pod; KubeletMissing the pods that never
	// got there.
	Kubelet        Quantiles `json:"kubelet_ms"`
	KubeletLastMs  *float64  `json:"kubelet_last_ms,omitempty"`
	KubeletMissing int       `json:"kubelet_missing"`
	// Containerd is, per deleted pod, the time from its manifest's removal to containerd showing every
	// sandbox of it not ready (delete only), as Kubelet.
	Containerd        *Quantiles `json:"containerd_ms,omitempty"`
	ContainerdLastMs  *float64   `json:"containerd_last_ms,omitempty"`
	ContainerdMissing int        `json:"containerd_missing"`
	// Restarts are the container restarts the kubelet reported during the phase (crash loop).
	Restarts *float64 `json:"restarts,omitempty"`
	// Cost is what the phase cost the node, over Cost.Seconds.
	Cost Cost `json:"cost"`
	// KubeletEvents are the events per second the kubelet took from its stream (its
	// evented_pleg_connection_latency_seconds_count; EventedPLEG only), PlegNRIEvents those pleg-nri
	// emitted (pleg_nri_events_emitted_total), ContainerdStreamMessages the messages containerd sent on
	// its GetContainerEvents streams (its grpc_server_msg_sent_total; nil when containerd does not
	// count them or its metrics are off).
	KubeletEvents            *float64 `json:"kubelet_events_per_second,omitempty"`
	PlegNRIEvents            *float64 `json:"plegnri_events_per_second,omitempty"`
	ContainerdStreamMessages *float64 `json:"containerd_stream_messages_per_second,omitempty"`
	// Probe is the latency of each probe call made to containerd's socket during the phase, by method
	// (ms); ProbeErrors the calls that failed (timed out).
	Probe       map[string]Quantiles `json:"probe_ms"`
	ProbeErrors int                  `json:"probe_errors"`
}

// ProbeMethods are the probe's calls, in the order it makes them.
var ProbeMethods = []string{"Version", "ListPodSandbox"}

// Latencies returns, for the pods of names, the time from start[name] to done[name] in ms, the time
// from the earliest start to the latest done (nil when none is done), and how many are not done (0 or
// absent in done). Times are nanoseconds since the epoch.
func Latencies(names []string, start, done map[string]int64) (ms []float64, lastMs *float64, missing int) {
	var first, last int64
	for _, name := range names {
		if s := start[name]; s != 0 && (first == 0 || s < first) {
			first = s
		}
		d := done[name]
		if d == 0 {
			missing++
			continue
		}
		ms = append(ms, float64(d-start[name])/1e6)
		last = max(last, d)
	}
	if last != 0 {
		l := math.Round(float64(last-first)/1e5) / 10
		lastMs = &l
	}
	return ms, lastMs, missing
}

// Phase returns the run's phase named name (nil when it has none).
func (r StormRun) Phase(name string) *StormPhase {
	for i := range r.Phases {
		if r.Phases[i].Phase == name {
			return &r.Phases[i]
		}
	}
	return nil
}

// StormMarkdown renders the report (docs/kubelet-storm-<version>.md).
func StormMarkdown(r StormReport) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# A storm on a node of %d pods, by PLEG (kubelet %s)", r.IdlePods, r.Kubelet)
	p("")
	p("Made by `%s` (`go test -run '^$' -bench BenchmarkNodeStorm -benchtime 1x ./test/kubelet-e2e/`) on %s, %d CPUs.",
		r.Command, r.Date, r.CPUs)
	p("Each setup runs its own kubelet against the same containerd, with %d host-network idle pods of one sleeping busybox", r.IdlePods)
	p("container running (the kubelet's maxPods: %s). Then, one after the other:", maxPodsText(r.MaxPods))
	p("")
	p("- **%s**: %d of them deleted at once (their static manifests removed together). Per pod, the time from its", PhaseDelete, min(r.StormPods, r.IdlePods))
	p("  manifest's removal to the kubelet's `/pods` no longer having it (its pod manager dropped it; the kubelet then stops")
	p("  it), and to containerd showing its sandbox not ready (the kubelet stopped it); *last* is from the first removal to")
	p("  the last pod.")
	p("- **%s**: %d pods created at once (their manifests written together); per pod, the time from its manifest to the", PhaseCreate, r.StormPods)
	p("  kubelet reporting it Running with its container ready, and from the first manifest to the last pod.")
	p("- **%s**: %d more pods whose one container crash-loops (restartPolicy Always, `%s`), measured for %s once every one", PhaseCrash, r.Crashers, r.CrashScript, r.Crash)
	p("  of them has restarted.")
	p("")
	p("The delete and create phases are measured over at least %s from the storm on (longer when the pods take longer).", r.Window)
	p("The test reads the kubelet's `/pods` and containerd's sandboxes every %s: the times are rounded up to that.", r.Poll)
	p("CPU is user+system seconds per minute of the phase from /proc (60 = one core busy); containerd's is its daemon only")
	p("(not the shims); pleg-nri is its core and its front (which serves the kubelet's CRI socket and forwards every call).")
	p("Events per second: what the kubelet took from its stream (its `evented_pleg_connection_latency_seconds_count`,")
	p("observed for every event that carries a sandbox status; EventedPLEG only), what pleg-nri emitted (`pleg_nri_events_emitted_total`), and the messages containerd sent on its")
	p("CRI event streams (`grpc_server_msg_sent_total` of `GetContainerEvents`, when containerd counts them; \"no counter\"")
	p("otherwise: containerd has no counter of its own CRI events). The probe calls %s on containerd's own", strings.Join(ProbeMethods, " then "))
	p("socket every %s, each on a connection of its own: only the kubelet of EventedPLEG on containerd reads containerd's", r.Probe)
	p("CRI event stream, so a probe slower there than in the two other setups in the same phase is containerd delayed by it.")
	for _, phase := range []string{PhaseDelete, PhaseCreate, PhaseCrash} {
		stormPhaseSection(p, r, phase)
	}
	p("")
	p("## Host limits before the storm")
	p("")
	p("Open files against each process's soft RLIMIT_NOFILE, threads against kernel.pid_max, inotify against")
	p("fs.inotify.max_user_* (counted over every process of the machine), with the %d idle pods running:", r.IdlePods)
	p("")
	for _, run := range r.Runs {
		if run.Limits != nil {
			p("- %s: %s.", run.Setup, run.Limits)
		}
	}
	return b.String()
}

func maxPodsText(n int) string {
	if n == 0 {
		return "its default, 110"
	}
	return fmt.Sprint(n)
}

func stormPhaseSection(p func(string, ...any), r StormReport, phase string) {
	var title string
	switch phase {
	case PhaseDelete:
		title = fmt.Sprintf("%d pods deleted at once", min(r.StormPods, r.IdlePods))
	case PhaseCreate:
		title = fmt.Sprintf("%d pods created at once", r.StormPods)
	default:
		title = fmt.Sprintf("%d containers crash-looping for %s", r.Crashers, r.Crash)
	}
	p("")
	p("## %s: %s", phase, title)
	p("")
	switch phase {
	case PhaseDelete:
		p("| setup | pods | kubelet: gone p50 | p90 | max | last | not gone | containerd: sandbox not ready p50 | p90 | max | last | not stopped |")
		p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	case PhaseCreate:
		p("| setup | pods | kubelet: Running p50 | p90 | max | last | not running |")
		p("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	default:
		p("| setup | pods | restarts | restarts/s |")
		p("| --- | ---: | ---: | ---: |")
	}
	for _, run := range r.Runs {
		ph := run.Phase(phase)
		if ph == nil {
			continue
		}
		k := ph.Kubelet
		switch phase {
		case PhaseDelete:
			c := Quantiles{}
			if ph.Containerd != nil {
				c = *ph.Containerd
			}
			p("| %s | %d | %s | %s | %s | %s | %d | %s | %s | %s | %s | %d |", run.Setup, ph.Pods, Seconds(k.P50), Seconds(k.P90), Seconds(k.Max),
				Seconds(ph.KubeletLastMs), ph.KubeletMissing, Seconds(c.P50), Seconds(c.P90), Seconds(c.Max), Seconds(ph.ContainerdLastMs), ph.ContainerdMissing)
		case PhaseCreate:
			p("| %s | %d | %s | %s | %s | %s | %d |", run.Setup, ph.Pods, Seconds(k.P50), Seconds(k.P90), Seconds(k.Max),
				Seconds(ph.KubeletLastMs), ph.KubeletMissing)
		default:
			restarts, rate := "-", "-"
			if ph.Restarts != nil {
				restarts, rate = fmt.Sprintf("%g", *ph.Restarts), fmt.Sprintf("%.2f", *ph.Restarts/ph.Cost.Seconds)
			}
			p("| %s | %d | %s | %s |", run.Setup, ph.Pods, restarts, rate)
		}
	}
	p("")
	p("| setup | seconds | kubelet CPU s/min | containerd CPU s/min | pleg-nri CPU s/min | pleg-nri front CPU s/min | node CPU s/min | pleg-nri RSS (core + front) | events/s taken by the kubelet | events/s emitted by pleg-nri | containerd CRI stream messages/s | load at end |")
	p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, run := range r.Runs {
		ph := run.Phase(phase)
		if ph == nil {
			continue
		}
		c := ph.Cost
		core, front, rss := c.PlegNRICells()
		stream := "-"
		if run.Evented && !run.PlegNRI {
			stream = rate(ph.ContainerdStreamMessages, "no counter")
		}
		p("| %s | %.0f | %.2f | %.2f | %s | %s | %.2f | %s | %s | %s | %s | %s |", run.Setup, c.Seconds, c.KubeletCPU, c.ContainerdCPU, core, front,
			c.Node(), rss, rate(ph.KubeletEvents, "-"), rate(ph.PlegNRIEvents, "-"), stream, c.Load)
	}
	p("")
	p("Probe on containerd's socket (ms):")
	p("")
	p("| setup | %s | errors |", strings.Join(func() []string {
		var h []string
		for _, m := range ProbeMethods {
			h = append(h, m+" n", m+" p50", m+" p90", m+" p99", m+" max")
		}
		return h
	}(), " | "))
	p("| --- |%s ---: |", strings.Repeat(" ---: |", 5*len(ProbeMethods)))
	for _, run := range r.Runs {
		ph := run.Phase(phase)
		if ph == nil {
			continue
		}
		var cells []string
		for _, m := range ProbeMethods {
			q := ph.Probe[m]
			cells = append(cells, fmt.Sprint(q.N), Cell(q.P50), Cell(q.P90), Cell(q.P99), Cell(q.Max))
		}
		p("| %s | %s | %d |", run.Setup, strings.Join(cells, " | "), ph.ProbeErrors)
	}
}

// Seconds renders a time in ms as seconds ("12.34 s"; "-" for none).
func Seconds(ms *float64) string {
	if ms == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f s", *ms/1000)
}

// rate renders a rate per second (none when nil).
func rate(v *float64, none string) string {
	if v == nil {
		return none
	}
	return fmt.Sprintf("%.1f", *v)
}

// Package conformance is a conformance suite for CRI container event streams (GetContainerEvents): it
// drives real pods and containers through a CRI endpoint, subscribes to the endpoint's stream, and
// checks what a kubelet relies on: one event per transition, their order, their content, reads after
// an event, a slow consumer, load. `pleg-nri conformance` runs it against any endpoint; the integration
// tests run it against pleg-nri's endpoint and containerd's own.
//
// The checks are specs (checks.go), each named as the sentence a failure contradicts. They read
// recordings of shared scenarios (scenarios.go), made once per run through the driver (driver.go),
// which labels every pod with the run's id and removes them all at the end, even when the run is
// interrupted.
package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/log"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/dial"
)

// Defaults of Options.
const (
	DefaultEndpoint = "unix:///run/containerd/containerd.sock"
	// DefaultImage is the busybox image the project's harness builds offline and imports
	// (test/containerd-it/harness.BusyboxImage; the integration test checks they agree).
	DefaultImage       = "docker.io/library/busybox:plegit"
	DefaultNamespace   = "pleg-nri-conformance"
	DefaultLoad        = 20
	DefaultEventWait   = 30 * time.Second
	DefaultQuiet       = time.Second
	DefaultProbeWait   = 2 * time.Second
	DefaultSlowPods    = 10
	cleanupTimeout     = 2 * time.Minute
	defaultCallTimeout = 30 * time.Second
)

// Options say what to run against and how.
type Options struct {
	// Endpoint is the CRI endpoint under test: unix:///path, /path or tcp://host:port.
	Endpoint string
	// Image is the image every container runs: it must be present on the node and have `sh`, `sleep`,
	// `tail` (busybox).
	Image string
	// Namespace is the Kubernetes namespace of the run's pods.
	Namespace string
	// RunID labels every pod of the run (RunLabel); random when empty.
	RunID string
	// Checks selects the checks to run: each entry is an id or an id's prefix (once, once/exit-0);
	// every check when empty.
	Checks []string
	// Load is the number of containers of the load check's pod.
	Load int
	// SlowPods is the number of pods the slow consumer check runs with a subscriber that does not read.
	SlowPods int
	// EventWait is how long a scenario waits for an event it expects before it goes on without it.
	EventWait time.Duration
	// Quiet is how long a scenario keeps listening after the last event it expects, to see duplicates.
	Quiet time.Duration
	// ProbeWait is how long a fresh stream must stay open to count as supported.
	ProbeWait time.Duration
	// PodConfig, if set, makes the base config of a pod (the suite sets its metadata and run label):
	// for a node that needs a cgroup parent or a log directory. Default: a pod on the node's network,
	// in the cgroup parent systemdSlice where the runtime's cgroup driver is systemd.
	PodConfig func(name string) *runtimeapi.PodSandboxConfig
	// RestartRuntime, if set, stops the runtime behind the endpoint, calls whileDown (which changes
	// something the runtime must find when it is back), starts the runtime again and returns once it
	// answers; the restart check is skipped without it.
	RestartRuntime func(ctx context.Context, whileDown func(context.Context) error) error
	// Kill SIGKILLs the process pid of sandbox or container id (the pid the runtime gives in its
	// verbose status: a sandbox's pause process, a container's first process); by default
	// killInCgroup, which kills it only if this host's /proc shows that pid in a cgroup named with id.
	Kill func(pid int, id string) error
	// ExpectReplay is what the endpoint documents a late subscriber gets of the events sent while
	// nobody listened (the late-subscriber check fails if it gets otherwise); ReplayUndeclared: only
	// reported.
	ExpectReplay Replay
	// LateWait is how long nobody listens after the late-subscriber check's pod is gone, before the
	// late subscriber subscribes: long enough, a runtime that holds events for nobody for a while
	// (containerd: 5 minutes) has dropped them, and logged what it logs for it.
	LateWait time.Duration
	// LogLines, if set, counts the lines the runtime behind the endpoint has logged so far: the
	// late-subscriber check then compares the lines logged while nobody listened with those logged for
	// the same pods with a subscriber.
	LogLines func() (int, error)
	// Now is the clock events are stamped with on receipt (time.Now by default).
	Now func() time.Time
}

// Replay is what a subscriber that comes late gets of the events sent while nobody listened.
type Replay string

const (
	// ReplayUndeclared: the endpoint says nothing; whatever it replays is reported, not judged.
	ReplayUndeclared Replay = ""
	// ReplayNone: nothing; the stream starts with the events from the subscription on.
	ReplayNone Replay = "none"
	// ReplayAll: every event sent while nobody listened, then the events from the subscription on.
	ReplayAll Replay = "all"
)

// ParseReplay parses a Replay: "", "none" or "all".
func ParseReplay(s string) (Replay, error) {
	switch r := Replay(s); r {
	case ReplayUndeclared, ReplayNone, ReplayAll:
		return r, nil
	}
	return "", fmt.Errorf("unknown replay %q: none or all", s)
}

func (o *Options) setDefaults() error {
	if o.Endpoint == "" {
		o.Endpoint = DefaultEndpoint
	}
	if o.Image == "" {
		return errors.New("no image: the suite needs an image with sh, sleep and tail (busybox)")
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.RunID == "" {
		b := make([]byte, 4)
		if _, err := rand.Read(b); err != nil {
			return fmt.Errorf("failed to make a run id: %w", err)
		}
		o.RunID = hex.EncodeToString(b)
	}
	if o.Load <= 0 {
		o.Load = DefaultLoad
	}
	if o.SlowPods <= 0 {
		o.SlowPods = DefaultSlowPods
	}
	if o.EventWait <= 0 {
		o.EventWait = DefaultEventWait
	}
	if o.Quiet <= 0 {
		o.Quiet = DefaultQuiet
	}
	if o.ProbeWait <= 0 {
		o.ProbeWait = DefaultProbeWait
	}
	if o.Kill == nil {
		o.Kill = killInCgroup
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if _, err := ParseReplay(string(o.ExpectReplay)); err != nil {
		return err
	}
	if o.LateWait < 0 {
		return fmt.Errorf("a negative LateWait %s", o.LateWait)
	}
	for _, c := range o.Checks {
		if !knownCheck(c) {
			return fmt.Errorf("no check is named %q or starts with it (checks: %s)", c, strings.Join(CheckIDs(), ", "))
		}
	}
	return nil
}

// suite is one run: the endpoint's client, the driver, and the scenarios' recordings, made once.
type suite struct {
	opts Options
	rt   runtimeapi.RuntimeServiceClient
	drv  *driver
	// support is what the probe found; unsupported is its error when it is not Supported.
	support     Support
	unsupported error

	lifecycle memo[*lifecycleRun]
	load      memo[*loadRun]
}

// Run runs the selected checks against opts.Endpoint and returns the report. Whatever the run made is
// removed before it returns, with a context of its own when ctx was cancelled (an interrupt); an error
// is returned only when the suite could not run at all (bad options, an endpoint that cannot be
// reached).
func Run(ctx context.Context, opts Options) (*Report, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	conn, err := dial.CRI(opts.Endpoint)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	s := &suite{opts: opts, rt: rt, drv: newDriver(rt, &opts, opts.RunID)}
	rep := &Report{Endpoint: opts.Endpoint, RunID: opts.RunID, Started: opts.Now()}
	log.G(ctx).WithField("endpoint", opts.Endpoint).WithField("run", opts.RunID).Info("conformance run starting")

	s.unsupported = probe(ctx, rt, opts.ProbeWait)
	if status.Code(s.unsupported) == codes.Unavailable {
		return nil, fmt.Errorf("cannot reach the CRI endpoint %s: %w", opts.Endpoint, s.unsupported)
	}
	s.support = Classify(s.unsupported)
	if opts.PodConfig == nil {
		s.drv.cgroupParent = defaultCgroupParent(ctx, rt)
	}
	for _, sp := range selected(opts.Checks) {
		res := Result{ID: sp.id, Name: sp.name}
		var figure string
		var err error
		switch {
		case ctx.Err() != nil:
			err = skipf("the run was interrupted: %v", ctx.Err())
		case sp.id != idUnsupported && s.support != Supported:
			err = skipf("the endpoint does not serve events: %v", s.unsupported)
		default:
			figure, err = sp.check(ctx, s)
			if err != nil && ctx.Err() != nil {
				// What the interrupt cut short is not the endpoint's failure.
				err = skipf("the run was interrupted: %v", ctx.Err())
			}
		}
		res.Figure = figure
		var skip skipError
		switch {
		case err == nil:
			res.Outcome = Pass
		case errors.As(err, &skip):
			res.Outcome, res.Failure = Skip, skip.reason
		default:
			res.Outcome, res.Failure = Fail, err.Error()
		}
		log.G(ctx).WithField("check", sp.id).WithField("outcome", res.Outcome).Debug(res.Failure)
		rep.Results = append(rep.Results, res)
	}

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := s.drv.cleanup(cctx); err != nil {
		rep.Cleanup = err.Error()
	}
	rep.Duration = opts.Now().Sub(rep.Started)
	return rep, nil
}

// skipError is a check that did not run, and why.
type skipError struct{ reason string }

func (e skipError) Error() string { return "skipped: " + e.reason }

func skipf(format string, args ...any) error { return skipError{fmt.Sprintf(format, args...)} }

// keep selects the events of the run: of a sandbox or container it made, or of a pod labeled with it.
func (s *suite) keep(ev *runtimeapi.ContainerEventResponse) bool {
	labels := ev.GetPodSandboxStatus().GetLabels()
	return s.drv.ours(ev.ContainerId) || labels[RunLabel] == s.opts.RunID && labels[SyncLabel] == ""
}

// sync returns once every recorder receives events: a stream's call returns before the server has
// registered the subscriber, and events sent meanwhile are not the subscriber's. It runs a sync pod
// and waits for its STARTED on each recorder (at most EventWait: a stream that never sends it is the
// checks' to find), then removes the pod.
func (s *suite) sync(ctx context.Context, recs ...*recorder) error {
	id, err := s.drv.runSyncPod(ctx)
	if err != nil {
		return err
	}
	for _, r := range recs {
		r.waitFor(ctx, s.opts.EventWait, hasEvent(id, started))
	}
	cctx, cancel := callCtx(ctx)
	defer cancel()
	return removePod(cctx, s.rt, id)
}

// callCtx bounds one CRI call of a scenario.
func callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, defaultCallTimeout)
}

package front

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/log"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/corelink"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet/fresh"
	"github.com/pleg-nri/pleg-nri/internal/dial"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// waitTimeout bounds every wait of a test for what a working machine does at once.
const waitTimeout = 10 * time.Second

// TestMain is also the front binary of the tests that spawn one (Ensure runs os.Executable, this
// test binary, with "front" and its flags).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "front" {
		cfg, err := ParseArgs(os.Args[2:], Config{})
		if err == nil {
			err = Run(context.Background(), cfg)
		}
		if err != nil {
			log.L.WithError(err).Error("front failed")
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// runtimeServer is containerd's CRI as far as the front needs it: Version answers (the gate's check),
// ListContainers answers with one container (a forwarded call).
type runtimeServer struct {
	testutil.VersionRuntime
}

func (runtimeServer) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{{Id: "c1"}}}, nil
}

// chanSource is the core's event source: every subscription gets what is sent on events.
type chanSource struct {
	events chan *runtimeapi.ContainerEventResponse
}

func (s chanSource) Subscribe() kubelet.EventStream { return chanStream(s) }

type chanStream chanSource

func (s chanStream) Next(ctx context.Context) (*runtimeapi.ContainerEventResponse, time.Time, error) {
	select {
	case ev := <-s.events:
		return ev, time.Time{}, nil
	case <-ctx.Done():
		return nil, time.Time{}, ctx.Err()
	}
}

func (chanStream) Close() {}

// node is a runtime socket and a core event socket in a short temporary directory.
type node struct {
	dir, runDir, runtime string
	events               chan *runtimeapi.ContainerEventResponse
}

func newNode(t *testing.T) *node {
	t.Helper()
	dir := testutil.ShortTempDir(t, "fr-")
	n := &node{dir: dir, runDir: filepath.Join(dir, "run"), runtime: filepath.Join(dir, "containerd.sock"),
		events: make(chan *runtimeapi.ContainerEventResponse, 10)}
	testutil.ServeGRPC(t, n.runtime, func(s *grpc.Server) {
		runtimeapi.RegisterRuntimeServiceServer(s, runtimeServer{testutil.VersionRuntime{Name: "fake"}})
	})
	return n
}

// startCore serves the core's event socket in the run directory, as the daemon does.
func (n *node) startCore(t *testing.T) {
	t.Helper()
	core, err := corelink.NewCore(corelink.CoreConfig{Events: chanSource{n.events}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := kubelet.NewServer("unix://"+filepath.Join(n.runDir, CoreSocketName), core)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.StopWithin(context.Background(), time.Second) })
}

func (n *node) config() Config {
	return Config{Listen: "unix://" + filepath.Join(n.dir, "cri.sock"), RuntimeEndpoint: "unix://" + n.runtime, RunDir: n.runDir,
		LogLevel: "info", ReadFreshness: string(fresh.DefaultReadFreshness), Version: "v-test"}
}

// run runs a front with cfg in this process until the test ends or it returns; its error arrives on
// the channel, which is then closed.
func run(t *testing.T, cfg Config) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(waitTimeout):
			t.Error("the front did not return")
		}
	})
	if err := testutil.Poll(context.Background(), waitTimeout, "the front to answer", func() (bool, error) {
		info, err := Query(cfg.RunDir, "info")
		return err == nil && info.Listen == cfg.Listen, nil
	}); err != nil {
		t.Fatal(err)
	}
	return done
}

func TestArgsRoundTrip(t *testing.T) {
	for _, c := range []Config{
		{Listen: "unix:///run/pleg-nri/cri.sock", RuntimeEndpoint: "unix:///run/containerd/containerd.sock", RunDir: "/run/pleg-nri",
			LogLevel: "debug", ReadFreshness: "off"},
		{Listen: "/a.sock", RuntimeEndpoint: "/b.sock", RunDir: "/r", LogLevel: "info", ReadFreshness: "off", Takeover: true,
			RefreshAfterStop: true, LogFile: "/r/front.log", CoreGrace: 20 * time.Second},
		{Listen: "tcp://127.0.0.1:9000", RuntimeEndpoint: "/b.sock", RunDir: "/r", LogLevel: "info", ReadFreshness: "off", AllowTCPListen: true},
	} {
		args := c.Args()
		if args[0] != "front" {
			t.Fatalf("Args() = %q, want \"front\" first", args)
		}
		got, err := ParseArgs(args[1:], Config{})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Errorf("ParseArgs(Args()) = %+v, want %+v", got, c)
		}
	}
	defaults := Config{Listen: "/l.sock", RunDir: "/run/x", Takeover: true}
	if got, err := ParseArgs(nil, defaults); err != nil || got.Listen != "/l.sock" || got.RunDir != "/run/x" || got.Takeover {
		t.Errorf("ParseArgs(nil, %+v) = %+v, %v: want the defaults but takeover", defaults, got, err)
	}
	// A TCP listen needs --allow-tcp-listen: a front taking a TCP socket over opens no listener that
	// would refuse it.
	if _, err := ParseArgs([]string{"--listen", "tcp://127.0.0.1:9000"}, Config{RunDir: "/run"}); err == nil ||
		!strings.Contains(err.Error(), "--allow-tcp-listen") {
		t.Errorf("ParseArgs of a TCP listen without --allow-tcp-listen: %v", err)
	}
	for _, args := range [][]string{{"--run-dir", "relative"}, {"extra"}, {"--no-such-flag"}, {"--core-grace", "-1s"}} {
		if _, err := ParseArgs(args, Config{RunDir: "/run"}); err == nil {
			t.Errorf("ParseArgs(%q): no error", args)
		}
	}
}

func TestInfoCompatible(t *testing.T) {
	fc := Config{Listen: "/l", RuntimeEndpoint: "/r", ReadFreshness: "overlay"}
	ok := Info{Protocol: Protocol, Revision: Revision, Listen: "/l", RuntimeEndpoint: "/r", ReadFreshness: "overlay"}
	if !ok.compatible(fc) {
		t.Errorf("%+v not compatible with %+v", ok, fc)
	}
	for _, change := range []func(*Info){
		func(i *Info) { i.Protocol++ }, func(i *Info) { i.Revision = "0123456789abcdef" }, func(i *Info) { i.Revision = "" },
		func(i *Info) { i.Listen = "/other" }, func(i *Info) { i.RuntimeEndpoint = "/other" },
		func(i *Info) { i.ReadFreshness = "off" }, func(i *Info) { i.RefreshAfterStop = true },
		func(i *Info) { i.CoreGrace = "20s" }, func(i *Info) { i.CoreGrace = "soon" },
	} {
		i := ok
		change(&i)
		if i.compatible(fc) {
			t.Errorf("%+v compatible with %+v", i, fc)
		}
	}
	// A front older than core-grace ends no stream for a core gone: it serves a grace of 0, and is
	// replaced for any other.
	fc.CoreGrace = 20 * time.Second
	for grace, want := range map[string]bool{"": false, "0s": false, "20s": true, "20000ms": true, "10s": false} {
		i := ok
		i.CoreGrace = grace
		if got := i.compatible(fc); got != want {
			t.Errorf("a front with core_grace %q compatible with core-grace %s: %v, want %v", grace, fc.CoreGrace, got, want)
		}
	}
}

// TestRunEndsStreamsWithoutCore (issue 56): a front whose core is gone ends each client's event stream
// with UNAVAILABLE once its core grace has passed, says so in its metrics, and tells its grace on its
// control socket.
func TestRunEndsStreamsWithoutCore(t *testing.T) {
	const grace = 300 * time.Millisecond
	n := newNode(t)
	cfg := n.config()
	cfg.CoreGrace = grace
	run(t, cfg)
	if info, err := Query(cfg.RunDir, "info"); err != nil || info.CoreGrace != "300ms" || !info.compatible(cfg) {
		t.Errorf("info = %+v, %v: want core_grace 300ms", info, err)
	}
	conn, err := dial.CRI(cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	start := time.Now()
	stream, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	if d := time.Since(start); status.Code(err) != codes.Unavailable || d < grace {
		t.Fatalf("the event stream ended after %s with %v, want UNAVAILABLE after at least %s", d, err, grace)
	}
	if !strings.Contains(err.Error(), "core has not come back within 300ms") {
		t.Errorf("the stream's end says %q, want the core has not come back", err)
	}
	if err := testutil.Poll(ctx, waitTimeout, "the metrics to count the end", func() (bool, error) {
		fams, err := (&Gatherer{RunDir: cfg.RunDir}).Gather()
		if err != nil {
			return false, err
		}
		for _, f := range fams {
			if f.GetName() == "pleg_nri_event_streams_core_gone_total" {
				return f.GetMetric()[0].GetCounter().GetValue() == 1, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Error(err)
	}
}

// TestRun: a front serves the kubelet's endpoint (forwarded calls, the core's events relayed), answers
// its control socket (info, metrics) and stops when asked.
func TestRun(t *testing.T) {
	n := newNode(t)
	n.startCore(t)
	cfg := n.config()
	done := run(t, cfg)

	info, err := Query(cfg.RunDir, "info")
	if err != nil {
		t.Fatal(err)
	}
	if info.PID != os.Getpid() || info.Version != "v-test" || !info.compatible(cfg) {
		t.Errorf("info = %+v", info)
	}
	conn, err := dial.CRI(cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if r, err := client.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); err != nil || len(r.Containers) != 1 {
		t.Fatalf("ListContainers through the front: %v, %v", r, err)
	}
	stream, err := client.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// The relay subscribes to the core once the stream is open; an event sent before is the core's
	// to drop, so keep sending until one arrives.
	got := make(chan *runtimeapi.ContainerEventResponse, 1)
	go func() {
		ev, err := stream.Recv()
		if err == nil {
			got <- ev
		}
		close(got)
	}()
	var ev *runtimeapi.ContainerEventResponse
	for ev == nil {
		select {
		case n.events <- &runtimeapi.ContainerEventResponse{ContainerId: "c1", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT}:
		case ev = <-got:
			if ev == nil {
				t.Fatal("the event stream ended")
			}
		case <-ctx.Done():
			t.Fatal("no event relayed")
		}
	}
	if ev.ContainerId != "c1" {
		t.Errorf("relayed %v", ev)
	}

	fams, err := (&Gatherer{RunDir: cfg.RunDir}).Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range fams {
		names[f.GetName()] = true
	}
	for _, want := range []string{"pleg_nri_forwarded_call_duration_seconds", "pleg_nri_event_streams", "go_goroutines"} {
		if !names[want] {
			t.Errorf("the front's metrics lack %s: %v", want, names)
		}
	}

	// Stop waits for the front's process to exit: this one's is the test's.
	if _, err := Query(cfg.RunDir, "stop"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the front did not stop")
	}
	if _, err := os.Stat(filepath.Join(cfg.RunDir, ControlSocketName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the control socket is left behind: %v", err)
	}
}

// TestTakeover: a front started with Takeover serves on its predecessor's sockets, which never go
// away (both socket files are checked every millisecond from before the takeover to after the
// predecessor returned); the predecessor returns.
func TestTakeover(t *testing.T) {
	n := newNode(t)
	cfg := n.config()
	first := run(t, cfg)
	socks := []string{strings.TrimPrefix(cfg.Listen, "unix://"), filepath.Join(cfg.RunDir, ControlSocketName)}
	stopWatching := testutil.WatchPresent(socks...)
	next := cfg
	next.Takeover, next.Version = true, "v-next"
	run(t, next)
	select {
	case err := <-first:
		if err != nil {
			t.Errorf("the first front: %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the first front did not hand over")
	}
	if err := stopWatching(); err != nil {
		t.Errorf("a socket file went away during the takeover: %v", err)
	}
	info, err := Query(cfg.RunDir, "info")
	if err != nil || info.Version != "v-next" {
		t.Fatalf("after the takeover: %+v, %v", info, err)
	}
	if _, err := os.Stat(strings.TrimPrefix(cfg.Listen, "unix://")); err != nil {
		t.Errorf("the kubelet's socket: %v", err)
	}

	// A takeover of another address is refused, and the running front serves on.
	other := cfg
	other.Listen, other.Takeover = "unix://"+filepath.Join(n.dir, "other.sock"), true
	if err := Run(context.Background(), other); err == nil || !strings.Contains(err.Error(), "serves") {
		t.Errorf("takeover of another address: %v", err)
	}
	if _, err := Query(cfg.RunDir, "info"); err != nil {
		t.Errorf("the running front after a refused takeover: %v", err)
	}
}

// TestEnsure: Ensure leaves a compatible front alone, replaces an incompatible one on the same address
// (a front spawned from this test binary, see TestMain), and Stop stops it.
func TestEnsure(t *testing.T) {
	n := newNode(t)
	cfg := n.config()
	first := run(t, cfg)
	ctx := context.Background()
	if err := Ensure(ctx, cfg, false); err != nil {
		t.Fatal(err)
	}
	if info, err := Query(cfg.RunDir, "info"); err != nil || info.PID != os.Getpid() {
		t.Fatalf("a compatible front was replaced: %+v, %v", info, err)
	}

	changed := cfg
	changed.ReadFreshness = "off"
	if err := Ensure(ctx, changed, false); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first:
	case <-time.After(waitTimeout):
		t.Fatal("the incompatible front did not hand over")
	}
	info, err := Query(cfg.RunDir, "info")
	if err != nil || info.PID == os.Getpid() || info.ReadFreshness != "off" {
		t.Fatalf("after Ensure: %+v, %v", info, err)
	}
	if err := Stop(cfg.RunDir); err != nil {
		t.Fatal(err)
	}
	if testutil.Alive(info.PID) {
		t.Errorf("the spawned front (pid %d) runs after Stop", info.PID)
	}
	if data, err := os.ReadFile(filepath.Join(cfg.RunDir, logName)); err != nil || !strings.Contains(string(data), "pleg-nri front stopped") {
		t.Errorf("the spawned front's log: %q, %v", data, err)
	}
	if err := Stop(cfg.RunDir); err != nil {
		t.Errorf("Stop with no front: %v", err)
	}
}

// TestEnsureFailure: a front that cannot start says why, in the caller's error.
func TestEnsureFailure(t *testing.T) {
	n := newNode(t)
	cfg := n.config()
	cfg.ReadFreshness = "sometimes"
	err := Ensure(context.Background(), cfg, false)
	if err == nil || !strings.Contains(err.Error(), "read-freshness") {
		t.Errorf("Ensure with a bad key: %v, want the front's error naming --read-freshness", err)
	}
}

func TestTailWriter(t *testing.T) {
	var w tailWriter
	_, _ = w.Write([]byte("pleg-nri: first\n"))
	_, _ = w.Write([]byte("pleg-nri: --listen: address in use\n\n"))
	if got := w.lastLine(); got != "--listen: address in use" {
		t.Errorf("lastLine() = %q", got)
	}
	_, _ = w.Write([]byte(strings.Repeat("x", 70<<10) + "\nlast words"))
	if got := w.lastLine(); got != "last words" {
		t.Errorf("lastLine() after a long write = %q", got)
	}
}

// TestLogFileNotThroughSymlink: the front's log file is not opened through a symbolic link (a file of
// the run directory that names another would have the front, root, append its log there).
func TestLogFileNotThroughSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "precious")
	if err := os.WriteFile(target, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, logName)
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	if f, err := openLog(path); err == nil {
		f.Close()
		t.Error("opened the log file through a symbolic link")
	}
	f, err := openLog(filepath.Join(dir, "new.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("new log file: %v, %v; want 0600", fi.Mode(), err)
	}
}

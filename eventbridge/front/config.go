package front

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/dial"
)

// Config is the front's configuration: a subset of the daemon's keys.
type Config struct {
	Listen          string
	RuntimeEndpoint string
	RunDir          string
	LogLevel        string
	// Takeover makes the front take the listening socket of the front running in RunDir.
	Takeover bool
	// ListenFD, when not 0, is the descriptor of an inherited listening socket for Listen: the core
	// that respawns a front which died hands it the socket it kept (see Supervisor), so that the socket
	// never closed and the connections made meanwhile wait in its backlog.
	ListenFD int
	// LogFile, when set, receives the front's output once it serves (before, its errors go to the
	// daemon that started it).
	LogFile string
	// ReadFreshness is the daemon's read-freshness key (fresh.ReadFreshness).
	ReadFreshness string
	// RefreshAfterStop is the daemon's refresh-after-stop key.
	RefreshAfterStop bool
	// AllowTCPListen is the daemon's allow-tcp-listen key: without it a tcp:// Listen is refused.
	AllowTCPListen bool
	// CoreGrace is the daemon's core-grace key (corelink.RelayConfig.CoreGrace): how long the core may be
	// gone before the front ends its clients' event streams; 0 never.
	CoreGrace time.Duration
	// Version is the binary's version, which the front tells on its control socket (not a flag: a
	// spawned front is this binary).
	Version string
}

// Args are the command line of a front with c, after the binary: "front" and its flags (ParseArgs'
// input).
func (c Config) Args() []string {
	a := []string{"front", "--listen", c.Listen, "--runtime-endpoint", c.RuntimeEndpoint, "--run-dir", c.RunDir, "--log-level", c.LogLevel,
		"--read-freshness", c.ReadFreshness, "--core-grace", c.CoreGrace.String()}
	if c.Takeover {
		a = append(a, "--takeover")
	}
	if c.ListenFD > 0 {
		a = append(a, "--listen-fd", strconv.Itoa(c.ListenFD))
	}
	if c.RefreshAfterStop {
		a = append(a, "--refresh-after-stop")
	}
	if c.AllowTCPListen {
		a = append(a, "--allow-tcp-listen")
	}
	if c.LogFile != "" {
		a = append(a, "--log-file", c.LogFile)
	}
	return a
}

// ParseArgs parses the front's flags (Args without "front"); a flag not given keeps its value in
// defaults.
func ParseArgs(args []string, defaults Config) (Config, error) {
	c := defaults
	c.Takeover, c.ListenFD, c.LogFile, c.RefreshAfterStop, c.AllowTCPListen = false, 0, "", false, false
	fs := flag.NewFlagSet("pleg-nri front", flag.ContinueOnError)
	fs.StringVar(&c.Listen, "listen", c.Listen, "CRI endpoint served to the kubelet")
	fs.StringVar(&c.RuntimeEndpoint, "runtime-endpoint", c.RuntimeEndpoint, "containerd's CRI endpoint (forwarded calls)")
	fs.StringVar(&c.RunDir, "run-dir", c.RunDir, "directory of the core's event socket and the front's control socket")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log level: trace, debug, info, warn, error")
	fs.BoolVar(&c.Takeover, "takeover", false, "take the listening socket over from the front running in run-dir")
	fs.IntVar(&c.ListenFD, "listen-fd", 0, "serve --listen on this inherited listening socket (a front respawned by the core)")
	fs.StringVar(&c.LogFile, "log-file", "", "file the front logs to once it serves (default: its stderr)")
	fs.StringVar(&c.ReadFreshness, "read-freshness", c.ReadFreshness, "how status reads stay as fresh as the events sent: overlay or off")
	fs.DurationVar(&c.CoreGrace, "core-grace", c.CoreGrace, "end the clients' event streams once the core has been gone this long (0: never)")
	fs.BoolVar(&c.RefreshAfterStop, "refresh-after-stop", false, "ask the core to send a stopped pod's STOPPED, or an early exit's, again once the client's calls about the pod went quiet")
	fs.BoolVar(&c.AllowTCPListen, "allow-tcp-listen", false, "allow a tcp:// --listen (no authentication: the endpoint is containerd's whole API)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.Takeover && c.ListenFD > 0 {
		return c, errors.New("--takeover and --listen-fd exclude each other")
	}
	if c.CoreGrace < 0 {
		return c, fmt.Errorf("--core-grace must not be negative, got %s", c.CoreGrace)
	}
	// Checked here too, not only by the listener: a front taking a TCP socket over opens none.
	if network, _, err := dial.ParseEndpoint(c.Listen); err == nil && network == "tcp" && !c.AllowTCPListen {
		return c, fmt.Errorf("--listen %s: a TCP endpoint is refused without --allow-tcp-listen (it has no authentication)", c.Listen)
	}
	if !filepath.IsAbs(c.RunDir) {
		return c, fmt.Errorf("--run-dir must be an absolute path, got %q", c.RunDir)
	}
	return c, nil
}

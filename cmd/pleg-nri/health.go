package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/internal/dial"
)

// healthCommand is `pleg-nri health`: whether pleg-nri serves its node, as the kubelet needs it. Two
// checks, both within --timeout each: the core's /readyz answers 200 (a front serves the endpoint, the
// NRI plugin is registered, containerd's events are subscribed, a relist completed), and the endpoint
// the kubelet uses answers a CRI Version call (the front is not hung: the core's view of the front is
// only whether its process holds its control connection, which a stopped or wedged front still does).
// It prints one line per check and fails (status 1) unless both pass. The Helm chart's readiness probe
// runs it (deploy/node.sh health).
func healthCommand() *cli.Command {
	def := config.Default()
	return &cli.Command{
		Name:      "health",
		Usage:     "check that pleg-nri serves this node: the core's /readyz and a CRI Version call through the kubelet's endpoint",
		UsageText: "pleg-nri health [flags]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "readyz", Value: "http://" + def.MetricsAddress + "/readyz",
				Usage: "the core's /readyz URL (http://<metrics-address>/readyz)"},
			&cli.StringFlag{Name: "runtime-endpoint", Aliases: []string{"r", "endpoint"}, Value: def.Listen,
				Usage: "the kubelet's endpoint, served by the front: unix:///path, /path or tcp://host:port"},
			&cli.DurationFlag{Name: "timeout", Value: 2 * time.Second, Usage: "how long each check may take"},
		},
		OnUsageError: onUsageError,
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if cmd.Args().Len() > 0 {
				return usageError{fmt.Errorf("unexpected argument %q", cmd.Args().First())}
			}
			if cmd.Duration("timeout") <= 0 {
				return usageError{errors.New("--timeout must be positive")}
			}
			readyz, err := readyzURL(cmd.String("readyz"))
			if err != nil {
				return usageError{fmt.Errorf("--readyz: %w", err)}
			}
			if _, err := dial.Target(cmd.String("runtime-endpoint")); err != nil {
				return usageError{fmt.Errorf("--runtime-endpoint: %w", err)}
			}
			return checkHealth(ctx, cmd.Root().Writer, readyz, cmd.String("runtime-endpoint"), cmd.Duration("timeout"))
		},
	}
}

// readyzURL checks a /readyz URL and points one on an unspecified host (":9810", "0.0.0.0:9810": the
// metrics server listens on every address) at loopback.
func readyzURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", err
	}
	if u.Scheme != "http" {
		return "", fmt.Errorf("%q: want http://host:port/path", s)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return "", fmt.Errorf("%q: %w", s, err)
	}
	switch host {
	case "", "0.0.0.0":
		u.Host = net.JoinHostPort("127.0.0.1", port)
	case "::":
		u.Host = net.JoinHostPort("::1", port)
	}
	return u.String(), nil
}

// errUnhealthy is checkHealth's error when a check failed (each failure is printed).
var errUnhealthy = errors.New("not healthy")

// checkHealth runs both checks (the second also when the first failed, so that the output says
// everything) and prints a line for each.
func checkHealth(ctx context.Context, w io.Writer, readyz, endpoint string, timeout time.Duration) error {
	failed := false
	report := func(what string, err error) {
		if err != nil {
			failed = true
			fmt.Fprintf(w, "%s: FAIL: %v\n", what, err)
			return
		}
		fmt.Fprintf(w, "%s: ok\n", what)
	}
	report("core "+readyz, checkReadyz(ctx, readyz, timeout))
	report("endpoint "+endpoint, checkEndpoint(ctx, endpoint, timeout))
	if failed {
		return errUnhealthy
	}
	return nil
}

// checkReadyz asks the core's /readyz; anything but a 200 within timeout is an error that says why
// (the body: /readyz gives the reason).
func checkReadyz(ctx context.Context, readyz string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, readyz, nil)
	if err != nil {
		return err
	}
	// No proxy: the metrics address is the node's own.
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// checkEndpoint makes a CRI Version call through endpoint within timeout. The front forwards it to
// containerd, so it fails while containerd does not answer either: the kubelet's own health check
// (its runtime's Status and Version) would then fail the same way.
func checkEndpoint(ctx context.Context, endpoint string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := dial.CRI(endpoint)
	if err != nil {
		return err
	}
	defer conn.Close()
	// Not WaitForReady: a missing socket or a refused connection fails at once; a front that accepts
	// but does not answer (stopped, wedged) leaves the connection connecting until the timeout.
	v, err := runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return fmt.Errorf("CRI Version: %w", err)
	}
	if v.GetRuntimeName() == "" {
		return errors.New("CRI Version: the answer names no runtime")
	}
	return nil
}

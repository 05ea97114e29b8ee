// Package health is the check of `pleg-nri health`: whether pleg-nri serves its node, as the kubelet
// needs it. Two checks, each within a timeout: the core's /readyz answers 200 (a front serves the
// endpoint, the NRI plugin is registered, containerd's events are subscribed, a relist completed), and
// the endpoint the kubelet uses answers a CRI Version call (the front is not hung: the core's view of
// the front is only whether its process holds its control connection, which a stopped or wedged front
// still does).
package health

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

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/dial"
)

// ErrUnhealthy is Check's error when a check failed (each failure is printed).
var ErrUnhealthy = errors.New("not healthy")

// ReadyzURL checks a /readyz URL and points one on an unspecified host (":9810", "0.0.0.0:9810": the
// metrics server listens on every address) at loopback.
func ReadyzURL(s string) (string, error) {
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

// Check runs both checks, each within timeout (the second also when the first failed, so that the
// output says everything), and prints a line for each to w. It returns ErrUnhealthy if one failed.
func Check(ctx context.Context, w io.Writer, readyz, endpoint string, timeout time.Duration) error {
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
		return ErrUnhealthy
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

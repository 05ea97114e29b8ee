// Command it-env brings the integration tests' isolated containerd up and down by hand:
//
//	it-env up     start an environment, print its sockets as shell exports (eval them)
//	it-env down   tear down the environment started by `up` (or every one given as arguments)
//
// `make it-up` and `make it-down` call it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// stateFile records the directory of the environment `up` started, for `down`.
const stateFile = "/run/pleg-nri-it/current"

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "it-env:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: it-env up|down [DIR...]")
	}
	switch args[0] {
	case "up":
		return up(ctx)
	case "down":
		return down(ctx, args[1:])
	}
	return fmt.Errorf("unknown command %q (want up or down)", args[0])
}

func up(ctx context.Context) error {
	if data, err := os.ReadFile(stateFile); err == nil {
		return fmt.Errorf("an environment is already up in %s: run `make it-down` first", strings.TrimSpace(string(data)))
	}
	where, err := harness.ContainerdFromEnv()
	if err != nil {
		return err
	}
	e, err := harness.New(ctx, harness.Options{Persistent: true, Log: os.Stderr, Containerd: where})
	if err != nil {
		return err
	}
	if err := e.Start(ctx); err != nil {
		_ = e.Teardown(context.WithoutCancel(ctx))
		return err
	}
	if err := os.MkdirAll(filepath.Dir(stateFile), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(stateFile, []byte(e.Dir+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Print(e.Exports())
	fmt.Fprintf(os.Stderr, "\ncontainerd %d is up; its log is %s\n", e.PID, e.LogPath)
	fmt.Fprintf(os.Stderr, "try:  eval \"$(make -s it-up)\"   # or paste the exports above\n")
	fmt.Fprintf(os.Stderr, "      crictl runp $PLEGIT_CRICTL_CONFIGS/pod.json\n")
	fmt.Fprintf(os.Stderr, "      crictl create <pod-id> $PLEGIT_CRICTL_CONFIGS/container.json $PLEGIT_CRICTL_CONFIGS/pod.json\n")
	fmt.Fprintf(os.Stderr, "then: make it-down\n")
	return nil
}

func down(ctx context.Context, dirs []string) error {
	fromState := len(dirs) == 0
	if fromState {
		data, err := os.ReadFile(stateFile)
		if errors.Is(err, os.ErrNotExist) {
			fmt.Fprintln(os.Stderr, "it-env: no environment is up")
			return nil
		}
		if err != nil {
			return err
		}
		dirs = []string{strings.TrimSpace(string(data))}
	}
	var errs []error
	for _, dir := range dirs {
		e, err := harness.Load(dir)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", dir, err))
			continue
		}
		e.SetLog(os.Stderr)
		if err := e.Teardown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", dir, err))
			continue
		}
		fmt.Fprintf(os.Stderr, "it-env: %s torn down, nothing left behind\n", dir)
	}
	if fromState && len(errs) == 0 {
		_ = os.Remove(stateFile)
	}
	return errors.Join(errs...)
}

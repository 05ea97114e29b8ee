// Command pleg-nri is the container event source for the kubelet's EventedPLEG on containerd nodes.
//
//	pleg-nri [flags]                     the daemon (see nri.conf.example for every key)
//	pleg-nri events [flags]              print a CRI endpoint's event stream (pleg-nri events -h)
//	pleg-nri front [flags]               the front (started by the daemon, see front.go)
//	pleg-nri stop-front [--run-dir DIR]  stop the front (ends the kubelet's event stream)
//	pleg-nri kubelet-config              point a kubelet's configuration at pleg-nri (pleg-nri kubelet-config -h)
//	pleg-nri version                     print the version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "%s: %v\n", filepath.Base(os.Args[0]), err)
		}
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "events":
			return runEvents(ctx, args[1:], os.Getenv, os.Stdout, os.Stderr)
		case "front":
			return runFront(ctx, args[1:])
		case "stop-front":
			return runStopFront(args[1:], os.Stdout)
		case "kubelet-config":
			return runKubeletConfig(args[1:], os.Stdout, os.Stderr)
		case "version":
			fmt.Printf("pleg-nri %s\n", version)
			return nil
		}
	}
	cfg, configPath, err := loadConfig(args)
	if err != nil {
		return err
	}
	return runDaemon(ctx, cfg, configPath)
}

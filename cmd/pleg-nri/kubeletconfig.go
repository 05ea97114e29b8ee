package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/urfave/cli/v3"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/internal/kubeletconfig"
)

// kubeletConfigCommand is `pleg-nri kubelet-config`: point a kubelet's configuration (and kubeadm's
// flags file, where it sets the endpoint) at a CRI endpoint, its image service at another (containerd's
// socket: the kubelet's image calls then never cross pleg-nri; issue 58) and set its EventedPLEG gate;
// with --record, what the image service was is kept for "restore". With --dropin-dir it switches
// through the kubelet's drop-in directory instead, which kubeadm upgrade node leaves alone (issue 60),
// and "restore" puts back the files as --record holds them. It prints
// "changed" or "unchanged", so that a caller restarts the kubelet only when needed. With --check it
// changes nothing and fails, naming each setting, when they differ: the Helm chart's readiness probe
// notices a kubelet taken off pleg-nri that way (issue 60). The Helm chart's node script runs it; an
// operator can too.
func kubeletConfigCommand() *cli.Command {
	return &cli.Command{
		Name:      "kubelet-config",
		Usage:     "point a kubelet's configuration at pleg-nri, its image service at containerd, and set its EventedPLEG gate; prints changed or unchanged",
		UsageText: "pleg-nri kubelet-config [flags]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Value: "/var/lib/kubelet/config.yaml", TakesFile: true,
				Usage: "the kubelet's configuration file (KubeletConfiguration)"},
			&cli.StringFlag{Name: "kubeadm-flags", Value: "/var/lib/kubelet/kubeadm-flags.env", TakesFile: true,
				Usage: "kubeadm's kubelet flags file, whose --container-runtime-endpoint (if any) is changed too, with --image-service-endpoint; missing is fine"},
			&cli.StringFlag{Name: "container-runtime-endpoint", Usage: "set containerRuntimeEndpoint to this (e.g. " + config.Default().Listen + ")"},
			&cli.StringFlag{Name: "image-service-endpoint", Usage: "set imageServiceEndpoint to this (containerd's socket, e.g. " + config.Default().RuntimeEndpoint +
				"; unset, the kubelet sends its image calls to the runtime endpoint), remove to remove it, or restore to put back what --record holds"},
			&cli.StringFlag{Name: "record", TakesFile: true,
				Usage: "a file keeping imageServiceEndpoint from before the switch: written when --image-service-endpoint sets it (unless it holds one), read and removed by --image-service-endpoint restore"},
			&cli.StringFlag{Name: "evented-pleg", Usage: "set the EventedPLEG feature gate: true, false, or remove"},
			&cli.StringFlag{Name: "dropin-dir",
				Usage: "switch through the kubelet's drop-in configuration directory (--config-dir; the kubelet's path, e.g. /etc/kubernetes/kubelet.conf.d) instead of editing --config: write " +
					kubeletconfig.DropinName + " there and add --config-dir to --kubeadm-flags (refused if the kubelet has another --config-dir), all recorded first in --record; " +
					"kubeadm upgrade node rewrites --config but leaves both alone. With --check: check the kubelet's effective settings (--config, then its drop-ins in lexical order)"},
			&cli.StringFlag{Name: "host-root", TakesFile: true,
				Usage: "where the kubelet's / is, for --dropin-dir (and the directories of --config-dir) when run from a pod; --config and --kubeadm-flags are given with it already"},
			&cli.BoolFlag{Name: "check", Usage: "change nothing: print each setting that differs (a drift) and fail if any does, else print unchanged"},
		},
		OnUsageError: onUsageError,
		Action: func(_ context.Context, cmd *cli.Command) error {
			if cmd.Args().Len() > 0 {
				return usageError{fmt.Errorf("unexpected argument %q", cmd.Args().First())}
			}
			e := kubeletconfig.Edit{Endpoint: cmd.String("container-runtime-endpoint"), ImageEndpoint: cmd.String("image-service-endpoint"),
				EventedPLEG: cmd.String("evented-pleg"), Record: cmd.String("record"), DropinDir: cmd.String("dropin-dir"), HostRoot: cmd.String("host-root")}
			if e.ImageEndpoint == "restore" && e.Record == "" {
				return usageError{errors.New("--image-service-endpoint restore needs --record")}
			}
			if e.DropinDir != "" && e.Record == "" && !cmd.Bool("check") {
				return usageError{errors.New("--dropin-dir needs --record (the undo puts the files back from it)")}
			}
			if cmd.Bool("check") {
				drift, err := kubeletconfig.Check(cmd.String("config"), cmd.String("kubeadm-flags"), e)
				if err != nil {
					return err
				}
				if len(drift) == 0 {
					fmt.Fprintln(cmd.Root().Writer, "unchanged")
					return nil
				}
				for _, d := range drift {
					fmt.Fprintln(cmd.Root().Writer, "drift: "+d)
				}
				return errKubeletDrift
			}
			changed, err := kubeletconfig.Apply(cmd.String("config"), cmd.String("kubeadm-flags"), e)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.Root().Writer, map[bool]string{true: "changed", false: "unchanged"}[changed])
			return nil
		},
	}
}

// errKubeletDrift is the error of `pleg-nri kubelet-config --check` when a setting differs.
var errKubeletDrift = errors.New("the kubelet's settings differ from the ones asked for")

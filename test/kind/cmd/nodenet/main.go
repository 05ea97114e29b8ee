// Command nodenet is the pod network of make e2e-cluster's kind clusters, doing what kind's own
// kindnetd does (kindnetd is not on the Go module proxy, so the offline node image cannot have it). It
// runs on every node as a DaemonSet pod in the node's network namespace and, whenever a node changes:
//
//   - writes the node's CNI configuration: the bridge plugin (with host-local IPAM) over the node's
//     spec.podCIDR, which the controller manager allocates from the cluster's pod subnet;
//   - routes every other node's podCIDR via that node's InternalIP (the nodes share one Docker
//     network, so each is one hop from the others);
//   - masquerades what pods send out of the cluster's pod subnet (to a node or beyond), and nothing
//     between pods, so a pod sees the other pod's own address wherever it runs.
//
// It needs the node's /etc/cni/net.d, NET_ADMIN, and iptables and ip in its image
// (test/kind/hack/iptables-image.sh). Everything it sets up stays when it stops, as kindnetd's does.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/log"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	var o options
	flag.StringVar(&o.node, "node", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	flag.StringVar(&o.clusterCIDR, "cluster-cidr", "", "the cluster's pod subnet (kind's networking.podSubnet): not masqueraded")
	flag.StringVar(&o.cniConfDir, "cni-conf-dir", "/etc/cni/net.d", "where containerd reads CNI configurations")
	flag.StringVar(&o.cniConfName, "cni-conf-name", "10-nodenet.conflist", "the file written in -cni-conf-dir")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig (default: the pod's service account)")
	flag.DurationVar(&o.resync, "resync", 30*time.Second, "how often everything is applied again, changes or not")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "nodenet:", err)
		os.Exit(1)
	}
}

type options struct {
	node, clusterCIDR, cniConfDir, cniConfName, kubeconfig string
	resync                                                 time.Duration
}

func run(ctx context.Context, o options) error {
	if o.node == "" {
		return errors.New("no node name: set -node or NODE_NAME")
	}
	if o.clusterCIDR == "" {
		return errors.New("-cluster-cidr is required")
	}
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	client, err := nodeClient(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("failed to turn on IPv4 forwarding: %w", err)
	}
	if err := ensureMasquerade(ctx, o.clusterCIDR); err != nil {
		return err
	}

	// changed never blocks the informer: one pending sync covers any number of changes.
	changed := make(chan struct{}, 1)
	nodes, err := watchNodes(ctx, client, o.resync, func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return err
	}
	log.G(ctx).WithField("node", o.node).Info("nodenet: watching nodes")

	a := &applier{o: o, routes: map[string]string{}}
	for {
		if err := a.apply(ctx, nodeInfos(nodes.List())); err != nil {
			// Told, and tried again on the next change or resync.
			log.G(ctx).WithError(err).Error("nodenet: failed to apply the node network")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("failed to load %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("failed to load the in-cluster configuration: %w", err)
	}
	return cfg, nil
}

// nodeClient is a REST client for the core API group that knows only its types: nodenet reads nodes
// and nothing else, so it does without client-go's generated clientset (every API group of
// Kubernetes, which tripled the project's compile).
func nodeClient(cfg *rest.Config) (*rest.RESTClient, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("failed to register the core API types: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.APIPath = "/api"
	cfg.GroupVersion = &corev1.SchemeGroupVersion
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if cfg.UserAgent == "" {
		cfg.UserAgent = "nodenet"
	}
	client, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("failed to make a client: %w", err)
	}
	return client, nil
}

// watchNodes lists and watches the cluster's nodes into the returned store, calling changed after every
// change and every resync, and returns once the store holds the first list.
func watchNodes(ctx context.Context, client rest.Interface, resync time.Duration, changed func()) (cache.Store, error) {
	store, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: cache.NewListWatchFromClient(client, "nodes", metav1.NamespaceAll, fields.Everything()),
		ObjectType:    &corev1.Node{},
		ResyncPeriod:  resync,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { changed() },
			UpdateFunc: func(any, any) { changed() },
			DeleteFunc: func(any) { changed() },
		},
	})
	go informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return nil, fmt.Errorf("the node informer did not sync: %w", ctx.Err())
	}
	return store, nil
}

// nodeInfos reduces the informer's nodes to what the plan needs.
func nodeInfos(list []any) []nodeInfo {
	out := make([]nodeInfo, 0, len(list))
	for _, obj := range list {
		n, ok := obj.(*corev1.Node)
		if !ok {
			continue
		}
		ni := nodeInfo{name: n.Name, podCIDRs: n.Spec.PodCIDRs}
		if len(ni.podCIDRs) == 0 && n.Spec.PodCIDR != "" {
			ni.podCIDRs = []string{n.Spec.PodCIDR}
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP && !strings.Contains(a.Address, ":") {
				ni.internalIP = a.Address
				break
			}
		}
		out = append(out, ni)
	}
	return out
}

// applier applies plans to this node, remembering the routes it added so that it removes those of a
// node that is gone or moved.
type applier struct {
	o options
	// routes: destination CIDR -> gateway, as last applied.
	routes map[string]string
	// conf is the CNI configuration as last written.
	conf []byte
}

func (a *applier) apply(ctx context.Context, nodes []nodeInfo) error {
	p, err := makePlan(nodes, a.o.node)
	if err != nil {
		return err
	}
	var errs []error
	if p.conf != nil && !bytes.Equal(p.conf, a.conf) {
		if err := writeAtomic(filepath.Join(a.o.cniConfDir, a.o.cniConfName), p.conf); err != nil {
			errs = append(errs, err)
		} else {
			a.conf = p.conf
			log.G(ctx).WithField("podCIDR", p.podCIDR).Info("nodenet: wrote the CNI configuration")
		}
	}
	for dst, gw := range p.routes {
		// replace is idempotent: it is run on every pass, so a route someone removed comes back.
		if out, err := exec.CommandContext(ctx, "ip", "-4", "route", "replace", dst, "via", gw).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("failed to route %s via %s: %w: %s", dst, gw, err, bytes.TrimSpace(out)))
			continue
		}
		if a.routes[dst] != gw {
			log.G(ctx).WithField("dst", dst).WithField("via", gw).Info("nodenet: routed")
		}
		a.routes[dst] = gw
	}
	for dst, gw := range a.routes {
		if _, ok := p.routes[dst]; ok {
			continue
		}
		if out, err := exec.CommandContext(ctx, "ip", "-4", "route", "del", dst, "via", gw).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("failed to remove the route to %s via %s: %w: %s", dst, gw, err, bytes.TrimSpace(out)))
			continue
		}
		delete(a.routes, dst)
		log.G(ctx).WithField("dst", dst).Info("nodenet: route removed")
	}
	return errors.Join(errs...)
}

// masqChain holds the masquerade rules; POSTROUTING jumps to it for traffic from the pod subnet.
const masqChain = "NODENET-MASQ"

// ensureMasquerade masquerades traffic from the pod subnet to anywhere outside it: pods reach the nodes
// and beyond under their node's address, and each other under their own.
func ensureMasquerade(ctx context.Context, clusterCIDR string) error {
	rules := fmt.Sprintf("*nat\n:%[1]s - [0:0]\n-A %[1]s -d %[2]s -j RETURN\n-A %[1]s -j MASQUERADE\nCOMMIT\n", masqChain, clusterCIDR)
	restore := exec.CommandContext(ctx, "iptables-restore", "--noflush")
	restore.Stdin = strings.NewReader(rules)
	if out, err := restore.CombinedOutput(); err != nil {
		return fmt.Errorf("failed to write the %s chain: %w: %s", masqChain, err, bytes.TrimSpace(out))
	}
	jump := func(op string) []string {
		return []string{"-t", "nat", op, "POSTROUTING", "-s", clusterCIDR, "-m", "comment", "--comment",
			"nodenet: pods leaving the pod subnet", "-j", masqChain}
	}
	if exec.CommandContext(ctx, "iptables", jump("-C")...).Run() == nil {
		return nil
	}
	if out, err := exec.CommandContext(ctx, "iptables", jump("-A")...).CombinedOutput(); err != nil {
		return fmt.Errorf("failed to add the jump to %s: %w: %s", masqChain, err, bytes.TrimSpace(out))
	}
	return nil
}

// writeAtomic writes data to path through a temporary file in the same directory, so that containerd
// never reads half a configuration.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("failed to write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("failed to write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("failed to write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("failed to write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("failed to write %s: %w", path, err)
	}
	return nil
}

package deploy

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/internal/testutil/plegnribin"
)

// criCalls records the CRI methods called on each fake endpoint.
type criCalls struct {
	mu    sync.Mutex
	calls map[string][]string // endpoint name -> full method names, in order
}

func (c *criCalls) record(name string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		c.mu.Lock()
		c.calls[name] = append(c.calls[name], info.FullMethod)
		c.mu.Unlock()
		return handler(ctx, req)
	}
}

func (c *criCalls) of(name string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.calls[name]...)
}

// fakeCRI answers Version and ImageFsInfo (the calls with which the kubelet validates each endpoint);
// every other call of either service is Unimplemented (and recorded).
type fakeCRI struct {
	testutil.VersionRuntime
	runtimeapi.UnimplementedImageServiceServer
}

func (fakeCRI) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	return &runtimeapi.ImageFsInfoResponse{}, nil
}

// TestKubeletDropin (issue 60): a real kubelet, started as kubeadm's systemd drop-in starts it
// (--config /var/lib/kubelet/config.yaml and $KUBELET_KUBEADM_ARGS from kubeadm-flags.env), after
// `pleg-nri kubelet-config --dropin-dir` and after config.yaml was rewritten as kubeadm upgrade node
// rewrites it, connects to the drop-in's containerRuntimeEndpoint (pleg-nri's) and imageServiceEndpoint,
// not to config.yaml's endpoint, and has the drop-in's EventedPLEG gate. The endpoints are fake CRI
// servers that record the calls; the kubelet is stopped once it has called them. Needs root and a
// kubelet (make deps-kubelet); skips loudly without them.
func TestKubeletDropin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP (loud): a kubelet needs root")
	}
	bin := os.Getenv("PLEG_NRI_KUBELET")
	if bin == "" {
		bin = filepath.Join(cacheDir(), "kubelet-v1.37.2", "kubelet")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("SKIP (loud): no kubelet at %s (make deps-kubelet builds it; PLEG_NRI_KUBELET names another)", bin)
	}
	dir := testutil.ShortTempDir(t, "kd-")
	calls := &criCalls{calls: map[string][]string{}}
	sock := map[string]string{}
	for _, name := range []string{"kubeadm", "pleg-nri", "images"} {
		sock[name] = filepath.Join(dir, name+".sock")
		testutil.ServeGRPC(t, sock[name], func(s *grpc.Server) {
			cri := fakeCRI{VersionRuntime: testutil.VersionRuntime{Name: "fake"}}
			runtimeapi.RegisterRuntimeServiceServer(s, cri)
			runtimeapi.RegisterImageServiceServer(s, cri)
		}, grpc.UnaryInterceptor(calls.record(name)))
	}
	addr, err := testutil.FreeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	port := addr[strings.LastIndex(addr, ":")+1:]
	// config.yaml as kubeadm writes it (abridged to a standalone kubelet that disturbs the machine least):
	// containerd's endpoint (here the fake "kubeadm"), no gate.
	config := filepath.Join(dir, "config.yaml")
	kubeadmConfig := `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://` + sock["kubeadm"] + `
registerNode: false
address: 127.0.0.1
port: ` + port + `
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: [none]
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: false
makeIPTablesUtilChains: false
podLogsDir: ` + filepath.Join(dir, "pods") + `
`
	flags := filepath.Join(dir, "kubeadm-flags.env")
	for path, data := range map[string]string{config: kubeadmConfig, flags: "KUBELET_KUBEADM_ARGS=\"--v=4\"\n"} {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	confd := filepath.Join(dir, "kubelet.conf.d")
	out, err := exec.Command(plegnribin.Binary(t, plegnribin.Default), "kubelet-config", "--config", config, "--kubeadm-flags", flags,
		"--dropin-dir", confd, "--record", filepath.Join(dir, "record"), "--container-runtime-endpoint", "unix://"+sock["pleg-nri"],
		"--image-service-endpoint", "unix://"+sock["images"], "--evented-pleg", "true").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "changed" {
		t.Fatalf("pleg-nri kubelet-config --dropin-dir: %v\n%s", err, out)
	}
	// kubeadm upgrade node: config.yaml written anew from the ConfigMap.
	if err := os.WriteFile(config, []byte(kubeadmConfig+"maxPods: 100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fdata, err := os.ReadFile(flags)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`KUBELET_KUBEADM_ARGS="([^"]*)"`).FindSubmatch(fdata)
	if m == nil || !strings.Contains(string(m[1]), "--config-dir="+confd) {
		t.Fatalf("kubeadm-flags.env: %s", fdata)
	}
	// As kubeadm's 10-kubeadm.conf runs it: $KUBELET_CONFIG_ARGS then $KUBELET_KUBEADM_ARGS.
	args := append([]string{"--config=" + config, "--root-dir=" + filepath.Join(dir, "root"), "--cert-dir=" + filepath.Join(dir, "pki"),
		"--hostname-override=pleg-nri-dropin-test"}, strings.Fields(string(m[1]))...)
	var log testutil.SyncBuffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		testutil.StopProcess(cmd.Process, done, os.Interrupt, 10*time.Second)
		if t.Failed() {
			t.Logf("kubelet %v\nlog:\n%s", args, log.String())
		}
	})
	err = testutil.PollEvery(context.Background(), 60*time.Second, 200*time.Millisecond, "the kubelet calling the drop-in's endpoints", func() (bool, error) {
		rt, img := calls.of("pleg-nri"), calls.of("images")
		if len(rt) > 0 && len(img) > 0 {
			return true, nil
		}
		detail := "pleg-nri's endpoint: " + strings.Join(rt, ",") + "; images: " + strings.Join(img, ",")
		if c := calls.of("kubeadm"); len(c) > 0 {
			return false, testutil.Stop(errors.New("the kubelet called config.yaml's endpoint (it did not read the drop-in): " + strings.Join(c, ",") + "; " + detail))
		}
		select {
		case err := <-done:
			done <- err
			return false, testutil.Stop(errors.New("the kubelet exited (" + errString(err) + "); " + detail))
		default:
		}
		return false, errors.New(detail)
	})
	if err != nil {
		t.Fatal(err)
	}
	if c := calls.of("kubeadm"); len(c) != 0 {
		t.Errorf("the kubelet called config.yaml's endpoint: %v", c)
	}
	if rt := calls.of("pleg-nri"); rt[0] != "/runtime.v1.RuntimeService/Version" {
		t.Errorf("pleg-nri's endpoint: first call %s, want Version", rt[0])
	}
	for _, c := range calls.of("images") {
		if !strings.HasPrefix(c, "/runtime.v1.ImageService/") {
			t.Errorf("the image endpoint got %s", c)
		}
	}
	for _, c := range calls.of("pleg-nri") {
		if strings.HasPrefix(c, "/runtime.v1.ImageService/") {
			t.Errorf("pleg-nri's endpoint got an image call %s", c)
		}
	}
	t.Logf("the kubelet (%s) called pleg-nri's endpoint %v and the image endpoint %v", bin, calls.of("pleg-nri"), calls.of("images"))
	// The gate: the kubelet logs its feature gates; EventedPLEG=true comes only from the drop-in.
	if !regexp.MustCompile(`EventedPLEG[:=" ]+true`).MatchString(log.String()) {
		t.Errorf("the kubelet's log does not show EventedPLEG true")
	}
}

func errString(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

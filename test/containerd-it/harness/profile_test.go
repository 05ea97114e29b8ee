package harness

import (
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
)

// TestParseMethodCounts: containerd's gRPC counters, summed over codes, keyed Service/Method, with the
// handling time's sum; the rates between two scrapes leave out methods not called.
func TestParseMethodCounts(t *testing.T) {
	const before = `# TYPE grpc_server_handled_total counter
grpc_server_handled_total{grpc_code="OK",grpc_method="ListContainers",grpc_service="runtime.v1.RuntimeService",grpc_type="unary"} 100
grpc_server_handled_total{grpc_code="NotFound",grpc_method="ContainerStatus",grpc_service="runtime.v1.RuntimeService",grpc_type="unary"} 5
grpc_server_handled_total{grpc_code="OK",grpc_method="ContainerStatus",grpc_service="runtime.v1.RuntimeService",grpc_type="unary"} 15
grpc_server_handled_total{grpc_code="OK",grpc_method="Version",grpc_service="runtime.v1.RuntimeService",grpc_type="unary"} 1
grpc_server_handling_seconds_sum{grpc_method="ListContainers",grpc_service="runtime.v1.RuntimeService",grpc_type="unary"} 0.5
grpc_server_handling_seconds_bucket{grpc_method="ListContainers",grpc_service="runtime.v1.RuntimeService",grpc_type="unary",le="0.005"} 90
`
	b, err := ParseMethodCounts(strings.NewReader(before))
	if err != nil {
		t.Fatal(err)
	}
	if got := b["RuntimeService/ContainerStatus"]; got.Calls != 20 {
		t.Errorf("ContainerStatus: %+v, want 20 calls (both codes)", got)
	}
	if got := b["RuntimeService/ListContainers"]; got.Calls != 100 || got.Seconds != 0.5 {
		t.Errorf("ListContainers: %+v, want 100 calls, 0.5 s", got)
	}
	after := strings.NewReplacer(`"unary"} 100`, `"unary"} 160`, `"unary"} 0.5`, `"unary"} 0.8`).Replace(before)
	a, err := ParseMethodCounts(strings.NewReader(after))
	if err != nil {
		t.Fatal(err)
	}
	rates := MethodRates(b, a, 30*time.Second)
	if len(rates) != 1 || rates["RuntimeService/ListContainers"].Calls != 2 || rates["RuntimeService/ListContainers"].Seconds < 0.00999 {
		t.Errorf("rates %+v, want ListContainers only, 2 calls/s and 0.01 s/s", rates)
	}
}

// TestSummarizeProfile reads a real CPU profile (of this test, burning CPU in a named function) with go
// tool pprof.
func TestSummarizeProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		t.Fatal(err)
	}
	burnForProfile(300 * time.Millisecond)
	pprof.StopCPUProfile()
	f.Close()
	s, err := SummarizeProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	if s.CPUSeconds <= 0 || s.Seconds <= 0 || len(s.Flat) == 0 {
		t.Fatalf("summary %+v: want CPU, a duration and top functions", s)
	}
	found := false
	for _, f := range append(s.Flat, s.Cum...) {
		found = found || strings.Contains(f, "burnForProfile")
	}
	if !found {
		t.Errorf("burnForProfile is not among the top functions: flat %v, cum %v", s.Flat, s.Cum)
	}
}

//go:noinline
func burnForProfile(d time.Duration) {
	x := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		for i := range 1000 {
			x += i * i
		}
	}
	_ = x
}

// TestConfigProfile: containerd's config opens the debug socket, the metrics endpoint and the gRPC
// histograms only with Options.Profile.
func TestConfigProfile(t *testing.T) {
	for _, profile := range []bool{false, true} {
		dir := t.TempDir()
		e := &Env{Dir: dir, ConfigPath: filepath.Join(dir, "config.toml"), CNIConfDir: dir, opts: Options{LogLevel: "info"}}
		if profile {
			e.DebugAddress, e.MetricsAddress = filepath.Join(dir, "debug.sock"), "127.0.0.1:1234"
		}
		if err := e.writeConfigs(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(e.ConfigPath)
		if err != nil {
			t.Fatal(err)
		}
		cfg := string(b)
		for _, want := range []string{`address = "` + filepath.Join(dir, "debug.sock") + `"`, "[metrics]", `address = "127.0.0.1:1234"`, "grpc_histogram = true"} {
			if strings.Contains(cfg, want) != profile {
				t.Errorf("profile %v: config has %q: %v, want %v\n%s", profile, want, !profile, profile, cfg)
			}
		}
		if !strings.Contains(cfg, "level = \"info\"\n") || !strings.Contains(cfg, "\n  [plugins.\"io.containerd.nri.v1.nri\"]") {
			t.Errorf("profile %v: config lost its debug level or NRI section:\n%s", profile, cfg)
		}
	}
}

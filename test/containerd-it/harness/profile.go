package harness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// What containerd does, for the benchmarks (Options.Profile): the gRPC calls it serves, by method (its
// gRPC server's own counters and handling times on /v1/metrics), and where its CPU goes (a CPU profile
// from its debug socket).

// MethodCount is one gRPC method's count of calls served and their summed handling time.
type MethodCount struct {
	Calls   float64 `json:"calls"`
	Seconds float64 `json:"handling_seconds"`
}

// ContainerdMethods scrapes containerd's per-method gRPC counters (calls by every client: the kubelet,
// pleg-nri, the shims' ttrpc excluded), keyed "Service/Method" (e.g. "RuntimeService/ListContainers").
func (e *Env) ContainerdMethods() (map[string]MethodCount, error) {
	resp, err := http.Get("http://" + e.MetricsAddress + "/v1/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return ParseMethodCounts(resp.Body)
}

var grpcSample = regexp.MustCompile(`^(grpc_server_handled_total|grpc_server_handling_seconds_sum)\{(.*)\} (\S+)$`)

// ParseMethodCounts reads grpc_server_handled_total (summed over codes) and
// grpc_server_handling_seconds_sum from a Prometheus text exposition.
func ParseMethodCounts(r io.Reader) (map[string]MethodCount, error) {
	out := map[string]MethodCount{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		m := grpcSample.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			return nil, fmt.Errorf("bad sample %q: %w", sc.Text(), err)
		}
		labels := map[string]string{}
		for _, kv := range strings.Split(m[2], ",") {
			if k, val, ok := strings.Cut(kv, "="); ok {
				labels[k] = strings.Trim(val, `"`)
			}
		}
		svc := labels["grpc_service"]
		if i := strings.LastIndexByte(svc, '.'); i >= 0 {
			svc = svc[i+1:]
		}
		key := svc + "/" + labels["grpc_method"]
		c := out[key]
		if m[1] == "grpc_server_handled_total" {
			c.Calls += v
		} else {
			c.Seconds += v
		}
		out[key] = c
	}
	return out, sc.Err()
}

// MethodRates is what was served between two scrapes, per second of d, for the methods called at all.
func MethodRates(before, after map[string]MethodCount, d time.Duration) map[string]MethodCount {
	out := map[string]MethodCount{}
	for k, a := range after {
		b := before[k]
		if a.Calls-b.Calls <= 0 {
			continue
		}
		out[k] = MethodCount{Calls: (a.Calls - b.Calls) / d.Seconds(), Seconds: (a.Seconds - b.Seconds) / d.Seconds()}
	}
	return out
}

// ProfileCPU takes a CPU profile of containerd over d from its debug socket (Options.Profile) and writes
// it to path.
func (e *Env) ProfileCPU(ctx context.Context, d time.Duration, path string) error {
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dialer net.Dialer
		return dialer.DialContext(ctx, "unix", e.DebugAddress)
	}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://containerd/debug/pprof/profile?seconds=%d", int(d.Seconds())), nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("containerd's pprof: %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ProfileSummary is what a CPU profile of containerd says.
type ProfileSummary struct {
	// Path is the profile's file (go tool pprof reads it).
	Path string `json:"path"`
	// Seconds is the profile's length and CPUSeconds the CPU it sampled.
	Seconds    float64 `json:"seconds"`
	CPUSeconds float64 `json:"cpu_seconds"`
	// ByMethod is the CPU (cumulative) spent in each CRI method's handler (containerd's instrumented
	// CRI service), by "Service/Method".
	ByMethod map[string]float64 `json:"cpu_seconds_by_cri_method"`
	// Flat are the functions with the most CPU of their own, "name seconds", most first.
	Flat []string `json:"top_flat"`
	// Cum are the functions with the most CPU under them, past the runtime's roots, most first.
	Cum []string `json:"top_cumulative"`
}

// criHandler matches containerd's CRI handlers: internal/cri/instrument.(*instrumentedService).Method,
// one per RuntimeService and ImageService method.
var criHandler = regexp.MustCompile(`/internal/cri/instrument\.\(\*instrumentedService\)\.([A-Za-z]+)$`)

// SummarizeProfile reads a CPU profile with `go tool pprof -top`.
func SummarizeProfile(path string) (*ProfileSummary, error) {
	s := &ProfileSummary{Path: path, ByMethod: map[string]float64{}}
	top := func(sortBy string) ([][2]string, error) {
		out, err := exec.Command("go", "tool", "pprof", "-top", sortBy, "-nodefraction=0", "-nodecount=100000", path).Output()
		if err != nil {
			return nil, fmt.Errorf("go tool pprof %s: %w", path, err)
		}
		var rows [][2]string
		head := regexp.MustCompile(`Duration: (\S+), Total samples = (\S+)`)
		for _, line := range strings.Split(string(out), "\n") {
			if m := head.FindStringSubmatch(line); m != nil {
				s.Seconds, s.CPUSeconds = pprofSeconds(m[1]), pprofSeconds(m[2])
				continue
			}
			f := strings.Fields(line)
			if len(f) < 6 || !strings.HasSuffix(f[1], "%") || !strings.HasSuffix(f[4], "%") {
				continue
			}
			// flat flat% sum% cum cum% name
			if sortBy == "-cum" {
				rows = append(rows, [2]string{strings.Join(f[5:], " "), f[3]})
			} else {
				rows = append(rows, [2]string{strings.Join(f[5:], " "), f[0]})
			}
		}
		return rows, nil
	}
	cum, err := top("-cum")
	if err != nil {
		return nil, err
	}
	for _, r := range cum {
		if m := criHandler.FindStringSubmatch(r[0]); m != nil {
			svc := "RuntimeService"
			if strings.Contains(m[1], "Image") {
				svc = "ImageService"
			}
			s.ByMethod[svc+"/"+m[1]] += pprofSeconds(r[1])
		}
		if len(s.Cum) < 15 && !strings.HasPrefix(r[0], "runtime.") {
			s.Cum = append(s.Cum, fmt.Sprintf("%s %.2fs", r[0], pprofSeconds(r[1])))
		}
	}
	flat, err := top("-flat")
	if err != nil {
		return nil, err
	}
	for _, r := range flat[:min(10, len(flat))] {
		s.Flat = append(s.Flat, fmt.Sprintf("%s %.2fs", r[0], pprofSeconds(r[1])))
	}
	return s, nil
}

// pprofSeconds parses pprof's "1.20s", "10ms", "190.55us" or "0".
func pprofSeconds(v string) float64 {
	d, err := time.ParseDuration(strings.TrimSuffix(v, ","))
	if err != nil {
		return 0
	}
	return d.Seconds()
}

package containerdit

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/httpbounds"
	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
)

// Scrape flood (issue 56): what 64 scrape loops and 10,000 idle connections to pleg-nri's metrics port
// do to the kubelet's CRI calls through the front.
const (
	floodScrapers = 64
	floodIdle     = 10000
	floodDialers  = 100
	// floodRounds rounds of one quiet and one flooded phase (their order alternating), floodCalls
	// ListContainers calls through the front in each phase.
	floodRounds = 24
	floodCalls  = 1000
)

// BenchmarkScrapeFlood: in floodRounds rounds, floodCalls ListContainers calls through the front with
// nothing else (quiet), as many while floodScrapers goroutines scrape pleg-nri's /metrics in a loop
// and floodIdle connections to its metrics port are held open (flooded), and as many under the same
// flood aimed at a stand-in server in a process of its own (control: this test binary again, serving
// the bytes of one pleg-nri scrape with the same connection limit and timeouts). The phases' order
// rotates from round to round. On a 2-core machine the flood's own clients take CPU from everything, so
// the flooded phase minus the quiet one is the flood's whole effect, and the flooded phase minus the
// control is pleg-nri's own part of it (its metrics server and the front's metrics it asks for): the goal
// (below 10 % of the quiet p99) is about that part. It reports each phase's p50 and p99 and the paired
// differences with their 95 % intervals.
//
//	go test -count=1 -run '^$' -bench BenchmarkScrapeFlood -benchtime 1x ./test/containerd-it/
func BenchmarkScrapeFlood(b *testing.B) {
	p := startPlegNRI(b, benchPlegFlags...)
	rt := benchRuntime(b, p.Socket)
	id, cfg := benchRunPod(b, rt, "bench-flood-"+randomSuffix())
	for j := range 3 {
		resp, err := rt.CreateContainer(b.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: id,
			Config: containerConfig(fmt.Sprintf("sleeper-%d", j), "sleep 3600"), SandboxConfig: cfg})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := rt.StartContainer(b.Context(), &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			b.Fatal(err)
		}
	}
	phase := func() (p50, p99 float64) {
		var us []float64 // ms
		for range floodCalls {
			start := time.Now()
			if _, err := rt.ListContainers(b.Context(), &runtimeapi.ListContainersRequest{}); err != nil {
				b.Fatal(err)
			}
			us = append(us, float64(time.Since(start).Microseconds())/1e3) // ms
		}
		return benchreport.Quantile(us, 0.5), benchreport.Quantile(us, 0.99)
	}
	flooded := func(addr string) (p50, p99 float64, idle, scrapes int) {
		ctx, cancel := context.WithCancel(b.Context())
		var wg sync.WaitGroup
		var mu sync.Mutex
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: floodScrapers}}
		for range floodScrapers {
			wg.Go(func() {
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
					resp, err := client.Do(req)
					if err != nil {
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					mu.Lock()
					scrapes++
					mu.Unlock()
				}
			})
		}
		// The scrapers first, so that they hold the server's connections (keep-alive); the idle
		// connections then wait in its backlog, as a flood of them would.
		time.Sleep(200 * time.Millisecond)
		// The idle connections, made by floodDialers at once: past the listen backlog (the server
		// accepts at most its connection limit) a dial waits for its SYN's retry: it gives up after
		// 20 ms and the flood goes on with the connections made.
		var conns []net.Conn
		var cmu sync.Mutex
		var dials sync.WaitGroup
		d := net.Dialer{Timeout: 20 * time.Millisecond}
		for range floodDialers {
			dials.Go(func() {
				for range floodIdle / floodDialers {
					c, err := d.DialContext(ctx, "tcp", addr)
					if err != nil {
						continue
					}
					cmu.Lock()
					conns = append(conns, c)
					cmu.Unlock()
				}
			})
		}
		dials.Wait()
		p50, p99 = phase()
		cancel()
		wg.Wait()
		client.CloseIdleConnections()
		for _, c := range conns {
			_ = c.Close()
		}
		return p50, p99, len(conns), scrapes
	}
	standin := startStandinMetrics(b, p.MetricsAddr)
	var q50, q99, f50, f99, c50, c99 []float64
	idle, scrapes, cidle := 0, 0, 0
	for i := range floodRounds {
		phases := []func(){
			func() {
				a, c := phase()
				q50, q99 = append(q50, a), append(q99, c)
			},
			func() {
				a, c, n, s := flooded(p.MetricsAddr)
				f50, f99 = append(f50, a), append(f99, c)
				idle, scrapes = max(idle, n), scrapes+s
			},
			func() {
				a, c, n, _ := flooded(standin)
				c50, c99 = append(c50, a), append(c99, c)
				cidle = max(cidle, n)
			},
		}
		for j := range phases {
			phases[(i+j)%len(phases)]()
			time.Sleep(200 * time.Millisecond)
		}
	}
	d99 := benchreport.PairedQuantileDiff(f99, q99, 0.5)
	d50 := benchreport.PairedQuantileDiff(f50, q50, 0.5)
	own99 := benchreport.PairedQuantileDiff(f99, c99, 0.5)
	ctl99 := benchreport.PairedQuantileDiff(c99, q99, 0.5)
	b.Logf("ListContainers through the front, %d rounds of %d calls a phase: quiet p50 %.2f ms, p99 %.2f ms; flooded (%d scrapers, %d idle connections held, %d scrapes in all) p50 %.2f ms, p99 %.2f ms; the same flood on the stand-in (%d idle held) p50 %.2f ms, p99 %.2f ms",
		floodRounds, floodCalls, benchreport.Median(q50), benchreport.Median(q99), floodScrapers, idle, scrapes,
		benchreport.Median(f50), benchreport.Median(f99), cidle, benchreport.Median(c50), benchreport.Median(c99))
	b.Logf("paired (median over rounds, 95 %% interval): flooded minus quiet p99 %s, p50 %s; the stand-in's flood minus quiet p99 %s; pleg-nri's own part, flooded minus the stand-in's flood, p99 %s",
		d99, d50, ctl99, own99)
	b.Logf("p99 ratios: flooded/quiet %.2f, stand-in/quiet %.2f, flooded/stand-in %.2f",
		benchreport.Median(f99)/benchreport.Median(q99), benchreport.Median(c99)/benchreport.Median(q99), benchreport.Median(f99)/benchreport.Median(c99))
	b.ReportMetric(d99.Diff*1e3, "p99-added-us")
	b.ReportMetric(own99.Diff*1e3, "p99-own-us")
	b.ReportMetric(benchreport.Median(f99)/benchreport.Median(q99), "p99-ratio")
	b.ReportMetric(0, "ns/op")
}

// standinMetricsEnv names the file whose bytes the stand-in metrics server serves at /metrics.
const standinMetricsEnv = "PLEGIT_STANDIN_METRICS"

// startStandinMetrics starts BenchmarkScrapeFlood's control: this test binary again, as a server in a
// process of its own that serves the bytes of one scrape of the metrics server at addr, with the same
// connection limit and timeouts as pleg-nri's. It returns its address; it is stopped when tb ends.
func startStandinMetrics(tb testing.TB, addr string) string {
	tb.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(tb.TempDir(), "metrics")
	if err := os.WriteFile(path, body, 0o644); err != nil {
		tb.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), standinMetricsEnv+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		tb.Fatalf("the stand-in metrics server: %v", err)
	}
	return strings.TrimSpace(line)
}

// serveStandinMetrics is the stand-in's process: it serves the bytes of the file body at /metrics on a
// loopback port with pleg-nri's metrics server's bounds (httpbounds),
// prints its address and serves until killed.
func serveStandinMetrics(body string) int {
	data, err := os.ReadFile(body)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(l.Addr().String())
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(data)
	})
	_ = httpbounds.Server(mux).Serve(httpbounds.Listener(l))
	return 0
}

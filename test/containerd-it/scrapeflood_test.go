package containerdit

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

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
	floodCalls  = 200
)

// BenchmarkScrapeFlood: in floodRounds rounds, floodCalls ListContainers calls through the front with
// nothing else, and as many while floodScrapers goroutines scrape /metrics in a loop and floodIdle
// connections to the metrics port are held open (opened at the phase's start, closed at its end); the
// phases alternate their order from round to round. It reports each phase's p50 and p99 and the paired
// difference of the flooded p99 minus the quiet one, with its 95 % interval (the goal: below 10 % of the
// quiet p99). The control is the quiet phase itself: the same calls, the same pleg-nri, no flood.
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
	flooded := func() (p50, p99 float64, idle, scrapes int) {
		ctx, cancel := context.WithCancel(b.Context())
		var wg sync.WaitGroup
		var mu sync.Mutex
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: floodScrapers}}
		for range floodScrapers {
			wg.Go(func() {
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.MetricsAddr+"/metrics", nil)
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
					c, err := d.DialContext(ctx, "tcp", p.MetricsAddr)
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
	var q50, q99, f50, f99 []float64
	idle, scrapes := 0, 0
	for i := range floodRounds {
		quiet := func() {
			a, b := phase()
			q50, q99 = append(q50, a), append(q99, b)
		}
		flood := func() {
			a, c, n, s := flooded()
			f50, f99 = append(f50, a), append(f99, c)
			idle, scrapes = max(idle, n), scrapes+s
		}
		if i%2 == 0 {
			quiet()
			flood()
		} else {
			flood()
			quiet()
		}
		time.Sleep(200 * time.Millisecond)
	}
	d99 := benchreport.PairedQuantileDiff(f99, q99, 0.5)
	d50 := benchreport.PairedQuantileDiff(f50, q50, 0.5)
	b.Logf("ListContainers through the front, %d rounds of %d calls a phase: quiet p50 %.2f ms, p99 %.2f ms; flooded (%d scrapers, %d idle connections held, %d scrapes in all) p50 %.2f ms, p99 %.2f ms",
		floodRounds, floodCalls, benchreport.Median(q50), benchreport.Median(q99), floodScrapers, idle, scrapes,
		benchreport.Median(f50), benchreport.Median(f99))
	b.Logf("paired, flooded minus quiet (median over rounds, 95 %% interval): p99 %s; p50 %s; p99 ratio %.2f", d99, d50,
		benchreport.Median(f99)/benchreport.Median(q99))
	b.ReportMetric(d99.Diff*1e3, "p99-added-us")
	b.ReportMetric(benchreport.Median(f99)/benchreport.Median(q99), "p99-ratio")
	b.ReportMetric(0, "ns/op")
}

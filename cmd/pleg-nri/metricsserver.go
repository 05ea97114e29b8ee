package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/containerd/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
)

// Bounds of the metrics server, so that a scrape flood or many idle connections cost the node little
// (the front, which serves the kubelet's CRI calls, shares its CPUs).
const (
	// metricsMaxConns bounds the connections served at once; more wait in the listen backlog, which
	// costs the process neither a goroutine nor a file descriptor.
	metricsMaxConns = 16
	// metricsReadHeaderTimeout and metricsReadTimeout bound reading a request's header and all of it.
	metricsReadHeaderTimeout = 5 * time.Second
	metricsReadTimeout       = 10 * time.Second
	// metricsWriteTimeout bounds a response: longer than a scrape that waits for the front's metrics
	// (front.Gatherer: another scrape's request to the front, then its own, each within 5 s).
	metricsWriteTimeout = 30 * time.Second
	// metricsIdleTimeout closes a kept-alive connection without a request for that long: longer than
	// a usual scrape interval, so that a scraper keeps its connection.
	metricsIdleTimeout = 90 * time.Second
	// metricsMaxHeaderBytes bounds a request's header (a scrape's is a few hundred bytes).
	metricsMaxHeaderBytes = 8 << 10
)

// serveMetrics serves /metrics (what g gathers), /healthz and /readyz (ready) on addr until stop is
// called, within the metrics server's bounds.
func serveMetrics(ctx context.Context, addr string, g prometheus.Gatherer, ready *readiness) (stop func(), err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if ip := l.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		log.G(ctx).WithField("address", l.Addr().String()).Warn("metrics server listens on a non-loopback address, without authentication")
	}
	return serveMetricsOn(ctx, l, g, ready), nil
}

// serveMetricsOn is serveMetrics on l.
func serveMetricsOn(ctx context.Context, l net.Listener, g prometheus.Gatherer, ready *readiness) (stop func()) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready.check(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: metricsReadHeaderTimeout, ReadTimeout: metricsReadTimeout,
		WriteTimeout: metricsWriteTimeout, IdleTimeout: metricsIdleTimeout, MaxHeaderBytes: metricsMaxHeaderBytes}
	go func() {
		if err := hs.Serve(netutil.LimitListener(l, metricsMaxConns)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.G(ctx).WithError(err).Error("metrics server failed")
		}
	}()
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}
}

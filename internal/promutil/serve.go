package promutil

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/containerd/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pleg-nri/pleg-nri/internal/httpbounds"
)

// shutdownWait is how long stopping the metrics server lets its requests finish.
const shutdownWait = 2 * time.Second

// Serve serves /metrics (what g gathers), /healthz and /readyz (ready: nil when ready, else why not) on
// addr until stop is called, within the metrics server's bounds (httpbounds). It warns that an address
// off loopback is served without authentication.
func Serve(ctx context.Context, addr string, g prometheus.Gatherer, ready func() error) (stop func(), err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if ip := l.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		log.G(ctx).WithField("address", l.Addr().String()).Warn("metrics server listens on a non-loopback address, without authentication")
	}
	return ServeOn(ctx, l, g, ready), nil
}

// ServeOn is Serve on l.
func ServeOn(ctx context.Context, l net.Listener, g prometheus.Gatherer, ready func() error) (stop func()) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	hs := httpbounds.Server(mux)
	go func() {
		if err := hs.Serve(httpbounds.Listener(l)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.G(ctx).WithError(err).Error("metrics server failed")
		}
	}()
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownWait)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}
}

// Package httpbounds holds the bounds of pleg-nri's metrics server, so that a scrape flood or many idle
// connections cost the node little (the front, which serves the kubelet's CRI calls, shares its CPUs),
// and so that a benchmark's stand-in server (test/containerd-it, BenchmarkScrapeFlood) has exactly
// the same ones.
package httpbounds

import (
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

const (
	// MaxConns bounds the connections served at once; more wait in the listen backlog, which costs
	// the process neither a goroutine nor a file descriptor.
	MaxConns = 16
	// ReadHeaderTimeout and ReadTimeout bound reading a request's header and all of it.
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 10 * time.Second
	// WriteTimeout bounds a response: longer than a scrape that waits for the front's metrics
	// (front.Gatherer: another scrape's request to the front, then its own, each within 5 s).
	WriteTimeout = 30 * time.Second
	// IdleTimeout closes a kept-alive connection without a request for that long: longer than a
	// usual scrape interval, so that a scraper keeps its connection.
	IdleTimeout = 90 * time.Second
	// MaxHeaderBytes bounds a request's header (a scrape's is a few hundred bytes).
	MaxHeaderBytes = 8 << 10
)

// Server returns an http.Server of h within the bounds; serve it on Listener(l).
func Server(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: ReadHeaderTimeout, ReadTimeout: ReadTimeout,
		WriteTimeout: WriteTimeout, IdleTimeout: IdleTimeout, MaxHeaderBytes: MaxHeaderBytes}
}

// Listener returns l serving at most MaxConns connections at once.
func Listener(l net.Listener) net.Listener { return netutil.LimitListener(l, MaxConns) }

// Command bench-report turns the results of `make bench` (the JSON the benchmarks of test/containerd-it
// write, and optionally the text output of the plugin's `go test -bench`) into docs/benchmarks.md and
// docs/exit-latency.svg.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
)

func main() {
	results := flag.String("results", "", "the benchmarks' JSON results")
	hookBench := flag.String("hook-bench", "", "text output of go test -bench BenchmarkHook ./plugin/ (optional)")
	md := flag.String("md", "docs/benchmarks.md", "markdown report to write")
	svg := flag.String("svg", "docs/exit-latency.svg", "exit latency plot to write")
	flag.Parse()
	if err := run(*results, *hookBench, *md, *svg); err != nil {
		fmt.Fprintln(os.Stderr, "bench-report:", err)
		os.Exit(1)
	}
}

func run(results, hookBench, md, svg string) error {
	if results == "" {
		return errors.New("-results is required")
	}
	if _, err := os.Stat(results); err != nil {
		return err
	}
	r, err := benchreport.Load(results)
	if err != nil {
		return err
	}
	if r.ExitLatency == nil || r.Proxy == nil || r.PodStart == nil || r.Hook == nil {
		return fmt.Errorf("%s lacks a benchmark's results (did every benchmark run?)", results)
	}
	if hookBench != "" {
		f, err := os.Open(hookBench)
		if err != nil {
			return err
		}
		r.HookBench, err = benchreport.ParseGoBench(f)
		f.Close()
		if err != nil {
			return err
		}
	}
	if err := os.WriteFile(md, []byte(benchreport.Markdown(r, filepath.Base(svg))), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(svg, []byte(benchreport.SVG(r.ExitLatency)), 0o644); err != nil {
		return err
	}
	fmt.Printf("bench-report: wrote %s and %s\n", md, svg)
	return nil
}

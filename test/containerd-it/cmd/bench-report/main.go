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
	readsMD := flag.String("reads-md", "", "write only BenchmarkStateReads' report here (make bench-reads), not -md and -svg")
	readPods := flag.Int("read-pods", 0, "with -reads-md: the pods BenchmarkStateReads listed")
	readPerPod := flag.Int("read-per-pod", 0, "with -reads-md: the containers of each pod")
	flag.Parse()
	var err error
	if *readsMD != "" {
		err = runReads(*results, *readsMD, *readPods, *readPerPod)
	} else {
		err = run(*results, *hookBench, *md, *svg)
	}
	if err != nil {
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

// runReads writes BenchmarkStateReads' report alone.
func runReads(results, md string, pods, perPod int) error {
	if results == "" || pods < 1 || perPod < 1 {
		return errors.New("-reads-md needs -results, -read-pods and -read-per-pod")
	}
	r, err := benchreport.Load(results)
	if err != nil {
		return err
	}
	if r.StateReads == nil {
		return fmt.Errorf("%s has no BenchmarkStateReads results (did it run?)", results)
	}
	if err := os.WriteFile(md, []byte(benchreport.StateReadsMarkdown(r, pods, perPod)), 0o644); err != nil {
		return err
	}
	fmt.Printf("bench-report: wrote %s\n", md)
	return nil
}

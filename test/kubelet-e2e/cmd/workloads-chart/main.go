// Command workloads-chart draws the samples of make bench-workloads (the JSON BenchmarkWorkloads of
// test/kubelet-e2e writes beside its markdown report) as an SVG: a panel per measure, a row of dots per
// setup (nodebench.WorkloadSVG).
//
//	go run ./test/kubelet-e2e/cmd/workloads-chart -in docs/workloads-standalone-v1.37.2.json -out docs/workloads-standalone-v1.37.2.svg
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/pleg-nri/pleg-nri/test/kubelet-e2e/nodebench"
)

// workloads is what BenchmarkWorkloads writes (the fields the chart uses).
type workloads struct {
	Kubelet string                    `json:"kubelet"`
	Date    string                    `json:"date"`
	Setups  []nodebench.WorkloadSetup `json:"setups"`
}

func main() {
	in := flag.String("in", "", "the JSON BenchmarkWorkloads wrote (PLEG_NRI_WORKLOADS_MD with .json)")
	out := flag.String("out", "", "the SVG to write (default: -in with .svg for .json)")
	title := flag.String("title", "", `the chart's title (default "Workloads on kubelet <kubelet>, standalone (<date>)")`)
	flag.Parse()
	if err := run(*in, *out, *title); err != nil {
		fmt.Fprintln(os.Stderr, "workloads-chart:", err)
		os.Exit(1)
	}
}

func run(in, out, title string) error {
	if in == "" {
		return errors.New("-in is required")
	}
	if out == "" {
		out = strings.TrimSuffix(in, ".json") + ".svg"
	}
	if out == in {
		return fmt.Errorf("-out %s would overwrite -in", out)
	}
	js, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var w workloads
	if err := json.Unmarshal(js, &w); err != nil {
		return fmt.Errorf("%s: not BenchmarkWorkloads' JSON: %w", in, err)
	}
	// A JSON of something else decodes to no setups: say so rather than draw an empty chart.
	if len(w.Setups) == 0 {
		return fmt.Errorf("%s: no setups (not BenchmarkWorkloads' JSON?)", in)
	}
	if title == "" {
		title = fmt.Sprintf("Workloads on kubelet %s, standalone (%s)", w.Kubelet, w.Date)
	}
	if err := os.WriteFile(out, []byte(nodebench.WorkloadSVG(title, w.Setups)), 0o644); err != nil {
		return err
	}
	fmt.Printf("workloads-chart: wrote %s\n", out)
	return nil
}

// Command bench-compare turns the runs of `make bench-compare` (hack/bench-compare.sh: make bench's
// benchmarks run in HEAD's tree and in BASE's, round after round) into docs/bench-compare-<base>.md:
// per measure, HEAD's and BASE's pooled figures, their ratio, a 95 % bootstrap interval of their
// difference, and each round's figures side by side.
//
// Its input is the script's list of runs, a tab-separated file with a header line and a line per run:
//
//	round	side	first	start	end	load_before	load_after	exit	results
//
// side is HEAD or BASE, first 1 for the run that came first in its round, start and end RFC 3339 times,
// the loads /proc/loadavg's first three fields, exit the go test's exit status, results the path of the
// results JSON the run's benchmarks wrote (PLEG_NRI_BENCH_RESULTS).
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/benchreport"
)

func main() {
	runs := flag.String("runs", "", "the runs (hack/bench-compare.sh's runs.tsv)")
	md := flag.String("md", "", "markdown report to write")
	command := flag.String("command", "make bench-compare", "the command that reproduces the comparison")
	head := flag.String("head", "", "HEAD's revision, described")
	base := flag.String("base", "", "BASE's revision, described")
	machine := flag.String("machine", "", "the machine (CPUs, kernel)")
	benchCommand := flag.String("bench-command", "", "the go test command every run ran")
	flag.Parse()
	c := &benchreport.Comparison{Command: *command, Head: *head, Base: *base, Machine: *machine, BenchCommand: *benchCommand}
	if err := run(*runs, *md, c); err != nil {
		fmt.Fprintln(os.Stderr, "bench-compare:", err)
		os.Exit(1)
	}
}

func run(runs, md string, c *benchreport.Comparison) error {
	if runs == "" || md == "" {
		return errors.New("-runs and -md are required")
	}
	f, err := os.Open(runs)
	if err != nil {
		return err
	}
	defer f.Close()
	if c.Runs, err = parseRuns(f); err != nil {
		return fmt.Errorf("%s: %w", runs, err)
	}
	if err := os.WriteFile(md, []byte(benchreport.CompareMarkdown(c)), 0o644); err != nil {
		return err
	}
	fmt.Printf("bench-compare: wrote %s\n", md)
	return nil
}

// parseRuns reads the list of runs and loads each run's results.
func parseRuns(r io.Reader) ([]benchreport.CompareRun, error) {
	sc := bufio.NewScanner(r)
	var cols []string
	var out []benchreport.CompareRun
	for line := 1; sc.Scan(); line++ {
		fields := strings.Split(sc.Text(), "\t")
		if cols == nil {
			cols = fields
			continue
		}
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		if len(fields) != len(cols) {
			return nil, fmt.Errorf("line %d: %d fields, want %d (%s)", line, len(fields), len(cols), strings.Join(cols, ", "))
		}
		v := map[string]string{}
		for i, c := range cols {
			v[c] = fields[i]
		}
		run, err := parseRun(v)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		out = append(out, run)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no runs")
	}
	return out, nil
}

func parseRun(v map[string]string) (benchreport.CompareRun, error) {
	var run benchreport.CompareRun
	var err error
	if run.Round, err = strconv.Atoi(v["round"]); err != nil || run.Round < 1 {
		return run, fmt.Errorf("round %q: want a number from 1", v["round"])
	}
	run.Side = v["side"]
	if run.Side != benchreport.SideHead && run.Side != benchreport.SideBase {
		return run, fmt.Errorf("side %q: want %s or %s", run.Side, benchreport.SideHead, benchreport.SideBase)
	}
	run.First = v["first"] == "1"
	for _, t := range []struct {
		col string
		to  *time.Time
	}{{"start", &run.Start}, {"end", &run.End}} {
		if *t.to, err = time.Parse(time.RFC3339, v[t.col]); err != nil {
			return run, fmt.Errorf("%s: %w", t.col, err)
		}
	}
	run.LoadBefore, run.LoadAfter = v["load_before"], v["load_after"]
	if run.ExitCode, err = strconv.Atoi(v["exit"]); err != nil {
		return run, fmt.Errorf("exit %q: %w", v["exit"], err)
	}
	if v["results"] == "" {
		return run, errors.New("no results path")
	}
	// A run that failed before any benchmark completed wrote nothing: its results are empty.
	if run.Results, run.Unknown, err = benchreport.LoadCompared(v["results"]); err != nil {
		return run, err
	}
	return run, nil
}

package conformance

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Outcome is what a check concluded.
type Outcome string

const (
	// Pass: the stream did what the check asks.
	Pass Outcome = "pass"
	// Fail: it did not; Result.Failure says the first way it did not.
	Fail Outcome = "fail"
	// Skip: the check could not run (Result.Failure says why): nothing is claimed either way.
	Skip Outcome = "skip"
)

// Result is one check's row of the report.
type Result struct {
	// ID is the check's short name, the one --checks selects.
	ID string `json:"id"`
	// Name is the check as a sentence: what the stream must do.
	Name    string  `json:"name"`
	Outcome Outcome `json:"outcome"`
	// Figure is what the check measured or counted (for a pass as for a fail).
	Figure string `json:"figure,omitempty"`
	// Failure is the first violation found (Fail), or the reason the check did not run (Skip).
	Failure string `json:"failure,omitempty"`
}

// Report is the outcome of one run of the suite against one endpoint.
type Report struct {
	Endpoint string        `json:"endpoint"`
	RunID    string        `json:"run_id"`
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration_ns"`
	Results  []Result      `json:"results"`
	// Cleanup is the error of the cleanup, if anything the run made could not be removed.
	Cleanup string `json:"cleanup,omitempty"`
}

// Failed reports whether any check failed or the cleanup did.
func (r *Report) Failed() bool {
	if r.Cleanup != "" {
		return true
	}
	for _, res := range r.Results {
		if res.Outcome == Fail {
			return true
		}
	}
	return false
}

// Err is the run's verdict as the command's error: nil unless a check failed (first) or the cleanup
// did.
func (r *Report) Err() error {
	if n := r.Count(Fail); n > 0 {
		return fmt.Errorf("%d of %d checks failed against %s", n, len(r.Results), r.Endpoint)
	}
	if r.Cleanup != "" {
		return fmt.Errorf("the run's pods could not all be removed (label %s=%s): %s", RunLabel, r.RunID, r.Cleanup)
	}
	return nil
}

// Count returns how many checks ended with o.
func (r *Report) Count(o Outcome) int {
	n := 0
	for _, res := range r.Results {
		if res.Outcome == o {
			n++
		}
	}
	return n
}

// Result returns the row of the check id.
func (r *Report) Result(id string) (Result, bool) {
	for _, res := range r.Results {
		if res.ID == id {
			return res, true
		}
	}
	return Result{}, false
}

// WriteTable prints one row per check: outcome, id, figure, first failure; then the totals.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "RESULT\tCHECK\tFIGURE\tFIRST FAILURE\n")
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", strings.ToUpper(string(res.Outcome)), res.ID, oneLine(res.Figure), oneLine(res.Failure))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("failed to write the report: %w", err)
	}
	_, err := fmt.Fprintf(w, "%d passed, %d failed, %d skipped against %s (run %s, %s)\n",
		r.Count(Pass), r.Count(Fail), r.Count(Skip), r.Endpoint, r.RunID, r.Duration.Round(time.Millisecond))
	if err == nil && r.Cleanup != "" {
		_, err = fmt.Fprintf(w, "cleanup failed: %s\n", r.Cleanup)
	}
	if err != nil {
		return fmt.Errorf("failed to write the report: %w", err)
	}
	return nil
}

// WriteJSON prints the report as one JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("failed to write the report as JSON: %w", err)
	}
	return nil
}

// oneLine keeps a table cell on one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

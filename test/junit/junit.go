// Package junit reads the JUnit reports ginkgo writes for upstream's e2e suites (e2e_node.test run by
// make e2e-node, e2e.test run by make e2e-cluster-conformance): the specs a run selected, each with its
// outcome, its duration and its failure in one line (Summary).
package junit

import (
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Report is the part of ginkgo's JUnit report read here.
type Report struct {
	Time   float64 `xml:"time,attr"`
	Suites []struct {
		Timestamp  string `xml:"timestamp,attr"`
		Properties []struct {
			Name  string `xml:"name,attr"`
			Value string `xml:"value,attr"`
		} `xml:"properties>property"`
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Status  string  `xml:"status,attr"`
			Time    float64 `xml:"time,attr"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// Result is one spec's outcome.
type Result struct {
	Name string `json:"name"`
	// Status is ginkgo's: passed, failed, skipped, pending, panicked, interrupted, timedout, aborted.
	Status  string  `json:"status"`
	Seconds float64 `json:"seconds"`
	Failure string  `json:"failure,omitempty"`
}

// Parse reads a JUnit report.
func Parse(path string) (Report, error) {
	var r Report
	data, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	if err := xml.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// Read reads the specs a run selected from a ginkgo JUnit report: the "[It]" entries but those the
// focus and skip left out (skipped with the bare message "skipped"; a spec that skips itself says why,
// and is kept). Suite setup and teardown nodes that failed count as failed specs of their own. They
// come sorted by name; a report without any is an error.
func Read(path string) ([]Result, error) {
	j, err := Parse(path)
	if err != nil {
		return nil, err
	}
	var out []Result
	for _, s := range j.Suites {
		for _, c := range s.Cases {
			if !strings.HasPrefix(c.Name, "[It] ") && c.Status == "passed" {
				continue
			}
			if c.Status == "skipped" && c.Skipped != nil && c.Skipped.Message == "skipped" {
				continue
			}
			r := Result{Name: SpecName(c.Name), Status: c.Status, Seconds: c.Time}
			switch {
			case c.Failure != nil:
				r.Failure = Summary(c.Failure.Message)
			case c.Error != nil:
				r.Failure = Summary(c.Error.Message)
			case c.Skipped != nil:
				r.Failure = Summary(c.Skipped.Message)
			}
			if r.Status == "" {
				r.Status = "passed"
				if r.Failure != "" {
					r.Status = "failed"
				}
			}
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, errors.New(path + ": no spec in the report")
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, nil
}

// SpecName is a JUnit test case's name without ginkgo's "[It] " and the list of labels it appends
// ("... [NodeConformance] [sig-node, NodeConformance]"), each of which the name already carries.
func SpecName(junitName string) string {
	name := strings.TrimPrefix(junitName, "[It] ")
	i := strings.LastIndex(name, " [")
	if i < 0 || !strings.HasSuffix(name, "]") {
		return name
	}
	for _, label := range strings.Split(name[i+2:len(name)-1], ", ") {
		if !strings.Contains(name[:i], "["+label+"]") && !strings.Contains(name[:i], label) {
			return name
		}
	}
	return name[:i]
}

// Summary is a failure message in one line of at most 300 characters. The first line of a gomega
// failure often says little: "Timed out after 60.000s." or "Verifying pod resources resize state. Pod: {"
// followed by a dump of the pod. So the first line comes with what the message says after it: the last
// error string gomega printed (its `s: "..."`) that holds no other where there is one, else the lines
// after the first, their whitespace collapsed.
func Summary(msg string) string {
	first, rest, _ := strings.Cut(strings.TrimSpace(msg), "\n")
	s := strings.TrimSpace(first)
	more := ""
	if m := errorString.FindAllStringSubmatch(rest, -1); len(m) > 0 {
		// The last that holds no other: an aggregate's text repeats its errors' dumps.
		for i := len(m) - 1; i >= 0 && more == ""; i-- {
			if e, err := strconv.Unquote(`"` + m[i][1] + `"`); err == nil && !strings.Contains(e, `s: "`) {
				more = e
			}
		}
	} else {
		more = rest
	}
	if more = strings.Join(strings.Fields(more), " "); more != "" && !strings.Contains(s, more) {
		s += " … " + more
	}
	if len(s) > 300 {
		s = strings.ToValidUTF8(s[:300], "") + "..."
	}
	return s
}

// errorString is a Go error's text as gomega prints it: `s: "text",` on a line of its own.
var errorString = regexp.MustCompile(`(?m)^\s*s: "((?:[^"\\]|\\.)*)",?\s*$`)

// Counts are a run's specs by outcome: pending counts as skipped, every status but passed and skipped as
// failed.
type Counts struct{ Passed, Failed, Skipped int }

// Count counts results by outcome.
func Count(results []Result) Counts {
	var c Counts
	for _, r := range results {
		switch r.Status {
		case "passed":
			c.Passed++
		case "skipped", "pending":
			c.Skipped++
		default:
			c.Failed++
		}
	}
	return c
}

// Path is the JUnit report ginkgo wrote into dir with --junit-report=junit.xml: junit.xml, or with the
// suite's path as prefix (ginkgo's name for the report of a precompiled suite).
func Path(dir string) string {
	if m, _ := filepath.Glob(filepath.Join(dir, "*junit.xml")); len(m) == 1 {
		return m[0]
	}
	return filepath.Join(dir, "junit.xml")
}

package main

import (
	"testing"
	"time"
)

func TestRender(t *testing.T) {
	at := time.Date(2026, 11, 25, 17, 53, 6, 653_912_345, time.UTC)
	for format, want := range map[string]string{
		"%3t":      "17:53:06.653",
		"%t":       "17:53:06",
		"%6t s %%": "17:53:06.653912 s %",
		"x%":       "x%",
		"%9t":      "17:53:06.653912",
	} {
		if got := render(format, at); got != want {
			t.Errorf("render(%q) = %q, want %q", format, got, want)
		}
	}
}

func TestParseArgs(t *testing.T) {
	for _, c := range []struct {
		args   []string
		delay  time.Duration
		format string
		ok     bool
	}{
		{[]string{"-d0", "%3t"}, 0, "%3t", true},
		{[]string{"-d", "250", "%t"}, 250 * time.Millisecond, "%t", true},
		{[]string{"%t"}, time.Second, "%t", true},
		{[]string{"-dx", "%t"}, 0, "", false},
		{[]string{"-d0"}, 0, "", false},
	} {
		d, f, err := parseArgs(c.args)
		if (err == nil) != c.ok || (c.ok && (d != c.delay || f != c.format)) {
			t.Errorf("parseArgs(%q) = %v, %q, %v", c.args, d, f, err)
		}
	}
}

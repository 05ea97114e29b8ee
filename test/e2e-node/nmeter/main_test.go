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

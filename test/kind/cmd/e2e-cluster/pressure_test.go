package main

import (
	"strings"
	"testing"
	"time"
)

func TestParsePressure(t *testing.T) {
	got, err := parsePressure(strings.NewReader("some avg10=53.04 avg60=24.55 avg300=6.74 total=22294380\n" +
		"full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"))
	if err != nil || got != 22294380*time.Microsecond {
		t.Fatalf("parsePressure = %v, %v; want 22.29438s", got, err)
	}
	for _, bad := range []string{"", "full avg10=0.00 total=5\n", "some avg10=1.00 total=x\n"} {
		if _, err := parsePressure(strings.NewReader(bad)); err == nil {
			t.Errorf("parsePressure(%q) gave no error", bad)
		}
	}
}

func TestPressureShare(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := pressureReading{at: t0, stall: 10 * time.Second}
	b := pressureReading{at: t0.Add(100 * time.Second), stall: 70 * time.Second}
	if got := a.share(b); got != 0.6 {
		t.Errorf("share = %v, want 0.6", got)
	}
	if got := b.share(a); got != 0 {
		t.Errorf("share backwards = %v, want 0", got)
	}
}

func TestJudgeFiring(t *testing.T) {
	fired := []firing{
		{alert: "PlegNRISendLatencyHigh", labels: "{instance=a}"},
		{alert: "PlegNRIRelistRepairs", labels: "{instance=a}"},
	}
	// A starved machine excuses the latency alert only.
	bad, notes := judgeFiring(fired, 0.8)
	if len(bad) != 1 || !strings.HasPrefix(bad[0], "PlegNRIRelistRepairs") || len(notes) != 1 || !strings.Contains(notes[0], "80%") {
		t.Errorf("starved: failures %q, notes %q", bad, notes)
	}
	// On a machine that was not starved, every alert is a failure.
	bad, notes = judgeFiring(fired, 0.2)
	if len(bad) != 2 || len(notes) != 0 {
		t.Errorf("not starved: failures %q, notes %q", bad, notes)
	}
}

package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// The kind nodes are containers sharing the machine's CPUs, so the machine's CPU pressure (PSI,
// /proc/pressure/cpu) is every node's. A latency alert that fires while the machine was starved says
// what it should: the events were slow because nothing could run. starvedPressure is the share of the
// time at least one runnable task waited for a CPU above which the machine counts as starved.
const starvedPressure = 0.5

// latencyAlerts fire on slowness that CPU starvation alone causes; every other alert of the rules is a
// failure on the healthy cluster whatever the machine's load.
var latencyAlerts = map[string]bool{"PlegNRISendLatencyHigh": true, "PlegNRIHookSlow": true}

// pressureReading is the machine's cumulative CPU stall ("some") at a moment.
type pressureReading struct {
	at    time.Time
	stall time.Duration
}

// readPressure reads /proc/pressure/cpu.
func readPressure() (pressureReading, error) {
	f, err := os.Open("/proc/pressure/cpu")
	if err != nil {
		return pressureReading{}, fmt.Errorf("the machine's CPU pressure (a kernel with PSI): %w", err)
	}
	defer f.Close()
	stall, err := parsePressure(f)
	return pressureReading{at: time.Now(), stall: stall}, err
}

// parsePressure returns the "some" line's total (microseconds) of a PSI file.
func parsePressure(r io.Reader) (time.Duration, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "some" {
			continue
		}
		for _, f := range fields[1:] {
			if v, ok := strings.CutPrefix(f, "total="); ok {
				us, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("PSI total %q: %w", v, err)
				}
				return time.Duration(us) * time.Microsecond, nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no \"some ... total=\" line in the PSI file")
}

// share is the part of the time between a and b during which a runnable task waited for a CPU.
func (a pressureReading) share(b pressureReading) float64 {
	wall := b.at.Sub(a.at)
	if wall <= 0 {
		return 0
	}
	return float64(b.stall-a.stall) / float64(wall)
}

// judgeFiring splits the alerts that fired on the healthy cluster into failures and notes: a latency
// alert on a machine starved over the window (pressure at or above starvedPressure) is a note, with the
// pressure; anything else is a failure.
func judgeFiring(fired []firing, pressure float64) (failures, notes []string) {
	for _, f := range fired {
		if latencyAlerts[f.alert] && pressure >= starvedPressure {
			notes = append(notes, fmt.Sprintf("%s fired while the machine was starved (CPU pressure %.0f%% over the window, "+
				"at or above %.0f%%): expected, the events were slow because nothing ran", f, 100*pressure, 100*starvedPressure))
			continue
		}
		failures = append(failures, f.String())
	}
	return failures, notes
}

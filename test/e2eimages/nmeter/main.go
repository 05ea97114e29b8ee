// Command nmeter stands in for busybox's nmeter applet in the node e2e suite's busybox image: Debian's
// busybox builds leave the applet out, and upstream's tests take timestamps with it
// (test/e2e_node/container_lifecycle_pod_construction.go: `date -u +%FT$(nmeter -d0 '%3t' | head -n1)Z`).
//
// It implements the part the tests use: -d MSEC (the delay between lines, default 1000) and a format
// whose %[N]t prints the time of day, UTC as `date -u` does here (the container's TZ is unset), with N
// decimal digits of the second (0-6), and %% a percent sign; other text is printed as it is. Like
// busybox's nmeter it prints lines until its output is closed.
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	delay, format, err := parseArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "nmeter:", err)
		fmt.Fprintln(os.Stderr, "usage: nmeter [-d MSEC] FORMAT")
		os.Exit(1)
	}
	for {
		if _, err := fmt.Println(render(format, time.Now().UTC())); err != nil {
			os.Exit(0) // the reader is gone (head -n1)
		}
		time.Sleep(delay)
	}
}

// parseArgs reads busybox's command line: -d MSEC or -dMSEC (as the tests write it: -d0), then FORMAT.
func parseArgs(args []string) (time.Duration, string, error) {
	delay := 1000
	for len(args) > 0 && strings.HasPrefix(args[0], "-d") {
		v := strings.TrimPrefix(args[0], "-d")
		args = args[1:]
		if v == "" {
			if len(args) == 0 {
				return 0, "", fmt.Errorf("-d needs a value")
			}
			v, args = args[0], args[1:]
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, "", fmt.Errorf("-d %q: want milliseconds", v)
		}
		delay = n
	}
	if len(args) != 1 {
		return 0, "", fmt.Errorf("want one FORMAT, got %q", args)
	}
	return time.Duration(delay) * time.Millisecond, args[0], nil
}

// render expands format at t.
func render(format string, t time.Time) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 == len(format) {
			b.WriteByte(format[i])
			continue
		}
		j := i + 1
		digits := 0
		if format[j] >= '0' && format[j] <= '9' {
			digits = int(format[j] - '0')
			j++
		}
		switch {
		case j < len(format) && format[j] == 't':
			b.WriteString(t.Format("15:04:05"))
			if digits > 6 {
				digits = 6
			}
			if digits > 0 {
				frac := fmt.Sprintf("%09d", t.Nanosecond())
				b.WriteString("." + frac[:digits])
			}
			i = j
		case j < len(format) && format[j] == '%':
			b.WriteByte('%')
			i = j
		default:
			b.WriteByte('%')
		}
	}
	return b.String()
}

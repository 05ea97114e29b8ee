//go:build race

package pleg

// raceEnabled is set when the tests run with the race detector.
const raceEnabled = true

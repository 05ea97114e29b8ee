package conformance

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRestartCommands: the stop command, then whileDown, then the start command, in that order; the
// start command runs even when the stop command or whileDown failed, and every error is returned.
func TestRestartCommands(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	step := func(s string) string { return "echo " + s + " >>" + log }
	read := func() string {
		b, _ := os.ReadFile(log)
		_ = os.Remove(log)
		return strings.Join(strings.Fields(string(b)), " ")
	}
	down := func(err error) func(context.Context) error {
		return func(context.Context) error {
			f, _ := os.OpenFile(log, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
			_, _ = f.WriteString("down\n")
			_ = f.Close()
			return err
		}
	}
	ctx := context.Background()

	if err := RestartCommands(step("stop"), step("start"))(ctx, down(nil)); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "stop down start" {
		t.Errorf("a restart ran %q, want stop down start", got)
	}

	errDown := errors.New("the change failed")
	err := RestartCommands(step("stop"), step("start"))(ctx, down(errDown))
	if !errors.Is(err, errDown) {
		t.Errorf("whileDown's error: got %v", err)
	}
	if got := read(); got != "stop down start" {
		t.Errorf("a restart whose change failed ran %q, want stop down start", got)
	}

	err = RestartCommands(step("stop")+"; echo no such unit >&2; exit 5", step("start"))(ctx, down(nil))
	if err == nil || !strings.Contains(err.Error(), "stop the runtime") || !strings.Contains(err.Error(), "no such unit") {
		t.Errorf("a failed stop: got %v, want its command's output", err)
	}
	if got := read(); got != "stop start" {
		t.Errorf("a restart whose stop failed ran %q, want stop start (and no change)", got)
	}

	err = RestartCommands(step("stop"), "exit 3")(ctx, down(nil))
	if err == nil || !strings.Contains(err.Error(), "start the runtime") {
		t.Errorf("a failed start: got %v", err)
	}
}

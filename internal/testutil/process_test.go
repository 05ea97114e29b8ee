package testutil

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

func TestAliveAndWaitGone(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Alive reads /proc")
	}
	if !Alive(os.Getpid()) {
		t.Fatal("this process is not Alive")
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if err := WaitGone(context.Background(), pid, 50*time.Millisecond); err == nil {
		t.Fatal("WaitGone returned while the process runs")
	}
	_ = cmd.Process.Kill()
	// Not reaped yet: a zombie, which is not Alive.
	if err := WaitGone(context.Background(), pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if Alive(pid) {
		t.Fatal("a reaped process is Alive")
	}
}

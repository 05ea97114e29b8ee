package plegnribin

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestBuild builds pleg-nri with a version from callers at the same time: one build, one path, the
// version it was asked for. (Not a static one: CGO_ENABLED=0 would build every package again, minutes
// on a small machine; TestStaticCommand checks that build's command.)
func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds pleg-nri")
	}
	defer Cleanup()
	if got := Built(Upgraded); got != "" {
		t.Fatalf("Built before Build: %q", got)
	}
	paths := make([]string, 3)
	var wg sync.WaitGroup
	for i := range paths {
		wg.Go(func() { paths[i] = Binary(t, Upgraded) })
	}
	wg.Wait()
	if paths[0] != paths[1] || paths[1] != paths[2] {
		t.Fatalf("three builds of one kind of binary: %q", paths)
	}
	if got := Built(Upgraded); got != paths[0] {
		t.Fatalf("Built = %q, want %q", got, paths[0])
	}
	if got := Built(Default); got != "" {
		t.Fatalf("Built(Default) = %q, not built", got)
	}
	out, err := exec.Command(paths[0], "version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "pleg-nri "+Upgraded.Version {
		t.Fatalf("%s version: %v %q, want pleg-nri %s", paths[0], err, out, Upgraded.Version)
	}
	Cleanup()
	if _, err := os.Stat(paths[0]); !os.IsNotExist(err) {
		t.Fatalf("%s after Cleanup: %v", paths[0], err)
	}
	if got := Built(Upgraded); got != "" {
		t.Fatalf("Built after Cleanup: %q", got)
	}
}

// TestStaticCommand: a static build is the image's (deploy/image/build.sh): CGO_ENABLED=0, -trimpath.
func TestStaticCommand(t *testing.T) {
	cmd := goBuildCmd("/x/pleg-nri", Deploy)
	want := []string{"go", "build", "-o", "/x/pleg-nri", "-trimpath", "-ldflags", "-X main.version=deploy-test", "./cmd/pleg-nri"}
	if !slices.Equal(cmd.Args, want) {
		t.Errorf("args %q, want %q", cmd.Args, want)
	}
	if cmd.Env[len(cmd.Env)-1] != "CGO_ENABLED=0" {
		t.Errorf("env ends with %q, want CGO_ENABLED=0", cmd.Env[len(cmd.Env)-1])
	}
	if _, err := os.Stat(filepath.Join(cmd.Dir, "cmd", "pleg-nri", "main.go")); err != nil {
		t.Errorf("the build's directory %s is not the module's root: %v", cmd.Dir, err)
	}
	plain := goBuildCmd("/x/pleg-nri", Default)
	if slices.Contains(plain.Args, "-trimpath") || slices.Contains(plain.Env, "CGO_ENABLED=0") {
		t.Errorf("the default build is static: %q", plain.Args)
	}
}

func TestName(t *testing.T) {
	for o, want := range map[Options]string{
		Default:          "pleg-nri",
		Upgraded:         "pleg-nri-v99.0.0-upgrade-test",
		Deploy:           "pleg-nri-deploy-test-static",
		{Static: true}:   "pleg-nri-static",
		{Version: "a/b"}: "pleg-nri-a_b",
	} {
		if got := o.name(); got != want {
			t.Errorf("%+v: %q, want %q", o, got, want)
		}
	}
}

package runningcore

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-nri/pleg-nri/cmd/pleg-nri/internal/config"
	"github.com/pleg-nri/pleg-nri/eventbridge/front"
	"github.com/pleg-nri/pleg-nri/internal/promutil"
	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

// version is the version of the binary the tests stand for.
const version = "v1.2.3-test"

// fakeFront answers "info" on runDir's control socket as a front of version v and pid 4242 would.
func fakeFront(t *testing.T, runDir, v string) {
	t.Helper()
	testutil.ServeAnswer(t, filepath.Join(runDir, front.ControlSocketName),
		fmt.Sprintf("{\"protocol\":%d,\"version\":%q,\"pid\":4242}\n", front.Protocol, v))
}

// TestWriteVersions (issue 56): `pleg-nri version` prints the binary's version and, when they serve the
// run directory, the running core's (the core socket's server, its version from core.json) and the
// front's, each with its pid: after an upgrade they may differ.
func TestWriteVersions(t *testing.T) {
	runDir := testutil.ShortTempDir(t, "v-")
	var b strings.Builder
	WriteVersions(&b, runDir, version)
	if want := "pleg-nri " + version + "\n"; b.String() != want {
		t.Errorf("nothing running:\n%s\nwant:\n%s", b.String(), want)
	}
	l, err := net.Listen("unix", filepath.Join(runDir, front.CoreSocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b.Reset()
	WriteVersions(&b, runDir, version)
	if want := fmt.Sprintf("pleg-nri %s\ncore: pid %d, version unknown (no core.json: an older release)\n", version, os.Getpid()); b.String() != want {
		t.Errorf("a core without core.json:\n%s\nwant:\n%s", b.String(), want)
	}
	if _, err := WriteInfo(runDir, Info{PID: os.Getpid(), Version: "v0.8", Config: config.Default()}); err != nil {
		t.Fatal(err)
	}
	fakeFront(t, runDir, "v0.7")
	b.Reset()
	WriteVersions(&b, runDir, version)
	if want := fmt.Sprintf("pleg-nri %s\ncore: pid %d, version v0.8\nfront: pid 4242, version v0.7\n", version, os.Getpid()); b.String() != want {
		t.Errorf("a core and a front:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestBuildInfo: pleg_nri_build_info is 1 for the core with this binary's version, and for the front
// with the version its control socket gives, while one answers.
func TestBuildInfo(t *testing.T) {
	runDir := testutil.ShortTempDir(t, "v-")
	reg := prometheus.NewRegistry()
	RegisterBuildInfo(reg, runDir, version)
	text := func() string {
		var b strings.Builder
		if err := promutil.Write(&b, reg); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	core := fmt.Sprintf("pleg_nri_build_info{process=\"core\",version=%q} 1\n", version)
	if got := text(); !strings.Contains(got, core) || strings.Contains(got, `process="front"`) {
		t.Errorf("no front:\n%s", got)
	}
	fakeFront(t, runDir, "v0.7")
	if got := text(); !strings.Contains(got, core) || !strings.Contains(got, "pleg_nri_build_info{process=\"front\",version=\"v0.7\"} 1\n") {
		t.Errorf("with a front:\n%s", got)
	}
}

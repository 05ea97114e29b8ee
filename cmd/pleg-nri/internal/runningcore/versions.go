package runningcore

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-nri/pleg-nri/eventbridge/front"
)

// WriteVersions writes this binary's version, then the running core's (the core socket's server, with
// the version its core.json gives) and front's (its control socket's answer), each when one serves
// runDir: `pleg-nri version`. After an upgrade the binary on disk, the core and the front may each be
// of another version (a front is kept across upgrades of the core).
func WriteVersions(w io.Writer, runDir, version string) {
	fmt.Fprintf(w, "pleg-nri %s\n", version)
	if pid, err := PeerPID(filepath.Join(runDir, front.CoreSocketName)); err == nil {
		v := "unknown (no " + InfoName + ": an older release)"
		if info, err := ReadInfo(runDir); err == nil && info.PID == pid {
			v = info.Version
		}
		fmt.Fprintf(w, "core: pid %d, version %s\n", pid, v)
	}
	if info, err := front.Query(runDir, "info"); err == nil {
		fmt.Fprintf(w, "front: pid %d, version %s\n", info.PID, info.Version)
	}
}

// buildInfo is pleg_nri_build_info: 1 for each process, labelled with its version. The core's is the
// version given; the front's is asked on its control socket at each scrape (a front is kept across
// upgrades of the core, so the two differ after one), and absent while no front answers.
type buildInfo struct {
	desc            *prometheus.Desc
	runDir, version string
}

// RegisterBuildInfo registers pleg_nri_build_info of the core (of version) and of the front of runDir
// on reg.
func RegisterBuildInfo(reg prometheus.Registerer, runDir, version string) {
	reg.MustRegister(buildInfo{runDir: runDir, version: version, desc: prometheus.NewDesc("pleg_nri_build_info",
		"1 for each pleg-nri process (core, front) that runs, with its version", []string{"process", "version"}, nil)})
}

func (b buildInfo) Describe(ch chan<- *prometheus.Desc) { ch <- b.desc }

func (b buildInfo) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(b.desc, prometheus.GaugeValue, 1, "core", b.version)
	if info, err := front.Query(b.runDir, "info"); err == nil {
		ch <- prometheus.MustNewConstMetric(b.desc, prometheus.GaugeValue, 1, "front", info.Version)
	}
}

package front

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pleg-nri/pleg-nri/internal/promutil"
)

// Gatherer gathers the front's metrics from its control socket, for the core's /metrics. No front
// answering is no error (and no metrics): the core's own metrics are served anyway.
type Gatherer struct {
	// RunDir is the front's run directory.
	RunDir string
}

func (g Gatherer) Gather() ([]*dto.MetricFamily, error) {
	c, err := dialControl(filepath.Join(g.RunDir, ControlSocketName))
	if err != nil {
		return nil, nil
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(controlTimeout))
	if _, err := c.Write([]byte(`{"op":"metrics"}` + "\n")); err != nil {
		return nil, fmt.Errorf("front metrics: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(c, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("front metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("front metrics: %w", err)
	}
	names := make([]string, 0, len(fams))
	for n := range fams {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]*dto.MetricFamily, 0, len(names))
	for _, n := range names {
		if strings.HasPrefix(n, "pleg_nri_") || strings.HasPrefix(n, "go_") || strings.HasPrefix(n, "process_") {
			out = append(out, fams[n])
		}
	}
	return out, nil
}

// SupervisorMetrics are the Supervisor's metrics, kept by the core: whether a front serves the
// kubelet's endpoint, and how often one was started in place of one that went away.
type SupervisorMetrics struct {
	up        prometheus.Gauge
	respawned prometheus.Counter
}

// NewSupervisorMetrics registers the supervisor's metrics on reg.
func NewSupervisorMetrics(reg prometheus.Registerer) *SupervisorMetrics {
	m := &SupervisorMetrics{
		up: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: promutil.Namespace, Name: "front_up",
			Help: "1 while a front serves the kubelet's CRI endpoint (the core watches it), 0 while none does: the node's runtime endpoint is down."}),
		respawned: prometheus.NewCounter(prometheus.CounterOpts{Namespace: promutil.Namespace, Name: "front_respawns_total",
			Help: "Fronts the core started in place of one that went away (killed, crashed, stopped) while the core ran."}),
	}
	reg.MustRegister(m.up, m.respawned)
	return m
}

func (m *SupervisorMetrics) FrontUp(up bool) {
	if up {
		m.up.Set(1)
	} else {
		m.up.Set(0)
	}
}

func (m *SupervisorMetrics) FrontRespawned() { m.respawned.Inc() }

var _ SupervisorHooks = (*SupervisorMetrics)(nil)

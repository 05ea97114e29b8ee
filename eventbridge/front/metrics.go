package front

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pleg-nri/pleg-nri/internal/promutil"
)

// frontMetricsSpacing is the least time between the end of one metrics request to the front and the
// start of the next: however many scrapes run, the front's control socket (in the process that serves
// the kubelet's CRI calls) gets one metrics request at a time and at most about ten a second.
const frontMetricsSpacing = 100 * time.Millisecond

// Gatherer gathers the front's metrics from its control socket, for the core's /metrics. No front
// answering is no error (and no metrics): the core's own metrics are served anyway. The front is asked
// by one scrape at a time; a scrape that waited for another's request shares its answer if that
// request started after the scrape did (so an answer is never older than its scrape), else asks.
type Gatherer struct {
	// RunDir is the front's run directory.
	RunDir string

	// mu guards the fields below and is held while the front is asked.
	mu sync.Mutex
	// data and err are the front's last answer (data nil: no front), asked at asked; ended is when
	// that answer came.
	data         []byte
	err          error
	asked, ended time.Time
}

func (g *Gatherer) Gather() ([]*dto.MetricFamily, error) {
	data, err := g.text()
	if data == nil || err != nil {
		return nil, err
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

// text is the front's metrics in the text format, asked after the call began.
func (g *Gatherer) text() ([]byte, error) {
	start := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.asked.After(start) {
		return g.data, g.err
	}
	if wait := frontMetricsSpacing - time.Since(g.ended); wait > 0 {
		time.Sleep(wait)
	}
	g.asked = time.Now()
	g.data, g.err = g.ask()
	g.ended = time.Now()
	return g.data, g.err
}

// ask asks the front for its metrics, within controlTimeout.
func (g *Gatherer) ask() ([]byte, error) {
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
	return data, nil
}

// SupervisorMetrics are the Supervisor's metrics, kept by the core: whether a front serves the
// kubelet's endpoint, and how often one was started in place of one that went away.
type SupervisorMetrics struct {
	up        prometheus.Gauge
	respawned prometheus.Counter
	hung      prometheus.Counter
}

// NewSupervisorMetrics registers the supervisor's metrics on reg.
func NewSupervisorMetrics(reg prometheus.Registerer) *SupervisorMetrics {
	m := &SupervisorMetrics{
		up: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: promutil.Namespace, Name: "front_up",
			Help: "1 while a front serves the kubelet's CRI endpoint (the core watches it), 0 while none does: the node's runtime endpoint is down."}),
		respawned: prometheus.NewCounter(prometheus.CounterOpts{Namespace: promutil.Namespace, Name: "front_respawns_total",
			Help: "Fronts the core started (or tried to) in place of one that went away (killed, crashed, stopped) while the core ran."}),
		hung: prometheus.NewCounter(prometheus.CounterOpts{Namespace: promutil.Namespace, Name: "front_hung_kills_total",
			Help: "Fronts the core killed because they had not answered on the kubelet's CRI endpoint for 10s (stopped, wedged); each is then respawned."}),
	}
	reg.MustRegister(m.up, m.respawned, m.hung)
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

func (m *SupervisorMetrics) FrontHung() { m.hung.Inc() }

// FrontGone does nothing: FrontUp(false) and FrontRespawned tell it.
func (m *SupervisorMetrics) FrontGone() {}

var _ SupervisorHooks = (*SupervisorMetrics)(nil)

package front

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
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

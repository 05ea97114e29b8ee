package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/test/kind/internal/crashbench"
)

// promServer is a real Prometheus, built from the Go module proxy, run on the host beside the cluster:
// it scrapes every node's pleg-nri and kubelet with the scrape configuration the project ships
// (deploy/prometheus/scrape-config.yaml, service discovery of the nodes through the API server) and
// evaluates the shipped alerting rules.
type promServer struct {
	url  string
	cmd  *exec.Cmd
	done chan error
	log  *os.File
}

// promScrapeInterval is the test server's scrape and rule evaluation interval.
const promScrapeInterval = 5 * time.Second

// startPrometheus writes the server's configuration (the shipped scrape configuration, pointed at this
// cluster from outside it: the kubeconfig for discovery, a service account token for the kubelets)
// and starts it; it returns once every node's pleg-nri and kubelet targets are up.
func (c *cluster) startPrometheus(ctx context.Context, dir string) (*promServer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// The kubelets' /metrics need a token that may get nodes/metrics.
	if err := c.applyText(ctx, promRBAC); err != nil {
		return nil, fmt.Errorf("prometheus' service account: %w", err)
	}
	token, err := c.k(ctx, "-n", "kube-system", "create", "token", "e2e-prometheus", "--duration=4h")
	if err != nil {
		return nil, err
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return nil, err
	}
	shipped, err := os.ReadFile(c.o.scrapeConfig)
	if err != nil {
		return nil, err
	}
	rules, err := filepath.Abs(c.o.rules)
	if err != nil {
		return nil, err
	}
	cfg, err := promConfig(shipped, c.kubeconfig, tokenFile, rules)
	if err != nil {
		return nil, err
	}
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, cfg, 0o644); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		return nil, err
	}
	p := &promServer{url: fmt.Sprintf("http://127.0.0.1:%d", port), log: log, done: make(chan error, 1)}
	p.cmd = exec.Command(c.o.prometheus, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port), "--log.level=warn")
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting prometheus: %w", err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	want := len(c.nodes) * 2
	var last string
	err = testutil.PollEvery(ctx, 3*time.Minute, 2*time.Second, fmt.Sprintf("prometheus to scrape its %d targets", want), func() (bool, error) {
		select {
		case err := <-p.done:
			p.done <- err
			return false, testutil.Stop(fmt.Errorf("prometheus exited: %v\n%s", err, p.logs()))
		default:
		}
		var ts struct {
			ActiveTargets []struct {
				Labels    map[string]string `json:"labels"`
				Health    string            `json:"health"`
				LastError string            `json:"lastError"`
			} `json:"activeTargets"`
		}
		if err := p.get(ctx, "/api/v1/targets", nil, &ts); err != nil {
			last = err.Error()
			return false, nil
		}
		up := 0
		var states []string
		for _, t := range ts.ActiveTargets {
			states = append(states, fmt.Sprintf("%s/%s %s %s", t.Labels["job"], t.Labels["node"], t.Health, t.LastError))
			if t.Health == "up" {
				up++
			}
		}
		sort.Strings(states)
		last = strings.Join(states, "; ")
		return up == want && len(ts.ActiveTargets) == want, nil
	})
	if err != nil {
		p.stop()
		return nil, fmt.Errorf("%w: %s", err, last)
	}
	fmt.Printf("e2e-cluster: prometheus at %s scrapes %d targets: %s\n", p.url, want, last)
	return p, nil
}

// promConfig is the test server's configuration: the shipped scrape configuration, each of its node
// discoveries given the cluster's kubeconfig and each of its credentials files the token (a server in
// the cluster has both from its service account), the rules, and the test's intervals.
func promConfig(shipped []byte, kubeconfig, tokenFile, rules string) ([]byte, error) {
	var cfg map[string]any
	if err := yaml.Unmarshal(shipped, &cfg); err != nil {
		return nil, fmt.Errorf("the shipped scrape configuration: %w", err)
	}
	jobs, _ := cfg["scrape_configs"].([]any)
	if len(jobs) == 0 {
		return nil, errors.New("the shipped scrape configuration has no scrape_configs")
	}
	for _, j := range jobs {
		job, _ := j.(map[string]any)
		sds, _ := job["kubernetes_sd_configs"].([]any)
		for _, sd := range sds {
			if m, ok := sd.(map[string]any); ok {
				m["kubeconfig_file"] = kubeconfig
			}
		}
		if auth, ok := job["authorization"].(map[string]any); ok {
			auth["credentials_file"] = tokenFile
		}
		if tls, ok := job["tls_config"].(map[string]any); ok {
			delete(tls, "ca_file")
			tls["insecure_skip_verify"] = true
		}
	}
	cfg["global"] = map[string]any{"scrape_interval": promScrapeInterval.String(), "evaluation_interval": promScrapeInterval.String()}
	cfg["rule_files"] = []any{rules}
	return yaml.Marshal(cfg)
}

var promRBAC = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: e2e-prometheus
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: e2e-prometheus
rules:
- apiGroups: [""]
  resources: [nodes, nodes/metrics]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: e2e-prometheus
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: e2e-prometheus
subjects:
- kind: ServiceAccount
  name: e2e-prometheus
  namespace: kube-system
`

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// get calls the server's HTTP API and decodes its data.
func (p *promServer) get(ctx context.Context, path string, q url.Values, data any) error {
	u := p.url + path
	if q != nil {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("%s: %s: %w", path, body, err)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s: %s", path, r.Error)
	}
	return json.Unmarshal(r.Data, data)
}

// series is one element of an instant vector.
type series struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
}

// value is the sample's value as Prometheus wrote it, "?" if it has none.
func (s series) value() string {
	if len(s.Value) == 2 {
		if v, ok := s.Value[1].(string); ok {
			return v
		}
	}
	return "?"
}

// query runs an instant query.
func (p *promServer) query(ctx context.Context, q string) ([]series, error) {
	var d struct {
		ResultType string   `json:"resultType"`
		Result     []series `json:"result"`
	}
	if err := p.get(ctx, "/api/v1/query", url.Values{"query": {q}}, &d); err != nil {
		return nil, fmt.Errorf("query %s: %w", q, err)
	}
	return d.Result, nil
}

// rangeSeries is one element of a range query's matrix.
type rangeSeries struct {
	Metric map[string]string `json:"metric"`
	Values [][]any           `json:"values"`
}

// queryRange runs a range query from from to to at step.
func (p *promServer) queryRange(ctx context.Context, q string, from, to time.Time, step time.Duration) ([]rangeSeries, error) {
	var d struct {
		Result []rangeSeries `json:"result"`
	}
	v := url.Values{"query": {q}, "start": {strconv.FormatInt(from.Unix(), 10)}, "end": {strconv.FormatInt(to.Unix()+1, 10)},
		"step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}}
	if err := p.get(ctx, "/api/v1/query_range", v, &d); err != nil {
		return nil, fmt.Errorf("query_range %s: %w", q, err)
	}
	return d.Result, nil
}

// alertStart is when an alert of a node first was pending and first fired (zero: never), read from
// the ALERTS series Prometheus writes at each rule evaluation, so that a figure is the server's
// own moment, not when the test's poll saw it. lastFiring is the last point of the firing series:
// Prometheus ends a resolved alert's series with a staleness marker at the first evaluation that no
// longer fired it, so it is the second before.
type alertStart struct{ pending, firing, lastFiring time.Time }

// alertStarts reads alert's moments on node between from and to: a range query at a 1 s step, whose
// first point of a state is the first second at or after the evaluation that wrote it.
func (p *promServer) alertStarts(ctx context.Context, alert, node string, from, to time.Time) (alertStart, error) {
	res, err := p.queryRange(ctx, fmt.Sprintf(`ALERTS{alertname=%q,node=%q}`, alert, node), from, to, time.Second)
	if err != nil {
		return alertStart{}, err
	}
	return firstStates(res), nil
}

// firstStates is the first point of the pending and of the firing series of a range result.
func firstStates(res []rangeSeries) alertStart {
	var a alertStart
	for _, s := range res {
		for _, v := range s.Values {
			if len(v) != 2 {
				continue
			}
			ts, ok := v[0].(float64)
			if !ok {
				continue
			}
			t := time.Unix(0, int64(ts*1e9))
			switch s.Metric["alertstate"] {
			case "pending":
				if a.pending.IsZero() || t.Before(a.pending) {
					a.pending = t
				}
			case "firing":
				if a.firing.IsZero() || t.Before(a.firing) {
					a.firing = t
				}
				if t.After(a.lastFiring) {
					a.lastFiring = t
				}
			}
		}
	}
	return a
}

// firing is an alert that fired, with its labels.
type firing struct{ alert, labels string }

func (f firing) String() string { return f.alert + " on " + f.labels }

// firingSince returns every alert that fired at some evaluation in the last d.
func (p *promServer) firingSince(ctx context.Context, d time.Duration) ([]firing, error) {
	res, err := p.query(ctx, fmt.Sprintf(`max_over_time(ALERTS{alertstate="firing"}[%ds])`, int(d.Seconds())+1))
	if err != nil {
		return nil, err
	}
	var out []firing
	for _, s := range res {
		out = append(out, firing{alert: s.Metric["alertname"], labels: labelsOf(s.Metric)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, nil
}

// latencies returns, per node, the p99 of pleg-nri's event send latency and of its status calls to
// containerd over the last d: what a latency alert was about, and containerd's share of it.
func (p *promServer) latencies(ctx context.Context, d time.Duration) []string {
	w := int(d.Seconds()) + 1
	var out []string
	for _, q := range []struct{ what, expr string }{
		{"event send latency p99", fmt.Sprintf(`histogram_quantile(0.99, sum by (instance, le) (rate(pleg_nri_event_send_latency_seconds_bucket[%ds])))`, w)},
		{"status calls to containerd p99", fmt.Sprintf(`histogram_quantile(0.99, sum by (instance, le) (rate(pleg_nri_status_call_duration_seconds_bucket[%ds])))`, w)},
	} {
		res, err := p.query(ctx, q.expr)
		if err != nil {
			out = append(out, q.what+": "+err.Error())
			continue
		}
		for _, s := range res {
			out = append(out, fmt.Sprintf("%s over %s: %s %s s", q.what, d.Round(time.Second), s.Metric["instance"], s.value()))
		}
	}
	sort.Strings(out)
	return out
}

func labelsOf(m map[string]string) string {
	var l []string
	for k, v := range m {
		if k != "__name__" && k != "alertname" && k != "alertstate" {
			l = append(l, k+"="+v)
		}
	}
	sort.Strings(l)
	return "{" + strings.Join(l, ",") + "}"
}

// explainRepairs lists the relist repairs each node made over the last d, by kind and type, and the
// times pleg-nri logged them (its journal), so that a PlegNRIRelistRepairs says which transitions the
// inputs missed and when.
func (c *cluster) explainRepairs(ctx context.Context, p *promServer, d time.Duration) []string {
	var out []string
	for _, m := range []struct{ what, metric string }{
		{"relist repairs", "pleg_nri_relist_repairs_total"},
		{"of which an input reported later", "pleg_nri_relist_repairs_late_input_total"},
	} {
		res, err := p.query(ctx, fmt.Sprintf(`sum by (instance, kind, type) (increase(%s[%ds])) > 0`, m.metric, int(d.Seconds())+1))
		if err != nil {
			out = append(out, m.what+": "+err.Error())
			continue
		}
		for _, s := range res {
			out = append(out, fmt.Sprintf("%s over %s: %s %s_%s: %s", m.what, d.Round(time.Second), s.Metric["instance"], s.Metric["kind"], s.Metric["type"], s.value()))
		}
	}
	sort.Strings(out)
	since := fmt.Sprintf("@%d", time.Now().Add(-d).Unix())
	for _, n := range c.nodes {
		log, err := c.onNode(ctx, n, "sh", "-c", "journalctl -u pleg-nri --since "+since+
			" -o short-iso-precise --no-pager | grep 'relist found changes the events missed' || true")
		if err != nil {
			out = append(out, n+": pleg-nri's journal: "+err.Error())
			continue
		}
		for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
			if l != "" {
				out = append(out, n+": "+l)
			}
		}
	}
	return out
}

// dashboardQueries are the shipped dashboard's panel queries, by panel title.
type dashboardQuery struct{ panel, expr string }

func dashboardQueries(path string) (vars []string, qs []dashboardQuery, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
				Type string `json:"type"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			vars = append(vars, v.Name)
		}
	}
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			if t.Expr != "" {
				qs = append(qs, dashboardQuery{p.Title, t.Expr})
			}
		}
	}
	return vars, qs, nil
}

// expand gives a panel query's variables the values Grafana would: each query variable the value
// given, $__rate_interval a minute.
func expand(expr string, vars map[string]string) string {
	for k, v := range vars {
		expr = strings.ReplaceAll(expr, "${"+k+"}", v)
		expr = strings.ReplaceAll(expr, "$"+k, v)
	}
	return strings.ReplaceAll(expr, "$__rate_interval", "1m")
}

// checkDashboard runs every panel query of the shipped dashboard for every node (the dashboard's node
// variable set to that node's value) and for all nodes; each must return data within
// dashboardSettle: right after the faults a node's pleg-nri was down, and a rate over [1m] has data
// only from its second scrape after it came back, as on a real dashboard. A pod runs and ends on every
// node meanwhile: the panels of events and status calls have data for a node where something happened
// in the last minute, and the restarted pleg-nri has not seen anything else happen (a run here found
// the crash-looping workload in its back-off then, and those panels empty for that node).
func (c *cluster) checkDashboard(ctx context.Context, p *promServer) (line string, err error) {
	vars, qs, err := dashboardQueries(c.o.dashboard)
	if err != nil {
		return "", err
	}
	if len(vars) != 1 {
		return "", fmt.Errorf("%s: want one query variable (the node), got %v", c.o.dashboard, vars)
	}
	if err := crashbench.CreateNamespace(ctx, c.k, dashboardNamespace); err != nil {
		return "", err
	}
	if err := c.apply(ctx, dashboardActivity, map[string]any{"Namespace": dashboardNamespace, "Nodes": c.nodes, "Busybox": busybox}); err != nil {
		return "", err
	}
	defer func() {
		if _, derr := c.k(ctx, "delete", "namespace", dashboardNamespace, "--wait=true", "--timeout=2m"); derr != nil && err == nil {
			err = derr
		}
	}()
	type check struct{ panel, value, expr string }
	var pending []check
	for _, v := range append([]string{".*"}, c.nodes...) {
		for _, q := range qs {
			pending = append(pending, check{q.panel, v, expand(q.expr, map[string]string{vars[0]: v})})
		}
	}
	start := time.Now()
	for {
		var empty []check
		for _, ch := range pending {
			res, err := p.query(ctx, ch.expr)
			if err != nil {
				return "", err
			}
			if len(res) == 0 {
				empty = append(empty, ch)
			}
		}
		pending = empty
		if len(pending) == 0 {
			break
		}
		if time.Since(start) >= dashboardSettle {
			var lines []string
			for _, ch := range pending {
				lines = append(lines, fmt.Sprintf("panel %q with %s=%q: %s", ch.panel, vars[0], ch.value, ch.expr))
			}
			return "", fmt.Errorf("dashboard queries that returned no data within %s:\n%s", dashboardSettle, strings.Join(lines, "\n"))
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(promScrapeInterval):
		}
	}
	line = fmt.Sprintf("every one of the dashboard's %d panel queries returned data from Prometheus, for each node and for all (%s after the check began)",
		len(qs), time.Since(start).Round(time.Second))
	fmt.Println("e2e-cluster:", line)
	return line, nil
}

// dashboardSettle is how long a panel may stay empty after the faults were repaired: the queries' [1m]
// window, and two scrapes for the restarted process's first rate.
const dashboardSettle = time.Minute + 2*promScrapeInterval

func (p *promServer) logs() string {
	if p.log == nil {
		return ""
	}
	data, _ := os.ReadFile(p.log.Name())
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// stop ends the server.
func (p *promServer) stop() {
	if p.cmd.Process != nil {
		testutil.StopProcess(p.cmd.Process, p.done, os.Interrupt, 30*time.Second)
	}
	p.log.Close()
}

// alertFor reads each alert's for: in the shipped rules (0 where it has none).
func alertFor(path string) (map[string]time.Duration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				For   string `json:"for"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]time.Duration{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			var d time.Duration
			if r.For != "" {
				if d, err = time.ParseDuration(r.For); err != nil {
					return nil, fmt.Errorf("%s: alert %s: for %q: %w", path, r.Alert, r.For, err)
				}
			}
			out[r.Alert] = d
		}
	}
	return out, nil
}

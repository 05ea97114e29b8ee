package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

func repoFile(t *testing.T, rel string) string {
	t.Helper()
	return filepath.Join("..", "..", "..", "..", rel)
}

// TestPromConfig: the shipped scrape configuration, pointed at a cluster from outside it, keeps its
// jobs and relabelling and gets the kubeconfig, the token and the rules.
func TestPromConfig(t *testing.T) {
	shipped, err := os.ReadFile(repoFile(t, "deploy/prometheus/scrape-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := promConfig(shipped, "/k/kubeconfig", "/k/token", "/r/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		RuleFiles     []string `json:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string           `json:"job_name"`
			SD            []map[string]any `json:"kubernetes_sd_configs"`
			Authorization map[string]any   `json:"authorization"`
			TLS           map[string]any   `json:"tls_config"`
			Relabel       []map[string]any `json:"relabel_configs"`
		} `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.RuleFiles) != 1 || cfg.RuleFiles[0] != "/r/rules.yaml" {
		t.Errorf("rule_files = %v", cfg.RuleFiles)
	}
	jobs := map[string]bool{}
	for _, j := range cfg.ScrapeConfigs {
		jobs[j.JobName] = true
		if len(j.SD) != 1 || j.SD[0]["kubeconfig_file"] != "/k/kubeconfig" || j.SD[0]["role"] != "node" {
			t.Errorf("job %s: kubernetes_sd_configs = %v", j.JobName, j.SD)
		}
		if j.Authorization != nil && j.Authorization["credentials_file"] != "/k/token" {
			t.Errorf("job %s: authorization = %v", j.JobName, j.Authorization)
		}
		if j.TLS != nil && j.TLS["ca_file"] != nil {
			t.Errorf("job %s: tls_config = %v", j.JobName, j.TLS)
		}
		node := false
		for _, r := range j.Relabel {
			node = node || r["target_label"] == "node"
		}
		if !node {
			t.Errorf("job %s does not label its targets with their node", j.JobName)
		}
	}
	if !jobs["pleg-nri"] || !jobs["kubelet"] {
		t.Errorf("jobs %v, want pleg-nri and kubelet (the rules name both)", jobs)
	}
}

// TestDashboardQueries: every panel query of the shipped dashboard selects by the node variable, and
// expands to a query without variables.
func TestDashboardQueries(t *testing.T) {
	vars, qs, err := dashboardQueries(repoFile(t, "deploy/grafana/pleg-nri-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(vars) != 1 || vars[0] != "node" {
		t.Fatalf("query variables %v, want [node]", vars)
	}
	if len(qs) < 10 {
		t.Fatalf("%d panel queries", len(qs))
	}
	for _, q := range qs {
		if !strings.Contains(q.expr, `node=~"$node"`) {
			t.Errorf("panel %q does not select by node: %s", q.panel, q.expr)
		}
		if e := expand(q.expr, map[string]string{"node": "n1"}); strings.Contains(e, "$") {
			t.Errorf("panel %q: %s still has a variable", q.panel, e)
		}
	}
}

func TestAlertFor(t *testing.T) {
	f, err := alertFor(repoFile(t, "deploy/prometheus/pleg-nri-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for alert, want := range map[string]time.Duration{"PlegNRIDown": 2 * time.Minute, "PlegNRIUpstreamDisconnected": 2 * time.Minute, "PlegNRISubscriberEvicted": 0} {
		if got, ok := f[alert]; !ok || got != want {
			t.Errorf("%s: for %v (present %v), want %v", alert, got, ok, want)
		}
	}
}

// TestPrometheusLoadsConfig: with PLEG_NRI_PROMETHEUS (make prometheus), a real Prometheus starts with
// the configuration e2e-cluster writes (the shipped scrape configuration and rules) and loads every
// shipped alert. No cluster is needed: discovery fails to reach it and is retried.
func TestPrometheusLoadsConfig(t *testing.T) {
	bin := os.Getenv("PLEG_NRI_PROMETHEUS")
	if bin == "" {
		t.Skip("PLEG_NRI_PROMETHEUS is not set (make prometheus builds it)")
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile(repoFile(t, "deploy/prometheus/scrape-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := filepath.Abs(repoFile(t, "deploy/prometheus/pleg-nri-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := promConfig(shipped, kubeconfig, token, rules)
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	p := &promServer{url: fmt.Sprintf("http://127.0.0.1:%d", port), log: log, done: make(chan error, 1)}
	p.cmd = exec.Command(bin, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port))
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	defer p.stop()
	want, err := alertFor(rules)
	if err != nil {
		t.Fatal(err)
	}
	var loaded map[string]bool
	err = testutil.Poll(context.Background(), time.Minute, "prometheus to load the rules", func() (bool, error) {
		var d struct {
			Groups []struct {
				Rules []struct {
					Name string `json:"name"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := p.get(context.Background(), "/api/v1/rules", nil, &d); err != nil {
			return false, nil
		}
		loaded = map[string]bool{}
		for _, g := range d.Groups {
			for _, r := range g.Rules {
				loaded[r.Name] = true
			}
		}
		return len(loaded) > 0, nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, p.logs())
	}
	for a := range want {
		if !loaded[a] {
			t.Errorf("prometheus did not load alert %s", a)
		}
	}
	if len(loaded) != len(want) {
		t.Errorf("prometheus loaded %d rules, the file has %d alerts", len(loaded), len(want))
	}
}

// TestFirstStates: the first point of each state of an ALERTS range result, whatever the order of
// the series and their points.
func TestFirstStates(t *testing.T) {
	var res []rangeSeries
	if err := json.Unmarshal([]byte(`[
		{"metric": {"alertname": "PlegNRIDown", "alertstate": "firing"}, "values": [[1000.5, "1"], [1001, "1"]]},
		{"metric": {"alertname": "PlegNRIDown", "alertstate": "pending"}, "values": [[881, "1"], [880, "1"], [999, "1"]]}
	]`), &res); err != nil {
		t.Fatal(err)
	}
	a := firstStates(res)
	if !a.pending.Equal(time.Unix(880, 0)) || !a.firing.Equal(time.Unix(1000, 5e8)) || !a.lastFiring.Equal(time.Unix(1001, 0)) {
		t.Errorf("firstStates = pending %v, firing %v, last firing %v; want 880 s, 1000500 ms, 1001 s", a.pending.Unix(), a.firing.UnixMilli(), a.lastFiring.Unix())
	}
	if a := firstStates(nil); !a.pending.IsZero() || !a.firing.IsZero() {
		t.Errorf("firstStates(nil) = %+v", a)
	}
}

package proxy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestDeployFilesUseRealSeries keeps the Grafana dashboard and the Prometheus alert rules in step with the
// series the proxy exports: a renamed metric must not silently leave an alert that never fires.
func TestDeployFilesUseRealSeries(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..")
	src, err := os.ReadFile(filepath.Join(root, "proxy", "metrics.go"))
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, m := range regexp.MustCompile(`Name:\s+"(fenceproxy_[a-z_]+)"`).FindAllSubmatch(src, -1) {
		exported[string(m[1])] = true
	}
	// The lock series come from the lock observer in tokens/.
	lockSrc, err := os.ReadFile(filepath.Join(root, "tokens", "observe.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`NewDesc\("(fenceproxy_[a-z_]+)"`).FindAllSubmatch(lockSrc, -1) {
		exported[string(m[1])] = true
	}
	if !exported["fenceproxy_lock_expirations_total"] {
		t.Error("tokens/observe.go: no fenceproxy_lock_expirations_total")
	}
	if len(exported) < 10 {
		t.Fatalf("found only %d series in metrics.go", len(exported))
	}
	used := regexp.MustCompile(`fenceproxy_[a-z_]+`)
	check := func(name, text string) {
		for _, s := range used.FindAllString(text, -1) {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(s, "_bucket"), "_sum"), "_count")
			if !exported[base] {
				t.Errorf("%s uses %s, which the proxy does not export", name, s)
			}
		}
	}
	alerts, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "fenceproxy-alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(alerts, &rules); err != nil || len(rules.Groups) == 0 {
		t.Fatalf("alert rules: %v", err)
	}
	stale := false
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			check("alert "+r.Alert, r.Expr)
			stale = stale || strings.Contains(r.Expr, "fenceproxy_stale_rejections_total")
		}
	}
	if !stale {
		t.Error("no alert on stale rejections")
	}
	dash, err := os.ReadFile(filepath.Join(root, "deploy", "grafana", "fenceproxy-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(dash, &d); err != nil || len(d.Panels) == 0 {
		t.Fatalf("dashboard: %v", err)
	}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			check("panel "+p.Title, tg.Expr)
		}
	}
}

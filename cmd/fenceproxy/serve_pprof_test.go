package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenceproxy/fenceproxy/config"
)

// Profiles are served only when metrics.pprof asks for them; a default configuration answers 404.
func TestPprofOffByDefault(t *testing.T) {
	cfg, err := config.Parse("c.yaml", []byte("upstream:\n  address: a:1\nmetrics:\n  listen: 127.0.0.1:9187\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pprof bool
		want  int
	}{{cfg.Metrics.Pprof, http.StatusNotFound}, {true, http.StatusOK}} {
		srv := httptest.NewServer(metricsMux(prometheus.NewRegistry(), c.pprof))
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine"} {
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Errorf("pprof %v: GET %s = %d, want %d", c.pprof, path, resp.StatusCode, c.want)
			}
		}
		resp, err := http.Get(srv.URL + "/healthz")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("pprof %v: /healthz: %v %v", c.pprof, resp, err)
		} else {
			resp.Body.Close()
		}
		srv.Close()
	}
	if _, err := config.Parse("c.yaml", []byte("upstream:\n  address: a:1\nmetrics:\n  pprof: true\n")); err == nil {
		t.Error("metrics.pprof without metrics.listen accepted")
	}
}

package config

import (
	"strings"
	"testing"
	"time"
)

func TestCatalogSection(t *testing.T) {
	base := "upstream:\n  address: 127.0.0.1:5432\n"
	cfg, err := Parse("c.yaml", []byte(base))
	if err != nil || cfg.Catalog != nil {
		t.Fatalf("no catalog section: %v %+v", err, cfg.Catalog)
	}
	cfg, err = Parse("c.yaml", []byte(base+"catalog: {}\n"))
	if err != nil || cfg.Catalog == nil || cfg.Catalog.Refresh != DefaultCatalogRefresh {
		t.Fatalf("empty catalog section: %v %+v", err, cfg.Catalog)
	}
	cfg, err = Parse("c.yaml", []byte(base+"catalog:\n  dsn: host=db\n  user: fence_catalog\n  database: app\n  password_file: /run/pw\n  refresh: 30s\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Catalog{DSN: "host=db", User: "fence_catalog", Database: "app", PasswordFile: "/run/pw", Refresh: 30 * time.Second}
	if *cfg.Catalog != want {
		t.Fatalf("catalog: %+v, want %+v", *cfg.Catalog, want)
	}
	for yaml, msg := range map[string]string{
		"catalog:\n  refresh: 10ms\n": `c.yaml:4: catalog.refresh: must be at least 1s`,
		"catalog:\n  usr: x\n":        `c.yaml:4: catalog.usr: unknown key; did you mean "user"?`,
	} {
		if _, err := Parse("c.yaml", []byte(base+yaml)); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: error %v, want %q", yaml, err, msg)
		}
	}
}

package catalog_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/catalog"
	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

// BenchmarkSnapshot measures one catalog read and derivation (what every refresh costs) on a schema of 1000
// tables (100 of them protected, each with 4 partitions), 200 views and 400 foreign keys.
func BenchmarkSnapshot(b *testing.B) {
	var ddl strings.Builder
	var tables []rewrite.Table
	for i := 0; i < 100; i++ {
		fmt.Fprintf(&ddl, "CREATE TABLE %%[1]s.p%d (id int, k int, fence_token bigint, ref int, PRIMARY KEY (id, k)) PARTITION BY LIST (k);", i)
		for j := 0; j < 4; j++ {
			fmt.Fprintf(&ddl, "CREATE TABLE %%[1]s.p%d_%d PARTITION OF %%[1]s.p%d FOR VALUES IN (%d);", i, j, i, j)
		}
		fmt.Fprintf(&ddl, "CREATE VIEW %%[1]s.pv%d AS SELECT id, k, fence_token FROM %%[1]s.p%d;", i, i)
	}
	for i := 0; i < 500; i++ {
		fmt.Fprintf(&ddl, "CREATE TABLE %%[1]s.t%d (id int PRIMARY KEY, ref int);", i)
		if i < 100 {
			fmt.Fprintf(&ddl, "CREATE VIEW %%[1]s.tv%d AS SELECT * FROM %%[1]s.t%d;", i, i)
		}
		if i > 0 && i < 400 {
			fmt.Fprintf(&ddl, "ALTER TABLE %%[1]s.t%d ADD FOREIGN KEY (ref) REFERENCES %%[1]s.t%d ON DELETE CASCADE;", i, i-1)
		}
	}
	e := newSchema(b, ddl.String())
	for i := 0; i < 100; i++ {
		tables = append(tables, rewrite.Table{Schema: e.schema, Name: fmt.Sprintf("p%d", i), TokenColumn: "fence_token"})
	}
	cc, err := catalog.ConnConfig(&config.Config{
		Upstream: config.Upstream{Address: pg.Addr(), ConnectTimeout: 10 * time.Second},
		Catalog:  &config.Catalog{User: pgtest.SuperUser, Database: pgtest.TestDB},
	})
	if err != nil {
		b.Fatal(err)
	}
	src := catalog.NewSource(cc, nil)
	defer src.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		snap, err := src.Snapshot(ctxT(b), tables)
		if err != nil {
			b.Fatal(err)
		}
		if len(snap.Protected) != 500 {
			b.Fatalf("protected %d, want 500 (400 partitions, 100 views)", len(snap.Protected))
		}
	}
}

// Package compat runs real ORM programs through fenceproxy against a real PostgreSQL: the compatibility matrix
// of the README. Each ORM has one program (compat/<orm>/) that runs every cell (create, bulk create, partial
// and full-row update, upsert, delete, a model without the token column, savepoints, the token from connection
// options and from SET LOCAL, a stale token, a missing token, migrations) and checks the rows over a direct
// connection; this test gives each program its own protected table and a proxy, and requires every cell to
// pass. The ORMs are installed by scripts/setup --all, which scripts/test runs (Debian packages, npm, Go
// modules); a missing one fails.
package compat

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) { os.Exit(pgtest.RunMain(m, pgtest.Options{}, &pg)) }

// orm is one program of the matrix.
type orm struct {
	name  string   // cell prefix and table prefix
	cmd   []string // the program
	dir   string   // where it runs, under compat/ ("" is compat/ itself)
	cells []string // every cell the program must report ok
}

var common = []string{"create", "bulk_create", "partial_update", "full_row_update", "upsert", "delete",
	"legacy_model", "savepoint", "missing_token", "set_local", "stale"}

var orms = []orm{
	{name: "activerecord", cmd: []string{"ruby", "activerecord/matrix.rb"},
		cells: append(append([]string{}, common...), "migration_additive", "migration_token_column_refused")},
	{name: "django", cmd: []string{"/usr/bin/python3", "django/matrix.py"},
		cells: append(append([]string{}, common...), "migration_additive", "migration_token_column_refused")},
	{name: "sqlalchemy", cmd: []string{"/usr/bin/python3", "sqlalchemy/matrix.py"}, cells: common},
	{name: "sequelize", cmd: []string{"node", "node/matrix.js", "sequelize"}, cells: common},
	{name: "knex", cmd: []string{"node", "node/matrix.js", "knex"}, cells: common},
	{name: "typeorm", cmd: []string{"node", "node/matrix.js", "typeorm"}, cells: common},
	// Hibernate as Debian packages it (3.6, libhibernate3-java), run from source by java's launcher.
	{name: "hibernate", cmd: []string{"java", "-cp", hibernateClassPath, "hibernate/Matrix.java"}, cells: common},
	// GORM is a module of its own (compat/gorm/go.mod), so that it is not a dependency of fenceproxy.
	{name: "gorm", cmd: []string{"go", "run", "."}, dir: "gorm", cells: common},
}

// hibernateClassPath is Hibernate 3.6 and what it needs, from Debian's packages (/usr/share/java).
var hibernateClassPath = "/usr/share/java/" + strings.Join([]string{"hibernate-core", "dom4j", "commons-collections3", "antlr",
	"geronimo-jta-1.2-spec", "geronimo-jpa_2.0_spec", "javassist", "slf4j-api", "slf4j-nop",
	"hibernate-commons-annotations", "postgresql"}, ".jar:/usr/share/java/") + ".jar"

// dir is compat/, where the programs live.
func dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

func TestORMMatrix(t *testing.T) {
	pgtest.Require(t, pg)
	var tables strings.Builder
	for _, o := range orms {
		fmt.Fprintf(&tables, "  - name: public.%s_accounts\n    token_column: fence_token\n", o.name)
	}
	p := proxytest.Start(t, pg.Addr(), proxytest.Options{YAML: "tables:\n" + tables.String()})
	_, proxyPort, _ := strings.Cut(p.Addr, ":")
	for _, o := range orms {
		t.Run(o.name, func(t *testing.T) {
			table := o.name + "_accounts"
			if err := pg.Exec(fmt.Sprintf(`DROP TABLE IF EXISTS %[1]s;
				CREATE TABLE %[1]s (id bigint PRIMARY KEY, balance numeric NOT NULL, note text, fence_token bigint)`, table)); err != nil {
				t.Fatal(err)
			}
			if _, err := exec.LookPath(o.cmd[0]); err != nil {
				t.Fatalf("%s is not installed (scripts/setup --all installs it): %v", o.cmd[0], err)
			}
			cmd := exec.Command(o.cmd[0], o.cmd[1:]...)
			cmd.Dir = filepath.Join(dir(), o.dir)
			cmd.Env = append(os.Environ(),
				"PGHOST=127.0.0.1", "PGPORT="+proxyPort, "PGUSER="+pgtest.SuperUser, "PGDATABASE="+pgtest.TestDB,
				"PGOPTIONS=", "DIRECT_PORT="+strconv.Itoa(pg.Port()), "TABLE="+table, "OLD_TOKEN=100", "NEW_TOKEN=200")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			start := time.Now()
			err := cmd.Run()
			t.Logf("%s ran in %v:\n%s", o.name, time.Since(start).Round(time.Millisecond), out.String())
			ok := map[string]bool{}
			sc := bufio.NewScanner(bytes.NewReader(out.Bytes()))
			for sc.Scan() {
				if cell, found := strings.CutPrefix(sc.Text(), "ok "); found {
					ok[cell] = true
				}
			}
			for _, c := range o.cells {
				if !ok[c] {
					t.Errorf("%s: cell %s did not pass", o.name, c)
				}
			}
			if err != nil {
				t.Errorf("%s exited with %v", o.name, err)
			}
		})
	}
}

// pgx's own test suite through fenceproxy as a transaction pooler (pool.mode: transaction): every test passes but
// those compat/pgxsuite/transaction-exceptions.txt lists (each with why), and every listed one fails. It runs the
// suite through the proxy only (-direct=false; `go run ./compat/pgxsuite` without flags also runs it directly and
// in session mode), and only pgx's packages whose tests use the database.
func TestPgxSuiteTransactionMode(t *testing.T) {
	start := time.Now()
	cmd := exec.Command("go", "run", "./pgxsuite", "-mode", "transaction", "-direct=false", "-src", "..")
	cmd.Dir = dir()
	out, err := cmd.CombinedOutput()
	t.Logf("go run ./compat/pgxsuite -mode transaction -direct=false (%v):\n%s", time.Since(start).Round(time.Second), out)
	if err != nil {
		t.Fatalf("pgx's suite through the transaction pooler: %v", err)
	}
}

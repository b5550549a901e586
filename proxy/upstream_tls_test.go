package proxy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

func TestUpstreamTLS(t *testing.T) {
	pgtest.Require(t, pg)
	sslPG := pgtest.MustStart(t, pgtest.Options{SSL: true, ExtraHBA: []string{"hostnossl all all 127.0.0.1/32 reject"}})
	ctx := ctxT(t)

	// verify-full with the cluster's CA: works, and the server sees an encrypted connection.
	p := proxytest.Start(t, sslPG.Addr(), proxytest.Options{YAML: fmt.Sprintf("  tls:\n    mode: verify-full\n    ca_file: %s\n", sslPG.CAFile)})
	c := connect(t, p.DSN(pgtest.ScramUser, pgtest.ScramPassword, pgtest.TestDB))
	var ssl bool
	if err := c.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
		t.Fatalf("upstream leg not encrypted: %v %v", ssl, err)
	}

	// require: encrypts without verifying.
	p2 := proxytest.Start(t, sslPG.Addr(), proxytest.Options{YAML: "  tls:\n    mode: require\n"})
	connect(t, p2.DSN(pgtest.SuperUser, "", pgtest.TestDB))

	// verify-full against a CA that did not sign the server's certificate: a clear error, no session.
	otherCA, _, _ := writeTestCerts(t, t.TempDir())
	p3 := proxytest.Start(t, sslPG.Addr(), proxytest.Options{YAML: fmt.Sprintf("  tls:\n    mode: verify-full\n    ca_file: %s\n", otherCA)})
	_, err := pgx.Connect(ctx, p3.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "08006" || !strings.Contains(pgErr.Detail, "certificate") {
		t.Fatalf("verification failure: want 08006 naming the certificate, got %v (detail %q)", err, detailOf(err))
	}

	// An upstream without TLS when the proxy requires it.
	p4 := proxytest.Start(t, pg.Addr(), proxytest.Options{YAML: "  tls:\n    mode: require\n"})
	_, err = pgx.Connect(ctx, p4.DSN(pgtest.SuperUser, "", pgtest.TestDB))
	if !errors.As(err, &pgErr) || pgErr.Code != "08006" || !strings.Contains(pgErr.Detail, "does not accept TLS") {
		t.Fatalf("plain upstream with mode require: got %v (detail %q)", err, detailOf(err))
	}
}

func detailOf(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Detail
	}
	return ""
}

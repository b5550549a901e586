package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/etcdtest"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
	"github.com/fenceproxy/fenceproxy/schema"
	"github.com/fenceproxy/fenceproxy/tokens"
)

// The admin console's SHOW LOCKS (admin_locks.go) over real lock stores: the PostgreSQL store (in a database of
// its own in the shared cluster, with `fenceproxy install`'s lock marks) and etcd.

// adminPoolYAML is a transaction-pooling proxy whose admin console the role admin may use.
const adminPoolYAML = "pool:\n  mode: transaction\n  size: 1\n  admin_users: [admin]\nauth:\n  type: trust\n"

// showLocksDB is a fresh database of the shared cluster with the fenceproxy schema installed, dropped when the
// test ends; it returns its DSN.
func showLocksDB(t *testing.T) string {
	t.Helper()
	dsn := pg.DSN(pgtest.SuperUser, "", freshDB(t))
	if err := schema.Install(ctxT(t), connect(t, dsn), schema.Config{}); err != nil {
		t.Fatalf("install: %v", err)
	}
	return dsn
}

// SHOW LOCKS lists a lock held in each store with its holder and token (the PostgreSQL one with the mark its
// database holds for it), counts a waiter, and no longer lists a lock once it is released; a store that stops
// answering makes it a clean ERROR within the listing's timeout, after which the console still answers.
func TestPooledAdminShowLocks(t *testing.T) {
	dsn := showLocksDB(t)
	e := etcdtest.Start(t)
	ctx := ctxT(t)
	pgStore, err := tokens.NewPGStore(ctx, dsn, tokens.PGStoreOptions{Holder: "show-locks-holder"})
	if err != nil {
		t.Fatal(err)
	}
	etcdStore := tokens.NewEtcdStore(e.Client(), tokens.DefaultPrefix)
	listing := &tokens.Listing{
		Stores: []tokens.Store{pgStore, etcdStore},
		Marks: func(ctx context.Context) (map[string]int64, error) {
			c, err := pgx.Connect(ctx, dsn)
			if err != nil {
				return nil, err
			}
			defer c.Close(context.Background())
			return schema.Marks(ctx, c)
		},
		Timeout: 2 * time.Second,
	}
	p := startProxy(t, proxytest.Options{YAML: adminPoolYAML, Locks: listing})
	adm := connect(t, proxytest.DSN(p.Addr, "admin", "", "fenceproxy")+"&default_query_exec_mode=simple_protocol")

	pgName, etcdName := fxName(t, "pg"), fxName(t, "etcd")
	pgHeld, err := pgStore.Acquire(ctx, pgName, tokens.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer pgHeld.Release(context.Background())
	if _, err := schema.RaiseMarks(ctx, connect(t, dsn), map[string]int64{pgName: pgHeld.Token()}); err != nil {
		t.Fatal(err)
	}
	etcdHeld, err := etcdStore.Acquire(ctx, etcdName, tokens.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer etcdHeld.Release(context.Background())
	waitCtx, stopWaiting := context.WithCancel(ctx)
	var waiter sync.WaitGroup
	waiter.Add(1)
	go func() {
		defer waiter.Done()
		if l, err := etcdStore.Acquire(waitCtx, etcdName, tokens.AcquireOptions{TTL: time.Minute}); err == nil {
			l.Release(context.Background())
		}
	}()
	defer func() { stopWaiting(); waiter.Wait() }()

	var rows []map[string]any
	eventually(t, 10*time.Second, "the etcd waiter in SHOW LOCKS", func() bool {
		rows = adminRows(t, adm, "SHOW LOCKS")
		r := rowWhere(rows, "lock", etcdName)
		return r != nil && r["waiters"] == "1"
	})
	t.Logf("SHOW LOCKS: %v", rows)
	pr, er := rowWhere(rows, "lock", pgName), rowWhere(rows, "lock", etcdName)
	pgToken := strconv.FormatInt(pgHeld.Token(), 10)
	if pr == nil || pr["store"] != "postgres" || pr["holder"] != "show-locks-holder" || pr["token"] != pgToken ||
		pr["waiters"] != "0" || !strings.HasSuffix(fmt.Sprint(pr["lease_left"]), "s") || pr["mark"] != pgToken {
		t.Fatalf("SHOW LOCKS row of %s: %v, want the PostgreSQL holder, token and mark %s", pgName, pr, pgToken)
	}
	lease := fmt.Sprintf("%x", int64(etcdHeld.(*tokens.Lock).Lease()))
	if er["store"] != "etcd" || er["holder"] != lease || er["token"] != strconv.FormatInt(etcdHeld.Token(), 10) || er["mark"] != "" {
		t.Fatalf("SHOW LOCKS row of %s: %v, want etcd lease %s, token %d and no mark", etcdName, er, lease, etcdHeld.Token())
	}

	if err := pgHeld.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := rowWhere(adminRows(t, adm, "SHOW LOCKS"), "lock", pgName); r != nil {
		t.Fatalf("SHOW LOCKS after the release still lists %s: %v", pgName, r)
	}
	stopWaiting()
	waiter.Wait()
	if err := etcdHeld.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := rowWhere(adminRows(t, adm, "SHOW LOCKS"), "lock", etcdName); r != nil {
		t.Fatalf("SHOW LOCKS after the release still lists %s: %v", etcdName, r)
	}

	// etcd stops answering: an ERROR naming the store within the listing's timeout, not a hang (the client
	// gives up long after the timeout), and the console goes on.
	e.Stop()
	qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, err = adm.Exec(qctx, "SHOW LOCKS")
	wantPgErr(t, err, "55000", "fenceproxy admin console: SHOW LOCKS failed: read the locks: etcd lock store")
	if len(adminRows(t, adm, "SHOW POOLS")) != 0 {
		t.Fatal("SHOW POOLS after the failed SHOW LOCKS: want no pool")
	}
}

// Without a lock store SHOW LOCKS answers its columns, no row and a NOTICE saying why; the unknown-command
// hint names it; a role not in pool.admin_users cannot reach it, and an ordinary session's SHOW LOCKS is the
// server's (a setting that does not exist), never the proxy's list.
func TestPooledAdminShowLocksWithoutStore(t *testing.T) {
	p := startProxy(t, proxytest.Options{YAML: adminPoolYAML})
	ctx := ctxT(t)
	cc, err := pgx.ParseConfig(proxytest.DSN(p.Addr, "admin", "", "fenceproxy") + "&default_query_exec_mode=simple_protocol")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var notices []string
	cc.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		notices = append(notices, n.Severity+" "+n.Message)
		mu.Unlock()
	}
	adm, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close(context.Background())
	rows, err := adm.Query(ctx, "SHOW LOCKS")
	if err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, f := range rows.FieldDescriptions() {
		cols = append(cols, f.Name)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToMap)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 0 || strings.Join(cols, ",") != "lock,store,holder,token,lease_left,held_for,waiters,mark" ||
		len(notices) != 1 || notices[0] != "NOTICE fenceproxy admin console: no lock store is configured" {
		t.Fatalf("SHOW LOCKS without a store: columns %v, rows %v, notices %q", cols, got, notices)
	}

	_, err = adm.Exec(ctx, "SHOW NONSENSE")
	if pe := wantPgErr(t, err, "0A000", "fenceproxy admin console: unknown command"); !strings.Contains(pe.Hint, "SHOW LOCKS") {
		t.Fatalf("the unknown command's hint does not name SHOW LOCKS: %q", pe.Hint)
	}

	_, err = pgx.Connect(ctx, proxytest.DSN(p.Addr, pgtest.SuperUser, "", "fenceproxy"))
	wantPgErr(t, err, "42501", `user "postgres" may not use the admin console`)
	c := connect(t, proxytest.DSN(p.Addr, pgtest.SuperUser, "", pgtest.TestDB)+"&default_query_exec_mode=simple_protocol")
	_, err = c.Exec(ctx, "SHOW LOCKS")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42704" {
		t.Fatalf("SHOW LOCKS on an ordinary session: %v, want the server's 42704", err)
	}
}

// freshDB makes an empty database on the test cluster, dropped when the test ends, and returns its name.
func freshDB(t *testing.T) string {
	t.Helper()
	pgtest.Require(t, pg)
	db := fxName(t, "db")
	if err := pg.Exec("CREATE DATABASE " + db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)") })
	return db
}

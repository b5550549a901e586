package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The no-leak proof of transaction pooling: 200 clients on a pool of 10 server connections, each with tokens of
// its own (client c uses c*1000+1, c*1000+2, ...), run a random mix of SET, SET LOCAL, RESET, DISCARD ALL,
// set_config (literal and bound), startup options, ROLLBACK, SAVEPOINT and ROLLBACK TO, multi-statement Query,
// the extended protocol and named statements. Each client knows which token PostgreSQL would give its write (its own model of the
// session) and checks the write landed with exactly that one (RETURNING), or was refused 55F02 when it has none.
// A trigger records, for every committed write, the backend and current_setting of the token: no write carries
// another client's token. A client that never sets a token is refused 55F02 every time, and most server
// connections served several clients.
//
// FENCEPROXY_POOL_LOAD_TX sets the number of transactions (default 20000).
func TestPooledNoLeakUnderLoad(t *testing.T) {
	total := 20000
	if v := os.Getenv("FENCEPROXY_POOL_LOAD_TX"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		total = n
	}
	const clients, poolSize = 200, 10
	f := newPooledFenced(t, poolSize, "  max_client_wait: 60s\n")
	logTable := f.name + "_log"
	fxExec(t, f.d, "CREATE TABLE "+logTable+" (client int, pid int, tok text)")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP TABLE IF EXISTS "+logTable) })
	fxExec(t, f.d, fmt.Sprintf(`CREATE FUNCTION %[1]s_f() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO %[1]s VALUES (NEW.id, pg_backend_pid(), current_setting('fence.token', true)); RETURN NEW; END $$`, logTable))
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP FUNCTION IF EXISTS "+logTable+"_f() CASCADE") })
	fxExec(t, f.d, fmt.Sprintf("CREATE TRIGGER %[1]s_t AFTER UPDATE ON %[2]s FOR EACH ROW EXECUTE FUNCTION %[1]s_f()", logTable, f.label))
	fxExec(t, f.d, fmt.Sprintf("INSERT INTO %s (id) SELECT g FROM generate_series(0, %d) g", f.label, clients))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, clients+1)
	var written sync.Map
	for c := 1; c <= clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			n, err := loadClient(ctx, f, c, total/clients)
			written.Store(c, n)
			if err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("client %d: %w", c, err)
				cancel()
			}
		}(c)
	}
	// The canary: never a token, refused every time.
	canaryDone := make(chan struct{})
	go func() {
		defer close(canaryDone)
		cc, err := pgx.Connect(ctx, f.dsn()+"&default_query_exec_mode=exec")
		if err != nil {
			errs <- err
			return
		}
		defer cc.Close(context.Background())
		for i := 0; ctx.Err() == nil; i++ {
			_, err := cc.Exec(ctx, "UPDATE "+f.label+" SET balance = balance + 1 WHERE id = 0")
			var pe *pgconn.PgError
			if ctx.Err() != nil {
				return
			}
			if !errors.As(err, &pe) || pe.Code != "55F02" {
				errs <- fmt.Errorf("canary write %d: want 55F02, got %v", i, err)
				cancel()
				return
			}
		}
	}()
	wg.Wait()
	cancel()
	<-canaryDone
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	d := direct(t)
	var foreign, rows, pids, shared int
	if err := d.QueryRow(ctxT(t), fmt.Sprintf(`SELECT
		count(*) FILTER (WHERE tok IS NULL OR tok !~ '^[0-9]+$' OR tok::bigint / 1000 <> client),
		count(*),
		(SELECT count(DISTINCT pid) FROM %[1]s),
		(SELECT count(*) FROM (SELECT pid FROM %[1]s GROUP BY pid HAVING count(DISTINCT client) > 1) s)
		FROM %[1]s`, logTable)).Scan(&foreign, &rows, &pids, &shared); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d committed writes over %d server connections, %d of them shared by several clients", rows, pids, shared)
	if foreign != 0 {
		t.Fatalf("%d committed writes carried a token that is not their client's", foreign)
	}
	if rows == 0 || pids == 0 || shared*2 <= pids {
		t.Fatalf("want most server connections to serve several clients: %d of %d did", shared, pids)
	}
}

// loadClient runs one client's share of the load test and returns how many writes it committed.
func loadClient(ctx context.Context, f *fenced, c, ops int) (int, error) {
	rng := rand.New(rand.NewSource(int64(c)))
	next := int64(c * 1000)
	newTok := func() int64 { next++; return next }
	var startup *int64
	dsn := f.dsn() + "&default_query_exec_mode=exec"
	if c%4 == 0 { // startup options
		v := newTok()
		startup = &v
		dsn += fmt.Sprintf("&options=-c%%20fence.token%%3D%d", v)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	sess := startup // the session's token as PostgreSQL would hold it
	simple := pgx.QueryExecModeSimpleProtocol
	upd := fmt.Sprintf("UPDATE %s SET balance = balance + 1 WHERE id = %d RETURNING fence_token", f.label, c)
	written := 0
	var high int64 // the newest token the client's row holds
	// write runs the update and checks it used want: refused 55F02 without a token, 55F01 under the row's
	// newer token, else written with want. ok: it wrote (the caller commits, or not).
	write := func(q func(string) pgx.Row, want *int64) (ok bool, err error) {
		var got int64
		err = q(upd).Scan(&got)
		var pe *pgconn.PgError
		switch {
		case want == nil:
			if !errors.As(err, &pe) || pe.Code != "55F02" {
				return false, fmt.Errorf("write without a token: want 55F02, got %v (token %d)", err, got)
			}
			return false, nil
		case *want < high:
			if !errors.As(err, &pe) || pe.Code != "55F01" {
				return false, fmt.Errorf("write with token %d under %d: want 55F01, got %v (token %d)", *want, high, err, got)
			}
			return false, nil
		case err != nil:
			return false, fmt.Errorf("write with token %d: %w", *want, err)
		case got != *want:
			return false, fmt.Errorf("write landed with token %d, want %d", got, *want)
		}
		return true, nil
	}
	onConn := func(mode pgx.QueryExecMode) func(string) pgx.Row {
		return func(s string) pgx.Row { return conn.QueryRow(ctx, s, mode) }
	}
	onTx := func(tx pgx.Tx, mode pgx.QueryExecMode) func(string) pgx.Row {
		return func(s string) pgx.Row { return tx.QueryRow(ctx, s, mode) }
	}
	// commit ends a transaction whose write went as ok says.
	commit := func(tx pgx.Tx, ok bool, tok int64) error {
		if !ok {
			return tx.Rollback(ctx)
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		high, written = tok, written+1
		return nil
	}
	// autocommit notes a write outside a transaction block.
	autocommit := func(ok bool, err error) error {
		if ok {
			high, written = *sess, written+1
		}
		return err
	}
	protocols := []pgx.QueryExecMode{simple, pgx.QueryExecModeExec}
	for i := 0; i < ops; i++ {
		mode := protocols[rng.Intn(2)]
		exec := func(s string, args ...any) error {
			_, err := conn.Exec(ctx, s, append([]any{mode}, args...)...)
			return err
		}
		var err error
		switch op := rng.Intn(12); op {
		case 0: // SET, then a write
			v := newTok()
			if err = exec(fmt.Sprintf("SET fence.token = %d", v)); err == nil {
				sess = &v
				err = autocommit(write(onConn(mode), sess))
			}
		case 1: // SET LOCAL in a transaction
			v := newTok()
			tx, e := conn.Begin(ctx)
			if err = e; err != nil {
				break
			}
			if _, err = tx.Exec(ctx, fmt.Sprintf("SET LOCAL fence.token = %d", v), mode); err == nil {
				var ok bool
				if ok, err = write(onTx(tx, mode), &v); err == nil {
					err = commit(tx, ok, v)
				}
			}
		case 2: // RESET
			if err = exec("RESET fence.token"); err == nil {
				sess = startup
				err = autocommit(write(onConn(mode), sess))
			}
		case 3: // DISCARD ALL
			if err = exec("DISCARD ALL"); err == nil {
				sess = startup
				err = autocommit(write(onConn(mode), sess))
			}
		case 4: // set_config literal, session level
			v := newTok()
			if err = exec(fmt.Sprintf("SELECT set_config('fence.token', '%d', false)", v)); err == nil {
				sess = &v
				err = autocommit(write(onConn(mode), sess))
			}
		case 5: // set_config bound, session level (extended protocol)
			v := newTok()
			if _, err = conn.Exec(ctx, "SELECT set_config($1, $2, $3)", "fence.token", strconv.FormatInt(v, 10), false); err == nil {
				sess = &v
				err = autocommit(write(onConn(mode), sess))
			}
		case 6: // a SET undone by ROLLBACK
			v := newTok()
			tx, e := conn.Begin(ctx)
			if err = e; err != nil {
				break
			}
			if _, err = tx.Exec(ctx, fmt.Sprintf("SET fence.token = %d", v), mode); err == nil {
				if _, err = write(onTx(tx, mode), &v); err == nil {
					err = tx.Rollback(ctx)
				}
			}
		case 7: // SAVEPOINT, SET, ROLLBACK TO, then a write with the session's token
			v := newTok()
			tx, e := conn.Begin(ctx)
			if err = e; err != nil {
				break
			}
			for _, s := range []string{"SAVEPOINT s", fmt.Sprintf("SET fence.token = %d", v), "ROLLBACK TO SAVEPOINT s"} {
				if _, err = tx.Exec(ctx, s, mode); err != nil {
					break
				}
			}
			if err == nil {
				var ok bool
				if ok, err = write(onTx(tx, mode), sess); err == nil {
					tok := int64(0)
					if sess != nil {
						tok = *sess
					}
					err = commit(tx, ok, tok)
				}
			}
		case 8: // a multi-statement Query: SET and the write in one implicit transaction
			v := newTok()
			var res []*pgconn.Result
			if res, err = conn.PgConn().Exec(ctx, fmt.Sprintf("SET fence.token = %d; %s", v, upd)).ReadAll(); err == nil {
				sess = &v
				if len(res) != 2 || len(res[1].Rows) != 1 || string(res[1].Rows[0][0]) != strconv.FormatInt(v, 10) {
					err = fmt.Errorf("multi-statement write: want one row with token %d, got %v", v, res)
				}
				high, written = v, written+1
			}
		case 9: // a write through a named statement (pgx's statement cache: Parse once, Bind on any connection)
			err = autocommit(write(onConn(pgx.QueryExecModeCacheStatement), sess))
		default: // a plain write with the session's token
			err = autocommit(write(onConn(mode), sess))
		}
		if err != nil {
			return written, fmt.Errorf("op %d: %w", i, err)
		}
	}
	return written, nil
}

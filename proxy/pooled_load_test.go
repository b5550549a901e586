package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The no-leak proof of transaction pooling: 200 clients on a pool of 10 server connections, each with tokens of
// its own (client c uses c*10^6+1, c*10^6+2, ...), run a random mix of SET, SET LOCAL, RESET, RESET ALL, DISCARD
// ALL, set_config (literal and bound, session and transaction-local), startup options (PGOPTIONS), ROLLBACK,
// SAVEPOINT and ROLLBACK TO, multi-statement Query, pipelines of several batches (one failing in the middle) and
// named statements, in the simple and the extended protocol. Each client knows which token PostgreSQL would give
// its write (its own model of the session) and checks the write landed with exactly that one (RETURNING), was
// refused 55F02 when it has none, or 55F01 under a newer one of its own. A trigger records, for every committed
// write, the backend and current_setting of the token: no write carries another client's token. A client that
// never sets a token is refused 55F02 every time, and most server connections served several clients.
//
// The clients run until the pool has lent its server connections for FENCEPROXY_POOL_LOAD_TX transactions
// (default 10^5; each lend is one transaction on a shared server connection).
func TestPooledNoLeakUnderLoad(t *testing.T) {
	total := 100000
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
	var enough atomic.Bool // the pool lent total transactions: the clients stop
	for c := 1; c <= clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			err := loadClient(ctx, f, c, &enough)
			if err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("client %d: %w", c, err)
				cancel()
			}
		}(c)
	}
	// The canary: never a token, refused every time, in both protocols.
	canaryDone := make(chan struct{})
	var refused atomic.Int64
	go func() {
		defer close(canaryDone)
		cc, err := pgx.Connect(ctx, f.dsn())
		if err != nil {
			errs <- err
			return
		}
		defer cc.Close(context.Background())
		for i := 0; ctx.Err() == nil; i++ {
			canaryWrite := "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = 0"
			if i%2 == 0 {
				_, err = cc.Exec(ctx, canaryWrite)
			} else {
				_, err = execExtended(ctx, cc, canaryWrite)
			}
			var pe *pgconn.PgError
			if ctx.Err() != nil {
				return
			}
			if !errors.As(err, &pe) || pe.Code != "55F02" {
				errs <- fmt.Errorf("canary write %d: want 55F02, got %v", i, err)
				cancel()
				return
			}
			refused.Add(1)
		}
	}()
	lends := func() float64 { return fxCounter(t, f.p.Registry, "fenceproxy_pool_lends_total", nil) }
	clientsDone := make(chan struct{})
	go func() { wg.Wait(); close(clientsDone) }()
	for poll := time.NewTicker(100 * time.Millisecond); !enough.Load(); {
		select {
		case <-clientsDone: // failed
			enough.Store(true)
		case <-poll.C:
			enough.Store(lends() >= float64(total))
		}
	}
	<-clientsDone
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
		count(*) FILTER (WHERE tok IS NULL OR tok !~ '^[0-9]+$' OR tok::bigint / 1000000 <> client),
		count(*),
		(SELECT count(DISTINCT pid) FROM %[1]s),
		(SELECT count(*) FROM (SELECT pid FROM %[1]s GROUP BY pid HAVING count(DISTINCT client) > 1) s)
		FROM %[1]s`, logTable)).Scan(&foreign, &rows, &pids, &shared); err != nil {
		t.Fatal(err)
	}
	lent := lends()
	t.Logf("%v transactions lent; %d committed writes over %d server connections, %d of them shared by several clients; the canary refused %d times",
		lent, rows, pids, shared, refused.Load())
	if refused.Load() < 2 {
		t.Fatalf("the canary wrote %d times (refused), want it to run in both protocols throughout", refused.Load())
	}
	if lent < float64(total) {
		t.Fatalf("the pool lent %v transactions, want at least %d", lent, total)
	}
	if foreign != 0 {
		t.Fatalf("%d committed writes carried a token that is not their client's", foreign)
	}
	if rows == 0 || pids == 0 || shared*2 <= pids {
		t.Fatalf("want most server connections to serve several clients: %d of %d did", shared, pids)
	}
}

// loadClient runs one client of the load test until enough.
func loadClient(ctx context.Context, f *fenced, c int, enough *atomic.Bool) error {
	rng := rand.New(rand.NewSource(int64(c)))
	next := int64(c) * 1000000
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
		return err
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
	for i := 0; !enough.Load(); i++ {
		mode := protocols[rng.Intn(2)]
		// exec runs s in the protocol of mode (pgx's Exec of a text without arguments is always simple).
		exec := func(s string) error {
			if mode == simple {
				_, err := conn.Exec(ctx, s, mode)
				return err
			}
			_, err := execExtended(ctx, conn, s)
			return err
		}
		var err error
		// Half the operations are plain writes: those that may change session state cost the server a look at
		// the connection at their end (the probe, most of the server's work here), and 10^5 transactions must
		// stay affordable in CI.
		switch op := rng.Intn(24); op {
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
		case 2: // RESET, RESET ALL
			if err = exec([]string{"RESET fence.token", "RESET ALL"}[rng.Intn(2)]); err == nil {
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
		case 10: // transaction-local set_config: literal in a multi-statement Query, or bound in a transaction
			v := newTok()
			if mode == simple {
				var res []*pgconn.Result
				if res, err = conn.PgConn().Exec(ctx, fmt.Sprintf("SELECT set_config('fence.token', '%d', true); %s", v, upd)).ReadAll(); err == nil {
					if len(res) != 2 || len(res[1].Rows) != 1 || string(res[1].Rows[0][0]) != strconv.FormatInt(v, 10) {
						err = fmt.Errorf("set_config local and write: want one row with token %d, got %v", v, res)
					}
					high, written = v, written+1
				}
				break
			}
			tx, e := conn.Begin(ctx)
			if err = e; err != nil {
				break
			}
			if _, err = tx.Exec(ctx, "SELECT set_config($1, $2, $3)", "fence.token", strconv.FormatInt(v, 10), true); err == nil {
				var ok bool
				if ok, err = write(onTx(tx, mode), &v); err == nil {
					err = commit(tx, ok, v)
				}
			}
		case 11: // a pipeline of four batches: set_config (bound), a write, a set_config undone by an error, a write
			err = pipelineOp(ctx, conn.PgConn(), upd, newTok(), newTok(), func(v int64) {
				sess, high, written = &v, v, written+2
			})
		default: // a plain write with the session's token
			err = autocommit(write(onConn(mode), sess))
		}
		if err != nil {
			return fmt.Errorf("op %d: %w", i, err)
		}
	}
	return nil
}

// pipelineOp sends four batches in one write, each with its Sync (four transactions): set_config of the token to
// v (bound, session level), the write, set_config to w followed by an error (the batch fails, so the session
// keeps v), the write again. Both writes must land with v; done(v) then records them.
func pipelineOp(ctx context.Context, pc *pgconn.PgConn, upd string, v, w int64, done func(int64)) error {
	sv, sw := []byte(strconv.FormatInt(v, 10)), []byte(strconv.FormatInt(w, 10))
	setConfig := "SELECT set_config('fence.token', $1, false)"
	p := pc.StartPipeline(ctx)
	p.SendQueryParams(setConfig, [][]byte{sv}, nil, nil, nil)
	p.SendPipelineSync()
	p.SendQueryParams(upd, nil, nil, nil, nil)
	p.SendPipelineSync()
	p.SendQueryParams(setConfig, [][]byte{sw}, nil, nil, nil)
	p.SendQueryParams("SELECT 1/0", nil, nil, nil, nil)
	p.SendPipelineSync()
	p.SendQueryParams(upd, nil, nil, nil, nil)
	p.SendPipelineSync()
	if err := p.Flush(); err != nil {
		return err
	}
	var got []string
	for syncs := 0; syncs < 4; {
		r, err := p.GetResults()
		if err != nil {
			var pe *pgconn.PgError
			if !errors.As(err, &pe) {
				return fmt.Errorf("pipeline: %w (so far %v)", err, got)
			}
			got = append(got, pe.Code)
			continue
		}
		switch r := r.(type) {
		case nil:
			return fmt.Errorf("pipeline: no more results (so far %v)", got)
		case *pgconn.PipelineSync:
			got = append(got, "sync")
			syncs++
		case *pgconn.ResultReader:
			res := r.Read()
			var pe *pgconn.PgError
			switch {
			case errors.As(res.Err, &pe):
				got = append(got, pe.Code)
			case res.Err != nil:
				return fmt.Errorf("pipeline: %w (so far %v)", res.Err, got)
			case len(res.Rows) == 1:
				got = append(got, string(res.Rows[0][0]))
			default:
				got = append(got, fmt.Sprint(len(res.Rows), " rows"))
			}
		}
	}
	if err := p.Close(); err != nil {
		return err
	}
	want := fmt.Sprintf("[%[1]d sync %[1]d sync %[2]d 22012 sync %[1]d sync]", v, w)
	if fmt.Sprint(got) != want {
		return fmt.Errorf("pipeline answers %v, want %s", got, want)
	}
	done(v)
	return nil
}

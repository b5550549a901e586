package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// 500 clients x 20 protocol-level named statements on a pool of 10 server connections. Every client prepares
// its statements s0..s19 in one pipeline, under the same names as every other client but over other texts (of
// 400, each shared by 25 clients, so that a statement often runs where it was never prepared), then executes all
// of them in a random order, twice, in transactions of random kinds: one statement alone, BEGIN with several, a
// pipeline of several batches. Each text's answer says which text ran (its number plus the client's argument),
// and one statement of each client is the fenced write, which returns the client's own token:
// no 26000 and no other error, every answer the client's own statement's, no client pinned, and statements
// moved between server connections (most clients ran them on several backends).
func TestPooledManyClientsNamedStatements(t *testing.T) {
	const clients, stmts, texts, poolSize = 500, 20, 400, 10
	f := newPooledFenced(t, poolSize, "  max_client_wait: 120s\n")
	fxExec(t, f.d, fmt.Sprintf("INSERT INTO %s (id) SELECT g FROM generate_series(1, %d) g", f.label, clients))
	// text k < texts answers $1 + k; text number texts is the fenced write, which answers the token it wrote with.
	text := func(k int) string {
		if k == texts {
			return "UPDATE " + f.label + " SET balance = balance + 1 WHERE id = $1::int RETURNING fence_token, pg_backend_pid()"
		}
		return fmt.Sprintf("SELECT $1::int + %d, pg_backend_pid()", k)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	var mu sync.Mutex
	movers := 0 // clients whose statements ran on more than one backend
	for c := 1; c <= clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			pids, err := namedStatementsClient(ctx, f, c, stmts, texts, text)
			if err != nil {
				errs <- fmt.Errorf("client %d: %w", c, err)
				cancel()
				return
			}
			if len(pids) > 1 {
				mu.Lock()
				movers++
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 10 {
			t.Error(err)
		}
	}
	if t.Failed() {
		return
	}
	if pins := fxCounter(t, f.p.Registry, "fenceproxy_pool_pins_total", nil); pins != 0 {
		t.Fatalf("%v clients were pinned", pins)
	}
	if opened := fxCounter(t, f.p.Registry, "fenceproxy_pool_server_connections_opened_total", nil); opened > poolSize {
		t.Fatalf("the pool of %d opened %v server connections", poolSize, opened)
	}
	t.Logf("%d of %d clients ran their statements on several backends; %v lends", movers, clients,
		fxCounter(t, f.p.Registry, "fenceproxy_pool_lends_total", nil))
	if movers*2 <= clients {
		t.Fatalf("want most clients' statements to run on several server connections: %d of %d did", movers, clients)
	}
}

// namedStatementsClient is one client of TestPooledManyClientsNamedStatements; it returns the backends its
// statements ran on.
func namedStatementsClient(ctx context.Context, f *fenced, c, stmts, texts int, text func(int) string) (map[string]bool, error) {
	token := strconv.Itoa(100000 + c)
	pc, err := pgconn.Connect(ctx, f.dsn()+"&options=-c%20fence.token%3D"+token)
	if err != nil {
		return nil, err
	}
	defer pc.Close(context.Background())
	rng := rand.New(rand.NewSource(int64(c)))
	textOf := func(i int) int { // the text of the client's statement i
		if i == c%stmts {
			return texts
		}
		return (c*stmts + i) % texts
	}
	name := func(i int) string { return "s" + strconv.Itoa(i) }

	p := pc.StartPipeline(ctx)
	for i := 0; i < stmts; i++ {
		p.SendPrepare(name(i), text(textOf(i)), nil)
	}
	p.SendPipelineSync()
	if err := p.Flush(); err != nil {
		return nil, err
	}
	for i := 0; i < stmts; i++ {
		if _, err := p.GetResults(); err != nil {
			return nil, fmt.Errorf("prepare %s: %w", name(i), err)
		}
	}
	if _, err := p.GetResults(); err != nil {
		return nil, err
	}
	if err := p.Close(); err != nil {
		return nil, err
	}

	pids := map[string]bool{}
	// check verifies the answer of the client's statement i run with argument x.
	check := func(i, x int, res *pgconn.Result) error {
		if res.Err != nil {
			var pe *pgconn.PgError
			if errors.As(res.Err, &pe) && pe.Code == "26000" {
				return fmt.Errorf("%s: 26000: %w", name(i), res.Err)
			}
			return fmt.Errorf("%s: %w", name(i), res.Err)
		}
		if len(res.Rows) != 1 || len(res.Rows[0]) != 2 {
			return fmt.Errorf("%s: %d rows", name(i), len(res.Rows))
		}
		got, want := string(res.Rows[0][0]), strconv.Itoa(x+textOf(i))
		if textOf(i) == texts {
			want = token
		}
		if got != want {
			return fmt.Errorf("%s (text %d) with %d answered %q, want %q", name(i), textOf(i), x, got, want)
		}
		pids[string(res.Rows[0][1])] = true
		return nil
	}
	arg := func(i int) (int, [][]byte) {
		x := rng.Intn(1000)
		if textOf(i) == texts {
			x = c // the client's own row
		}
		return x, [][]byte{[]byte(strconv.Itoa(x))}
	}
	for pass := 0; pass < 2; pass++ {
		order := rng.Perm(stmts)
		for len(order) > 0 {
			n := min(1+rng.Intn(4), len(order))
			group := order[:n]
			order = order[n:]
			switch rng.Intn(3) {
			case 0: // each statement alone: one transaction each
				for _, i := range group {
					x, args := arg(i)
					if err := check(i, x, pc.ExecPrepared(ctx, name(i), args, nil, nil).Read()); err != nil {
						return nil, err
					}
				}
			case 1: // BEGIN, the statements, COMMIT: one transaction
				if _, err := pc.Exec(ctx, "BEGIN").ReadAll(); err != nil {
					return nil, err
				}
				for _, i := range group {
					x, args := arg(i)
					if err := check(i, x, pc.ExecPrepared(ctx, name(i), args, nil, nil).Read()); err != nil {
						return nil, err
					}
				}
				if _, err := pc.Exec(ctx, "COMMIT").ReadAll(); err != nil {
					return nil, err
				}
			default: // a pipeline, a Sync after every other statement: several transactions in one write
				p := pc.StartPipeline(ctx)
				xs := make([]int, len(group))
				syncs := 0
				for j, i := range group {
					x, args := arg(i)
					xs[j] = x
					p.SendQueryPrepared(name(i), args, nil, nil)
					if j%2 == 1 {
						p.SendPipelineSync()
						syncs++
					}
				}
				if len(group)%2 == 1 {
					p.SendPipelineSync()
					syncs++
				}
				if err := p.Flush(); err != nil {
					return nil, err
				}
				j := 0 // the statement whose result comes next
				for k := 0; k < len(group)+syncs; k++ {
					r, err := p.GetResults()
					if err != nil {
						return nil, err
					}
					if rr, ok := r.(*pgconn.ResultReader); ok {
						if err := check(group[j], xs[j], rr.Read()); err != nil {
							return nil, err
						}
						j++
					}
				}
				if j != len(group) {
					return nil, fmt.Errorf("pipeline: %d results for %d statements", j, len(group))
				}
				if err := p.Close(); err != nil {
					return nil, err
				}
			}
		}
	}
	return pids, nil
}

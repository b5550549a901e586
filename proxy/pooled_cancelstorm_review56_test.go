package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// A storm of cancels across clients on a pool of one and of two: each client runs short statements and cancels
// about half of them at a random moment, waiting for its cancel connection's end (as libpq does) and for its
// statement's answer before it sends the next. A statement may end in 57014 only if its own client cancelled it:
// a cancel that reached another client's statement on a shared connection, or absorbCancel's own 57014 relayed,
// shows as a 57014 where no cancel was sent; a failed absorb, as a session ended. Half the clients use the
// extended protocol with one and the same statement text, so that their named statements share one Parse body
// (sharedParses) while they are prepared, closed and prepared again on the connections: run it under -race too.
func TestPooledCancelStormAcrossClients(t *testing.T) {
	for _, size := range []int{1, 2} {
		t.Run(fmt.Sprintf("pool of %d", size), func(t *testing.T) {
			pgtest.Require(t, pg)
			d := direct(t)
			name := fxName(t, "tp")
			fxCreateTable(t, d, "public."+name)
			yaml := fxTables("public."+name) + fmt.Sprintf("pool:\n  mode: transaction\n  size: %d\n  max_client_wait: 30s\nauth:\n  type: trust\n", size)
			f := &fenced{p: proxytest.Start(t, pg.Addr(), proxytest.Options{YAML: yaml}), d: d, name: name, label: "public." + name}
			const clients, rounds = 6, 25
			var wg sync.WaitGroup
			var hit atomic.Int64 // statements their own cancel stopped
			errs := make(chan error, clients)
			for i := range clients {
				mode := "&default_query_exec_mode=simple_protocol"
				if i%2 == 1 {
					mode = "&default_query_exec_mode=cache_statement"
				}
				c := pooledConn(t, f, mode)
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					for r := range rounds {
						want := i*1000 + r
						sent := make(chan error, 1)
						cancelling := rand.IntN(2) == 0
						if cancelling {
							delay := time.Duration(rand.IntN(8000)) * time.Microsecond
							go func() {
								time.Sleep(delay) // a random moment of the statement's life, or after it
								sent <- sendCancelRequest(f.p.Addr, c.PgConn().PID(), c.PgConn().SecretKey())
							}()
						}
						var v int
						err := c.QueryRow(ctx, "SELECT $1::int FROM pg_catalog.pg_sleep($2::float8)", want, float64(rand.IntN(6))/1000).Scan(&v)
						if cancelling {
							if cerr := <-sent; cerr != nil {
								errs <- fmt.Errorf("client %d round %d: its CancelRequest: %w", i, r, cerr)
								return
							}
						}
						var pgErr *pgconn.PgError
						switch {
						case err == nil:
							if v != want {
								errs <- fmt.Errorf("client %d round %d: got %d, want %d", i, r, v, want)
								return
							}
						case errors.As(err, &pgErr) && pgErr.Code == "57014":
							if !cancelling {
								errs <- fmt.Errorf("client %d round %d: 57014 though it sent no cancel: %v", i, r, err)
								return
							}
							hit.Add(1)
						default:
							errs <- fmt.Errorf("client %d round %d: %v", i, r, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			t.Logf("%d of %d statements were stopped by their own cancel", hit.Load(), clients*rounds)
			// A cancel not seen taken costs its connection (settle): PostgreSQL's close of the cancel's
			// connection must be read as taken, or every cancelled lend would discard one.
			if logs := f.p.Logs.String(); strings.Contains(logs, "not seen taken") {
				t.Errorf("a cancel to a live server was not seen taken:\n%s", logs)
			}
		})
	}
}

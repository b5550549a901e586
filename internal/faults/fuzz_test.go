package faults

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// FuzzClientMessages starts one in-process proxy in front of the shared cluster (a protected table configured,
// so the rewriting paths run), and for each input: resets the table, logs in as an ordinary role, writes the
// input as client messages, half-closes, and reads until the proxy closes the connection. The proxy must close
// it within a deadline (no hang), still serve a fresh session, and end every session it started (no goroutine
// or backend leak). Then the fencing invariant is checked from a direct connection: every row the input wrote
// was written under a valid token, carries it, and no token was lowered (fuzzCheckInvariant). The seed corpus in
// testdata/fuzz/FuzzClientMessages runs as a unit test; it includes writes that must be refused (stale, no
// token, TRUNCATE, a token reset between Parse and Execute) and writes that must land: each seed's number of
// committed row writes is in fuzzSeedWrites, so a proxy that refuses every write fails the seeds too.
func FuzzClientMessages(f *testing.F) {
	pgtest.Require(f, pg)
	// The seed corpus names this table. It is protected, and triggers record every row write the database
	// commits (fuzzWrites), so that each input can be judged by the fencing invariant, not only by liveness.
	table := "fuzz_tbl"
	if err := pg.Exec(fuzzTableSQL(table, pgtest.MD5User)); err != nil {
		f.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), time.Hour)
	f.Cleanup(dcancel)
	d, err := pgx.Connect(dctx, pg.SuperDSN())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { d.Close(context.Background()) })
	p := proxytest.Start(f, pg.Addr(), proxytest.Options{YAML: fmt.Sprintf(
		"tables:\n  - name: %s\n    token_column: fence_token\nlimits:\n  max_message_size: 1048576\n  startup_timeout: 5s\n", table)})
	app := "faults-fuzz"
	dsn := proxytest.DSN(p.Addr, pgtest.MD5User, pgtest.MD5Password, pgtest.TestDB) +
		"&application_name=" + app + "&options=-c%20statement_timeout%3D5s"
	seeds := fuzzSeeds(f)
	baseGoroutines := runtime.NumGoroutine()
	f.Cleanup(func() { noLeakedBackends(f, pg, app, 20*time.Second) })

	f.Fuzz(func(t *testing.T, input []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		fuzzReset(t, ctx, d, table)
		pc, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("startup before the input: %v", err)
		}
		hc, err := pc.Hijack()
		if err != nil {
			t.Fatal(err)
		}
		conn := hc.Conn
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(15 * time.Second))
		// The input, then a Terminate: a client that says goodbye, so that what the input asked for runs to
		// its end (a client that just vanishes has its running query cancelled) and the invariant below judges
		// it. An input that ends inside a message swallows the Terminate, which is fine for a fuzzer.
		conn.Write(append(input[:len(input):len(input)], 'X', 0, 0, 0, 4)) // the proxy may close before taking it all
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		buf := make([]byte, 64<<10)
		for {
			if _, err := conn.Read(buf); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatalf("the proxy kept the connection open 15s after the client's input ended")
				}
				break
			}
		}
		conn.Close()

		fresh, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("the proxy no longer serves after input %q: %v", input, err)
		}
		if _, err := fresh.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
			t.Fatalf("fresh session after input %q: %v", input, err)
		}
		fresh.Close(ctx)
		waitFor(t, 10*time.Second, "the proxy's sessions to end", func() bool { return p.Server.ActiveSessions() == 0 })
		waitFor(t, 10*time.Second, "goroutines to settle", func() bool { return runtime.NumGoroutine() <= baseGoroutines+20 })
		// Every transaction of the input has ended with its session (a kept upstream connection is reset and
		// renamed first): what the triggers recorded is all the input committed.
		noLeakedBackends(t, pg, app, 10*time.Second)
		writes := fuzzCheckInvariant(t, ctx, d, table, input)
		if seed, ok := seeds[string(input)]; ok && writes != fuzzSeedWrites[seed] {
			t.Fatalf("seed %s committed %d row writes, want %d", seed, writes, fuzzSeedWrites[seed])
		}
	})
}

// fuzzSeedWrites is how many row writes each seed of testdata/fuzz/FuzzClientMessages commits (by name).
var fuzzSeedWrites = map[string]int{
	"extended_fenced_update":       1, // token 7 over row 1's 5, Parse/Bind/Execute
	"query_fenced_delete":          1, // token 9 deletes row 2 (no token)
	"query_fenced_update":          1, // token 7 over row 1's 5
	"query_insert_and_update":      2, // token 6: a new row 3, row 2 (no token)
	"extended_batch_fenced_writes": 3, // token 6: rows 1 and 2, a new row 4, two Parse/Bind/Execute before one Sync
	// Refused or not a write: stale tokens, no token, TRUNCATE, COPY, the token reset between Parse and
	// Execute; and what is no valid message at all.
	"absurd_length": 0, "bind_garbage": 0, "copy_data_out_of_place": 0, "copy_from_stdin": 0, "describe_close_flush": 0,
	"execute_missing_portal": 0, "extended_stale_update": 0, "extended_update_then_reset": 0, "function_call_garbage": 0,
	"length_below_four": 0, "length_over_limit": 0, "negative_length": 0, "nul_in_query": 0, "parse_bad_param_count": 0,
	"parse_bind_execute": 0, "parse_unterminated_name": 0, "parse_unterminated_query": 0, "password_after_startup": 0,
	"pipeline_with_error": 0, "query_delete_stale": 0, "query_empty": 0, "query_no_nul": 0, "query_select": 0,
	"query_stale_update": 0, "query_truncate": 0, "query_two_statements": 0, "query_update_no_token": 0,
	"set_token_invalid": 0, "startup_again": 0, "sync_flood": 0, "terminate_then_more": 0, "truncated_header": 0,
	"unknown_type": 0,
}

// fuzzSeeds reads the seed corpus (files of the form "go test fuzz v1" then one []byte("...") line) and returns
// each seed's name by its input; it fails unless fuzzSeedWrites names exactly those seeds.
func fuzzSeeds(f *testing.F) map[string]string {
	f.Helper()
	dir := filepath.Join("testdata", "fuzz", "FuzzClientMessages")
	files, err := os.ReadDir(dir)
	if err != nil {
		f.Fatal(err)
	}
	seeds := map[string]string{}
	for _, fi := range files {
		text, err := os.ReadFile(filepath.Join(dir, fi.Name()))
		if err != nil {
			f.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(text)), "\n")
		lit, ok := strings.CutPrefix(strings.TrimSpace(lines[len(lines)-1]), "[]byte(")
		lit, ok2 := strings.CutSuffix(lit, ")")
		input, err := strconv.Unquote(lit)
		if len(lines) != 2 || lines[0] != "go test fuzz v1" || !ok || !ok2 || err != nil {
			f.Fatalf("seed %s: want \"go test fuzz v1\" and one []byte(\"...\") line (%v)", fi.Name(), err)
		}
		if _, ok := fuzzSeedWrites[fi.Name()]; !ok {
			f.Fatalf("seed %s: its number of row writes is not in fuzzSeedWrites", fi.Name())
		}
		seeds[input] = fi.Name()
	}
	for name := range fuzzSeedWrites {
		if !slices.Contains(slices.Collect(maps.Values(seeds)), name) {
			f.Fatalf("fuzzSeedWrites names %s, which is no seed in %s", name, dir)
		}
	}
	return seeds
}

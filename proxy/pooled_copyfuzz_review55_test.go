package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// The wire oracle (TestPooledWireOracle) generates no COPY: the count of answers still to come across COPYs
// (copyRuns, execsDone, copyAmbiguous) is fuzzed here. Each sequence mixes, pipelined in one write, Queries and
// Executes of COPY FROM STDIN, COPY TO STDOUT and texts that hold the word copy, good and bad rows, COPY ends
// where no COPY runs, Syncs and Flushes between rows, failed Executes and Executes with a row limit, and ends
// with a COPY end, a Sync and a Query whose row marks the end. It runs directly and through a pool of one; the
// pooled client must get the same answers, or (where the pool cannot tell how many answers come) a prefix of
// them and then a FATAL (it ends a session it cannot follow), never a hang; and after each sequence a second client on the
// pool's one connection must get its own answers. The count going low (the connection lent on while the
// subject's answers still come) shows as the second client's wrong answers, or the subject's missing ones.
//
//	COPYFUZZ_SEED the seed (default 1), COPYFUZZ_N the sequences (default 60), COPYFUZZ_ONLY one sequence
func TestPooledCopyPipelineFuzz(t *testing.T) {
	seed, n, only := int64(1), 60, -1
	if v, err := strconv.ParseInt(os.Getenv("COPYFUZZ_SEED"), 10, 64); err == nil {
		seed = v
	}
	if v, err := strconv.Atoi(os.Getenv("COPYFUZZ_N")); err == nil {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv("COPYFUZZ_ONLY")); err == nil {
		only = v
	}
	f := newPooledFenced(t, 1, "  max_client_wait: 15s\n")
	tbl := fxName(t, "cz")
	fxExec(t, f.d, "CREATE TABLE "+tbl+" (x int)")
	t.Cleanup(func() { f.d.Exec(context.Background(), "DROP TABLE IF EXISTS "+tbl) })
	texts := []string{"COPY " + tbl + " FROM STDIN", "COPY " + tbl + " FROM STDIN", "COPY " + tbl + " TO STDOUT",
		"COPY (SELECT 1 UNION ALL SELECT 2) TO STDOUT", "SELECT 'copy'", "SELECT 1/0", "SELECT generate_series(1, 3)",
		"INSERT INTO " + tbl + " VALUES (9)", "COPY " + tbl + " FROM STDIN; SELECT 'copy'; COPY " + tbl + " FROM STDIN",
		"COPY " + tbl + " TO STDOUT; COPY " + tbl + " FROM STDIN"}
	t.Logf("seed %d, %d sequences", seed, n)
	judged := 0
	defer func() { t.Logf("%d sequences judged (the others hang or end directly)", judged) }()
	for i := range n {
		if only >= 0 && i != only {
			continue
		}
		r := rand.New(rand.NewSource(seed*1000 + int64(i)))
		seq := cfGen(r, texts)
		fxExec(t, f.d, "TRUNCATE "+tbl)
		d := cfRun(t, pg.SuperDSN()+woOpts, seq)
		fxExec(t, f.d, "TRUNCATE "+tbl)
		p := cfRun(t, f.dsn()+woOpts, seq)
		ds, ps := strings.Join(d, " "), strings.Join(p, " ")
		var names []string
		for _, m := range seq {
			names = append(names, m.s)
		}
		if strings.Contains(ds, "HANG") || strings.Contains(ds, "RECVERR") {
			continue // the server itself waits, or ended the connection (a sequence the test does not judge)
		}
		judged++
		ok := ps == ds
		if i := strings.LastIndex(ps, "FATAL:"); !ok && i >= 0 && !strings.Contains(ps, "HANG") {
			// The pool ended the session where it could not follow (messages sent into a COPY): fail closed,
			// with the answers before its end the same.
			ok = strings.HasPrefix(ds, strings.TrimSpace(ps[:i]))
		}
		if !ok {
			t.Errorf("sequence %d differs\n  seq:    %s\n  direct: %s\n  pooled: %s", i, strings.Join(names, " "), ds, ps)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		other, err := pgconn.Connect(ctx, f.dsn())
		if err != nil {
			cancel()
			t.Fatalf("sequence %d: a second client: %v\n  seq: %s", i, err, strings.Join(names, " "))
		}
		for k := range 3 {
			want := fmt.Sprintf("mine %d", k)
			rs, err := other.Exec(ctx, "SELECT '"+want+"'").ReadAll()
			if err != nil || len(rs) != 1 || len(rs[0].Rows) != 1 || string(rs[0].Rows[0][0]) != want {
				t.Errorf("sequence %d: the second client's query %d: %v %v\n  seq: %s", i, k, rs, err, strings.Join(names, " "))
				break
			}
		}
		other.Close(context.Background())
		cancel()
	}
}

// cfGen makes one sequence of 4-20 messages, then a COPY end, a Sync and the end's Query.
func cfGen(r *rand.Rand, texts []string) []woMsg {
	var out []woMsg
	atBoundary := true
	for n := 4 + r.Intn(17); len(out) < n; {
		x := r.Intn(100)
		switch {
		case x < 12 && atBoundary:
			q := woPick(r, texts)
			out = append(out, woQ(q))
			continue
		case x < 30:
			q := woPick(r, texts)
			out = append(out, woP("", q), woB("", ""))
			rows := uint32(0)
			if r.Intn(4) == 0 {
				rows = 1
			}
			out = append(out, woE("", rows))
		case x < 36:
			out = append(out, woE("", uint32(r.Intn(2))))
		case x < 52:
			row := "5\n"
			if r.Intn(4) == 0 {
				row = "bad\n"
			}
			out = append(out, woMsg{&pgproto3.CopyData{Data: []byte(row)}, "CopyData(" + strings.TrimSpace(row) + ")"})
		case x < 62:
			out = append(out, woMsg{&pgproto3.CopyDone{}, "CopyDone"})
		case x < 66:
			out = append(out, woMsg{&pgproto3.CopyFail{Message: "no"}, "CopyFail"})
		case x < 69:
			out = append(out, woMsg{&pgproto3.Flush{}, "Flush"})
			continue
		case x < 72:
			out = append(out, woD('P', ""))
		default:
			out = append(out, woS)
			atBoundary = true
			continue
		}
		atBoundary = false
	}
	return append(out, woMsg{&pgproto3.CopyDone{}, "CopyDone"}, woS, woQ("SELECT 'end'"))
}

// cfRun sends seq in one write and reads the answers up to the end Query's ReadyForQuery, a FATAL, or a wait of
// five seconds (HANG).
func cfRun(t *testing.T, dsn string, seq []woMsg) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer pc.Close(context.Background())
	fe := pc.Frontend()
	for _, m := range seq {
		fe.Send(m.m)
	}
	if err := fe.Flush(); err != nil {
		t.Fatalf("send: %v", err)
	}
	var got []string
	end := false
	for {
		pc.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
		m, err := fe.Receive()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return append(got, "HANG")
			}
			return append(got, "RECVERR")
		}
		s := woShort(m)
		if s == "" || strings.HasPrefix(s, "S:") {
			continue
		}
		got = append(got, s)
		if strings.HasPrefix(s, "FATAL") {
			return got
		}
		if s == "D[end]" {
			end = true
		}
		if end && strings.HasPrefix(s, "Z:") {
			return got
		}
	}
}

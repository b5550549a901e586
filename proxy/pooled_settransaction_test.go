package proxy_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// A batch of the extended protocol that holds nothing but statements PostgreSQL ignores or refuses outside a
// transaction block (SET TRANSACTION, SET LOCAL, DECLARE) answers as directly: no token statement goes in front,
// whose snapshot made SET TRANSACTION ISOLATION LEVEL fail 25001 where directly it only warns (the settings
// fuzzer's finding), also when bound in a later batch than its Parse; and a SET LOCAL of the token there leaves
// the client's token as it was. A batch with another statement beside keeps its token statement.
func TestPooledSetTransactionBatchOutsideABlock(t *testing.T) {
	f := newPooledFenced(t, 1, "")
	run := func(pc *pgconn.PgConn) []string {
		var got []string
		for _, batch := range [][]pgproto3.FrontendMessage{
			{&pgproto3.Parse{Query: "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}},
			{&pgproto3.Parse{Name: "st", Query: "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"}, &pgproto3.Sync{}},
			{&pgproto3.Bind{PreparedStatement: "st"}, &pgproto3.Execute{}, &pgproto3.Sync{}},
			{&pgproto3.Parse{Query: "SET LOCAL fence.token = '7'"}, &pgproto3.Bind{}, &pgproto3.Execute{},
				&pgproto3.Parse{Name: "dc", Query: "DECLARE c CURSOR FOR SELECT 1"}, &pgproto3.Bind{PreparedStatement: "dc"}, &pgproto3.Execute{}, &pgproto3.Sync{}},
			{&pgproto3.Query{String: "SHOW fence.token"}},
			{&pgproto3.Parse{Query: "SELECT current_setting('fence.token')"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}},
		} {
			got = append(got, shortAnswers(t, pc, batch...)...)
		}
		return got
	}
	d, err := pgconn.Connect(ctxT(t), pg.SuperDSN()+"&options=-c%20fence.token%3D5")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(context.Background()) })
	want := run(d)
	got := run(pooledPgConn(t, f, "&options=-c%20fence.token%3D5"))
	if !slices.Equal(got, want) {
		t.Fatalf("\nproxy  %q\ndirect %q", got, want)
	}
	if !slices.Contains(want, "D5") {
		t.Fatalf("directly the token is not 5: %q", want)
	}
}

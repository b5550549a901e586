package proxy_test

import "github.com/jackc/pgx/v5/pgproto3"

// woCase is a hand-written sequence of TestPooledWireOracleCases: known when docs/pooling.md lists its
// difference (woKnownDiff), table when it writes wo_t (emptied first).
type woCase struct {
	seq          []woMsg
	known, table bool
}

// woBRF is woB with result format codes.
func woBRF(portal, stmt string, rf []int16, params ...string) woMsg {
	m := woB(portal, stmt, params...)
	m.m.(*pgproto3.Bind).ResultFormatCodes = rf
	m.s += "rf"
	return m
}

func woCases() map[string]woCase {
	return map[string]woCase{
		// The unnamed portal after the token statement's: 34000 as directly, wherever in the batch or block.
		"close S then execute":       {seq: []woMsg{woC('S', "s1"), woE("", 0), woS}},
		"parse then execute":         {seq: []woMsg{woP("s2", "SELECT 1"), woE("", 1), woS}},
		"savepoint describe execute": {seq: []woMsg{woP("s1", "SAVEPOINT a"), woD('P', ""), woE("", 0), woS}},
		"flush first":                {seq: []woMsg{woH, woE("", 0), woS}},
		"parse flush execute":        {seq: []woMsg{woP("s1", "SELECT 1"), woH, woE("", 0), woS}},
		// A client portal named as the token statement's (review53proto), bound before the BEGIN with modes
		// after which the token statement goes into that portal name.
		"client portal named fenceproxy_p": {seq: []woMsg{woP("s0", "SELECT 1"), woB("fenceproxy_p", "s0"), woP("s1", "BEGIN ISOLATION LEVEL REPEATABLE READ"), woB("", "s1"), woE("", 0), woE("fenceproxy_p", 0), woS, woQ("ROLLBACK")}},
		"client portal fenceproxy_p after": {seq: []woMsg{woP("s1", "BEGIN ISOLATION LEVEL REPEATABLE READ"), woB("", "s1"), woE("", 0), woP("s0", "SELECT 1"), woB("fenceproxy_p", "s0"), woE("fenceproxy_p", 0), woS, woQ("ROLLBACK")}},
		"describe proxy portal":            {seq: []woMsg{woP("s1", "BEGIN ISOLATION LEVEL REPEATABLE READ"), woB("", "s1"), woE("", 0), woD('P', "fenceproxy_p"), woS, woQ("ROLLBACK")}},
		"begin then execute":               {seq: []woMsg{woP("", "BEGIN"), woB("", ""), woE("", 0), woS, woD('P', ""), woE("", 0), woS, woQ("COMMIT")}},
		"begin named then execute":         {seq: []woMsg{woP("s1", "BEGIN"), woB("p1", "s1"), woE("p1", 0), woS, woD('P', ""), woE("", 0), woS, woQ("COMMIT")}},
		"aborted block not committed": {table: true, seq: []woMsg{woP("s1", "BEGIN"), woB("p1", "s1"), woE("p1", 0), woS,
			woP("s2", "INSERT INTO wo_t VALUES (1)"), woB("p2", "s2"), woE("p2", 0), woS, woE("", 0), woS,
			woQ("COMMIT"), woQ("SELECT count(*) FROM wo_t")}},
		// The token statement's unnamed portal is closed before the first client message that could reach it
		// (closeTokenPortalBefore): a Bind of the unnamed portal that fails, an Execute that opens a block, a
		// Describe or Close of a statement in between.
		"failed bind then execute":        {seq: []woMsg{woB("", "s9"), woS, woE("", 0), woS}},
		"begin named, failed bind":        {seq: []woMsg{woP("s1", "BEGIN"), woB("p1", "s1"), woE("p1", 0), woB("", "s9"), woS, woE("", 0), woD('P', ""), woS, woQ("ROLLBACK")}},
		"describe S then execute":         {seq: []woMsg{woP("s1", "SELECT 1"), woD('S', "s1"), woC('S', "s2"), woE("", 0), woS}},
		"close P unnamed then execute":    {seq: []woMsg{woC('P', ""), woE("", 0), woS}},
		"bind named portal then describe": {seq: []woMsg{woP("s1", "SELECT 1"), woB("p1", "s1"), woD('P', ""), woE("p1", 0), woS}},
		// Its review's: a Bind of the unnamed portal failing before PostgreSQL drops the old portal (26000, 08P01)
		// and after (22P02, result formats); the hidden Close among the client's own Closes; COPY; WITH HOLD.

		"bind 26000 exec":        {seq: []woMsg{woB("", "nope"), woE("", 0), woS, woD('P', ""), woE("", 0), woS}},
		"bind 08P01 exec":        {seq: []woMsg{woP("s1", "SELECT $1::int"), woS, woB("", "s1"), woE("", 0), woS, woE("", 0), woS}},
		"bind 08P01 flush exec":  {seq: []woMsg{woP("s1", "SELECT $1::int"), woS, woB("", "s1"), woH, woE("", 0), woS, woE("", 0), woS}},
		"bind 22P02 exec":        {seq: []woMsg{woP("s1", "SELECT $1::int"), woS, woB("", "s1", "x"), woE("", 0), woS, woD('P', ""), woE("", 0), woS}},
		"bind result fmt exec":   {seq: []woMsg{woP("s1", "SELECT 1"), woS, woBRF("", "s1", []int16{0, 0, 0}), woE("", 0), woS, woE("", 0), woS}},
		"unnamed bind 08P01":     {seq: []woMsg{woP("", "SELECT $1::int"), woS, woB("", ""), woE("", 0), woS, woE("", 0), woS}},
		"parse err then exec":    {seq: []woMsg{woP("s1", "SELEC 1"), woE("", 0), woD('P', ""), woS, woE("", 0), woS}},
		"parse err flush exec":   {seq: []woMsg{woP("s1", "SELEC 1"), woH, woE("", 0), woC('P', ""), woS, woE("", 0), woS}},
		"describe S bad exec":    {seq: []woMsg{woD('S', "nope"), woH, woE("", 0), woS, woE("", 0), woS}},
		"close S unnamed exec":   {seq: []woMsg{woP("", "SELECT 7"), woS, woC('S', ""), woD('P', ""), woE("", 0), woS}},
		"parse unnamed exec":     {seq: []woMsg{woP("", "SELECT 7"), woD('P', ""), woE("", 0), woS}},
		"bind named begin":       {seq: []woMsg{woP("s1", "BEGIN"), woB("p1", "s1"), woE("p1", 0), woD('P', ""), woE("", 0), woS, woE("", 0), woS, woQ("COMMIT")}},
		"begin unnamed bind bad": {table: true, seq: []woMsg{woP("", "BEGIN"), woB("", ""), woE("", 0), woB("", "nope"), woS, woE("", 0), woS, woQ("COMMIT")}},
		"begin then bad bind in block": {table: true, seq: []woMsg{woP("s1", "BEGIN"), woB("", "s1"), woE("", 0), woS,
			woP("s2", "INSERT INTO wo_t VALUES (1)"), woB("p2", "s2"), woE("p2", 0), woS, woB("", "nope"), woS, woE("", 0), woS,
			woQ("COMMIT"), woQ("SELECT count(*) FROM wo_t")}},
		"closecompletes after hidden close": {seq: []woMsg{woP("s1", "SELECT 1"), woB("p1", "s1"), woC('S', "zz"), woE("p1", 0), woC('P', "p1"), woC('P', ""), woS, woC('S', "s1"), woS}},
		"closecompletes failed batch":       {seq: []woMsg{woC('S', "a"), woP("s1", "SELEC 1"), woC('S', "b"), woE("", 0), woC('S', "c"), woS, woC('S', "d"), woE("", 0), woC('S', "e"), woS}},
		"hold cursor pinned":                {seq: []woMsg{woQ("DECLARE h CURSOR WITH HOLD FOR SELECT 1"), woD('P', ""), woE("h", 0), woS, woE("", 0), woS, woD('P', "h"), woS, woQ("CLOSE h")}},
		"copy in batch":                     {table: true, seq: []woMsg{woP("", "COPY wo_t FROM STDIN"), woB("", ""), woE("", 0), woMsg{&pgproto3.CopyData{Data: []byte("5\n")}, "CopyData"}, woMsg{&pgproto3.CopyDone{}, "CopyDone"}, woE("", 0), woS, woQ("SELECT count(*) FROM wo_t")}},
		// A CopyDone outside any COPY (PostgreSQL ignores it) while an earlier unit is answered, then a COPY run by an
		// Execute with its data pipelined: the pool counted the earlier unit's Sync among those the COPY makes the
		// server ignore, and waited for an answer that never came (review53proto).
		"stray copydone then copy in block": {table: true, seq: []woMsg{woQ("BEGIN"), woS, woMsg{&pgproto3.CopyDone{}, "CopyDone"}, woP("", "COPY wo_t FROM STDIN"), woB("", ""), woE("", 0), woMsg{&pgproto3.CopyData{Data: []byte("5\n")}, "CopyData"}, woMsg{&pgproto3.CopyDone{}, "CopyDone"}, woS, woQ("COMMIT"), woQ("SELECT 'after'")}},
		"stray copydone then copy":          {table: true, seq: []woMsg{woP("", "SELECT 1"), woB("", ""), woE("", 0), woS, woMsg{&pgproto3.CopyDone{}, "CopyDone"}, woP("", "COPY wo_t FROM STDIN"), woB("", ""), woE("", 0), woMsg{&pgproto3.CopyData{Data: []byte("5\n")}, "CopyData"}, woMsg{&pgproto3.CopyDone{}, "CopyDone"}, woS, woQ("SELECT 'after'")}},
		"stray copyfail then copy in block": {table: true, seq: []woMsg{woQ("BEGIN"), woS, woMsg{&pgproto3.CopyFail{Message: "x"}, "CopyFail"}, woP("", "COPY wo_t FROM STDIN"), woB("", ""), woE("", 0), woMsg{&pgproto3.CopyData{Data: []byte("5\n")}, "CopyData"}, woMsg{&pgproto3.CopyDone{}, "CopyDone"}, woS, woQ("COMMIT"), woQ("SELECT 'after'")}},
		"token portal describe after flush": {seq: []woMsg{woP("", "SELECT 2"), woH, woD('S', ""), woH, woD('P', ""), woS}},
		"two syncs":                         {seq: []woMsg{woP("s1", "SELECT 1"), woS, woS, woE("", 0), woS}},
		// A batch that starts with a Close (pgx evicts statements so) is classified by its first statement: a
		// BEGIN with modes or a DISCARD ALL behind it ran after the checked token statement and failed 25001.
		"close then begin modes":   {seq: []woMsg{woC('S', "s1"), woP("s1", "BEGIN ISOLATION LEVEL REPEATABLE READ"), woB("", "s1"), woE("", 0), woS, woQ("COMMIT")}},
		"close then discard all":   {seq: []woMsg{woC('S', "s1"), woP("", "DISCARD ALL"), woB("", ""), woE("", 0), woS}},
		"close then describe bind": {seq: []woMsg{woC('S', "s1"), woP("s1", "BEGIN READ ONLY"), woD('S', "s1"), woB("p1", "s1"), woE("p1", 0), woS, woQ("COMMIT")}},
		"describe S P":             {seq: []woMsg{woP("s1", "SELECT 1"), woD('S', "s1"), woD('P', "s1"), woE("", 0), woS}},
		"close P named first":      {seq: []woMsg{woC('P', "x"), woE("", 0), woS}},
		"exec named missing":       {seq: []woMsg{woE("nope", 0), woE("", 0), woS, woE("", 0), woS}},
		"bind named dup":           {seq: []woMsg{woP("s1", "SELECT 1"), woB("p1", "s1"), woB("p1", "s1"), woE("", 0), woS, woE("", 0), woS}},
		"bind unnamed ok exec":     {seq: []woMsg{woP("s1", "SELECT 1"), woB("", "s1"), woE("", 0), woE("", 0), woS, woE("", 0), woS}},
		// A statement that needs a transaction block, alone in a Query: refused (or warned) as directly.
		"declare alone":                 {seq: []woMsg{woQ("DECLARE c CURSOR FOR SELECT 1")}},
		"lock alone":                    {seq: []woMsg{woQ("LOCK TABLE pg_class IN ACCESS SHARE MODE")}},
		"set local alone":               {seq: []woMsg{woQ("SET LOCAL work_mem = '7MB'"), woQ("SHOW work_mem")}},
		"set local token alone":         {seq: []woMsg{woQ("SET LOCAL fence.token = '5'"), woQ("SHOW fence.token")}},
		"savepoint alone":               {seq: []woMsg{woQ("SAVEPOINT a")}},
		"release alone":                 {seq: []woMsg{woQ("RELEASE a")}},
		"set session transaction alone": {seq: []woMsg{woQ("SET SESSION TRANSACTION READ ONLY"), woQ("SHOW transaction_read_only")}},
		"set custom local.x alone":      {seq: []woMsg{woQ("SET local.x = 'a'"), woQ("SHOW local.x")}},
		"commit parse in aborted block": {known: true, seq: []woMsg{woP("s1", "SELECT 1"), woS, woQ("BEGIN"), woD('P', "x"), woS, woP("s1", "COMMIT"), woS, woQ("ROLLBACK")}},
		"set transaction alone":         {seq: []woMsg{woQ("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), woQ("SHOW transaction_isolation")}},
		"declare parse execute":         {seq: []woMsg{woP("s2", "DECLARE c CURSOR FOR SELECT 1"), woE("", 1), woS}},
		"declare in a block":            {seq: []woMsg{woQ("BEGIN"), woQ("DECLARE c CURSOR FOR SELECT 1"), woQ("FETCH c"), woQ("COMMIT")}},
		"declare with hold alone":       {seq: []woMsg{woQ("DECLARE h CURSOR WITH HOLD FOR SELECT 1"), woQ("FETCH h"), woQ("CLOSE h")}},
		"commit alone":                  {seq: []woMsg{woQ("COMMIT")}},
		"set local then select":         {seq: []woMsg{woQ("SET LOCAL work_mem = '7MB'; SELECT 1")}},
		// Listed differences: both fail, with another SQLSTATE.
		"42P05 before syntax":         {seq: []woMsg{woP("s3", "SELECT 1"), woP("s3", "SELEC 1"), woS}},
		"42P05 before syntax, two":    {seq: []woMsg{woP("s3", "SELECT 1"), woS, woP("s3", "SELEC 1"), woS}},
		"rollback parsed first":       {known: true, seq: []woMsg{woP("s1", "ROLLBACK"), woP("", "SELECT current_setting('fence.token', true)"), woB("p2", ""), woE("p2", 0), woS}},
		"bind count in aborted block": {known: true, seq: []woMsg{woP("s2", "SELECT 1"), woS, woQ("BEGIN"), woQ("SELECT 1/0"), woB("p1", "s2", "1"), woS, woQ("ROLLBACK")}},
	}
}

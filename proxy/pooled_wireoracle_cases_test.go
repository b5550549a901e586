package proxy_test

// woCase is a hand-written sequence of TestPooledWireOracleCases: known when docs/pooling.md lists its
// difference (woKnownDiff), table when it writes wo_t (emptied first).
type woCase struct {
	seq          []woMsg
	known, table bool
}

func woCases() map[string]woCase {
	return map[string]woCase{
		// The unnamed portal after the token statement's: 34000 as directly, wherever in the batch or block.
		"close S then execute":       {seq: []woMsg{woC('S', "s1"), woE("", 0), woS}},
		"parse then execute":         {seq: []woMsg{woP("s2", "SELECT 1"), woE("", 1), woS}},
		"savepoint describe execute": {seq: []woMsg{woP("s1", "SAVEPOINT a"), woD('P', ""), woE("", 0), woS}},
		"flush first":                {seq: []woMsg{woH, woE("", 0), woS}},
		"parse flush execute":        {seq: []woMsg{woP("s1", "SELECT 1"), woH, woE("", 0), woS}},
		"describe proxy portal":      {seq: []woMsg{woP("s1", "BEGIN ISOLATION LEVEL REPEATABLE READ"), woB("", "s1"), woE("", 0), woD('P', "fenceproxy_p"), woS, woQ("ROLLBACK")}},
		"begin then execute":         {seq: []woMsg{woP("", "BEGIN"), woB("", ""), woE("", 0), woS, woD('P', ""), woE("", 0), woS, woQ("COMMIT")}},
		"begin named then execute":   {seq: []woMsg{woP("s1", "BEGIN"), woB("p1", "s1"), woE("p1", 0), woS, woD('P', ""), woE("", 0), woS, woQ("COMMIT")}},
		"aborted block not committed": {table: true, seq: []woMsg{woP("s1", "BEGIN"), woB("p1", "s1"), woE("p1", 0), woS,
			woP("s2", "INSERT INTO wo_t VALUES (1)"), woB("p2", "s2"), woE("p2", 0), woS, woE("", 0), woS,
			woQ("COMMIT"), woQ("SELECT count(*) FROM wo_t")}},
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
		"42P05 before syntax":         {known: true, seq: []woMsg{woP("s3", "SELECT 1"), woP("s3", "SELEC 1"), woS}},
		"42P05 before syntax, two":    {known: true, seq: []woMsg{woP("s3", "SELECT 1"), woS, woP("s3", "SELEC 1"), woS}},
		"rollback parsed first":       {known: true, seq: []woMsg{woP("s1", "ROLLBACK"), woP("", "SELECT current_setting('fence.token', true)"), woB("p2", ""), woE("p2", 0), woS}},
		"bind count in aborted block": {known: true, seq: []woMsg{woP("s2", "SELECT 1"), woS, woQ("BEGIN"), woQ("SELECT 1/0"), woB("p1", "s2", "1"), woS, woQ("ROLLBACK")}},
	}
}

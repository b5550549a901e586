// Package hostile runs the hostile corpus (issue 11): SQL written by an attacker, or by an unlucky client, sent
// through fenceproxy to a real PostgreSQL, each case checked afterwards from a direct connection.
//
// # Cases
//
// Cases live in testdata/hostile/*.txt at the repository root. A file is a sequence of cases; lines starting
// with '#' between cases are comments. A case is
//
//	=== name                      unique in the corpus
//	class: ddl                    free label, for the summary (ddl, cascade, verify, scope, encoding, ...)
//	config: scope=transaction     proxy variant, comma-separated: scope=transaction, verify=on (an etcd
//	                              verifier with token.offset 10000: tokens up to 10000 + the etcd revision
//	                              are "issued"), writes=refuse (token_column_writes: refuse), catalog=on (a
//	                              catalog: section; the harness reads the catalog after the case's direct
//	                              SQL and gives the proxy the planner fenceproxy serve builds from it),
//	                              guard=on (the database gets the fenceproxy schema and guard for the
//	                              protected tables from schema.Install, as fenceproxy install does, before
//	                              the case's direct SQL; direct SQL must then not write protected rows),
//	                              pool=transaction (pool.mode: transaction with one server connection)
//	direct: SQL                   run directly as superuser in the case's database first (repeatable)
//	setup: SQL                    run through the proxy before the token is set; must succeed (repeatable)
//	token: fresh                  the session's token: fresh (1000, newer than every row), stale (20, older
//	                              than most rows), none, or a literal
//	token-via: set                how the harness gives it: set (SET fence.token, the default), options
//	                              (startup options -c fence.token=...), sql (the case's SQL sets it itself; the
//	                              invariant still holds the session to the token line)
//	encoding: SJIS                client_encoding, as a startup parameter
//	scs: off                      standard_conforming_strings, as a startup parameter
//	escapes: on                   \xNN in the SQL is the byte NN (for texts in other encodings)
//	protocol: simple              simple (one Query message, the default), extended (Parse/Bind/Describe/
//	                              Execute/Sync; one statement) or both (the case runs once per protocol)
//	expect: refused 55F04         the outcome: refused CODE [TEXT] (some statement fails with SQLSTATE CODE,
//	                              and a message holding TEXT when given), fenced (no error, and some
//	                              protected row changed, each with the token), untouched (no protected row
//	                              changed; errors allowed), ok (no error). A text refused because it cannot
//	                              be read (42601, or 55F04 saying "cannot parse" or "cannot read") tests
//	                              nothing else: the case fails unless its line names that reason
//	                              (expect: refused 55F04 cannot parse), so a typo cannot count as held
//	expect-pool: refused 55F03    the outcome through a transaction pool, where it differs by the contract:
//	                              every case also runs through a pool of one server connection (name/pool),
//	                              unless its config has pool=transaction (then it runs only so)
//	expect-hole: ceiling          a hole today's main still has, to be closed by that branch: the harness
//	                              logs the violation instead of failing, and fails when the case holds (so a
//	                              mark cannot go stale: remove it, keeping the expect line)
//	sql:
//	<the SQL: every line up to the next line starting with "expect:", "expect-hole:" or "=== "; a line
//	starting with '#' there is an error (it would be sent as SQL): comments go before sql:>
//	expect: ...                   (the expect lines may also come before sql:)
//
// # The invariant
//
// Every case runs in a database of its own, copied from a template that holds the protected tables: accounts
// (with rows holding tokens 50, 100, NULL and 70, a foreign key to parents with ON DELETE/UPDATE CASCADE, and an
// unconfigured inheritance child accounts_old holding a row with token 60),
// ledger (partitioned by list into ledger_eu and ledger_us), a view accounts_v over accounts, and unprotected
// parents and other. The proxy protects accounts and ledger (token column fence_token). After the case the
// harness reads every protected row directly and checks, for each row that changed, appeared or disappeared,
// that the session held a valid token k (verified, when verification is on), that the row's old token was at
// most k (NULL counts as 0) and that a changed or new row holds exactly k. So no row's token is ever lowered,
// and nothing changes without a valid token. Then two probes run through the proxy on new connections: a
// tokenless DELETE of a row, and a stale (20) DELETE of rows holding 100; neither may change anything. The
// probes catch what a case leaves behind: rules, triggers, renamed tables, role or database defaults of the
// token or of search_path.
package hostile

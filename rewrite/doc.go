// Package rewrite makes writes to protected tables check fencing tokens inside
// PostgreSQL. It is pure: SQL text and the protected-table configuration in,
// a Plan (pass, rewrite or refuse) out. The proxy calls it for every simple
// Query message and every extended-protocol Parse, through a Cache.
//
// # Mechanism
//
// For a protected table T with token column C, every INSERT, UPDATE and
// DELETE of T is rewritten on the pg_query parse tree (and deparsed; SQL text
// is never spliced) so that PostgreSQL itself compares the session's token k
// with the row's C, under the row lock, in the same statement:
//
//	UPDATE T SET ..., C = t
//	WHERE (cond)
//	  AND CASE WHEN (cond) THEN
//	        CASE WHEN COALESCE(T.C, 0) <= t THEN true
//	             ELSE ('fenceproxy|55F01|' || T.C::text || '|' || <token> || '|T|.')::int8 IS NULL END
//	      ELSE false END
//	  AND k IS NOT NULL
//
// where k validates the session's token (below) and t is the setting's value
// read directly, current_setting(setting)::int8: k IS NOT NULL is a one-time
// filter that PostgreSQL evaluates before it reads any row, so by the time t
// is read, k has raised unless the setting holds a valid token. One copy of k
// per statement keeps the per-execution cost to one InitPlan.
//
// DELETE gets the same WHERE; INSERT gets C in its column list and k in every
// row (VALUES, SELECT, DEFAULT VALUES); ON CONFLICT DO UPDATE gets C = t and
// the row check as its WHERE (the inserted row, built first, carries k). The golden files in testdata/rewrite at the
// repository root show every form.
//
// The token k is a scalar subquery with no outer references,
//
//	(SELECT CASE WHEN <s is a valid token> THEN s::int8 ELSE <55F02/55F03 marker>::int8 END
//	 FROM (SELECT pg_catalog.current_setting('fence.token', true)) AS fenceproxy_token(s))
//
// so PostgreSQL plans it as an InitPlan: evaluated once per execution, at
// execution time. The token is the one in force when the statement runs, also
// for a statement prepared (extended protocol or PREPARE) long before and
// executed with a cached generic plan; SET, SET LOCAL, RESET, set_config and
// transaction rollback behave exactly as in PostgreSQL because the setting is
// PostgreSQL's own. "Valid" is the rule of ValidToken, written in SQL as
//
//	ltrim(s, '0123456789') = '' AND ltrim(s, '0') <> ''
//	AND (length(s) < 19 OR (length(s) = 19 AND s COLLATE "C" <= '9223372036854775807'))
//
// (conditions that cannot fail, so their evaluation order does not matter;
// only s::int8 could fail, and CASE runs it only when they hold; string
// functions rather than regular expressions because they are cheaper).
//
// # Why a cast marker
//
// Plain SQL cannot raise a chosen SQLSTATE. Casting a marker string to int8
// raises 22P02 `invalid input syntax for type bigint: "fenceproxy|55F01|7|5|T|."`;
// the proxy recognises the marker in the ErrorResponse (DecodeMarker, which
// does not depend on the message language) and sends the client the
// contract's SQLSTATE, message, DETAIL and HINT (Marker.Describe). It is a
// real server-side error: the statement changes nothing, the transaction is
// aborted, later statements get 25P02. The marker always includes a part that
// is not a constant (the row's C, or the setting's value): PostgreSQL folds
// constant expressions at plan time even inside CASE arms that are never
// taken, so a constant marker would raise for every statement.
//
// # Why the CASE re-check
//
// The planner orders the WHERE's quals as it likes (cheapest first, index
// quals into the scan), and AND/OR do not promise an evaluation order. The
// check is therefore wrapped in CASE WHEN (cond) THEN ... ELSE false END: CASE
// does fix the order, so a row that does not satisfy the statement's own
// condition never reaches the 55F01 arm and never raises, whatever the plan.
// The leading plain (cond) keeps the statement's index use: the primary-key
// UPDATE remains an index scan with the check as a filter on the one row.
//
// # Why the one-time filter
//
// k IS NOT NULL has no column references, so PostgreSQL evaluates it once, as
// a One-Time Filter before scanning (k never yields NULL: it raises instead).
// A missing (55F02) or invalid (55F03) token thus fails the statement even
// when no row matches, and before any row is changed. INSERT ... SELECT gets
// the same filter in its SELECT's WHERE.
//
// # Properties
//
//   - Rows whose C > k are never changed: the statement fails with 55F01 and
//     changes nothing. C = k is accepted (the same holder writes twice); NULL
//     counts as 0.
//   - Under READ COMMITTED, an UPDATE, DELETE or ON CONFLICT DO UPDATE that
//     waits for a row lock re-evaluates the whole WHERE on the new row
//     version once the lock holder commits (EvalPlanQual), so a stale writer
//     queued behind a newer holder gets 55F01, not a silent "0 rows". Under
//     REPEATABLE READ and SERIALIZABLE it gets PostgreSQL's 40001 as usual.
//   - Every new row gets C = k; a write naming C is refused (55F04).
//   - The check is statement-level and atomic with the write: no window
//     between check and write, no extra round trip, no stored procedures or
//     triggers to install.
//   - Reads and statements writing no protected table pass unchanged (the
//     original text; a prefilter, MayTouch, skips parsing entirely for text
//     that cannot concern a protected table or the token: parsing happens
//     only for text holding a write keyword token (insert, update, delete,
//     merge, truncate, copy) and an identifier naming a protected table, or
//     DO, or an identifier naming set_config or the token setting).
//
// # Reading SQL as the server does
//
// Every text is read under the session's client_encoding, server_encoding
// and standard_conforming_strings (Settings, from the server's
// ParameterStatus): decoded to UTF-8 exactly (reading.go), split into tokens
// by a lexer with the server's own rules (lexer.go), and the prefilter looks
// at decoded tokens, so no escape, quoting, comment or Unicode spelling hides
// a name. With standard_conforming_strings off, each '...' literal holding a
// backslash is given to pg_query (which always reads it on) as E'...', which
// is how the server scans it. A rewrite is re-encoded to the client's
// encoding. Text that cannot be read exactly (an encoding the proxy cannot
// decode, invalid bytes, settings that an unanswered earlier statement may
// have changed) is refused when its raw bytes hold a keyword that could
// write. DO blocks are always analysed, after decoding (do.go). See
// docs/reading-sql.md.
//
// # Multi-row VALUES
//
// Each scalar subquery becomes a separately planned InitPlan, and planning
// time grows quadratically with their number (measured on PostgreSQL 15: a
// 1000-row VALUES with k in every row took 30 times as long as plain). So
// only the first row carries k; the others carry the setting's value,
// current_setting(setting)::int8. VALUES rows are evaluated in order, so k
// has validated the setting before any row is built.
//
// # Where statements are found
//
// The whole tree is walked: CTEs (also under SELECT and nested), several
// statements in one text, PREPARE bodies, EXPLAIN [ANALYZE], COPY (query) TO,
// CREATE TABLE AS. Refused with 55F04: TRUNCATE, COPY ... FROM and MERGE on a
// protected table, WHERE CURRENT OF, INSERT without a column list (the
// position of C is unknown), writes naming C, an unqualified name that could
// be two configured tables with different token columns, a DO block whose
// static SQL writes a protected table (or whose body cannot be parsed and
// names one), and text the parser rejects that mentions a protected name and
// a write keyword. SET and set_config of the token
// setting to an invalid literal are refused with 55F03; valid ones are
// reported in Plan.TokenSet.
//
// # Limits
//
//   - Writes not visible in the statement text are not fenced: functions and
//     procedures (SQL-standard bodies are not analysed; a DO block's static
//     SQL is analysed, its dynamic SQL, EXECUTE of a string built at run
//     time, is not seen), triggers, rules (CREATE RULE actions are not analysed),
//     updatable views over a protected table, and writes through a parent
//     table or partition that is not itself configured. Configure the table
//     the application writes through.
//   - Names are compared as PostgreSQL stores them after case folding of
//     unquoted identifiers. A table configured unqualified matches it in
//     every schema; search_path is not known to the proxy.
//   - A set_config of the token setting in a statement that also writes, or
//     in a trigger, changes the token mid-statement; the written token is
//     then the one read when k was evaluated (or, for VALUES rows after the
//     first, when the row was built).
//   - The statement's condition is evaluated twice per candidate row (plain
//     and in the CASE), except its top-level conjuncts that call a function
//     outside a short list of side-effect-free ones: those appear only in the
//     CASE, so nextval(), random() and user functions run once per row, as
//     in the client's statement (at the price of index use on them).
//   - A rewritten statement is deparsed, so comments and formatting of the
//     whole text are lost; the deparser emits PostgreSQL 17 syntax, which
//     PostgreSQL 15 accepts for everything the rewriter adds.
//   - Unquoted identifiers are downcased in ASCII only; a server with a
//     single-byte encoding may also downcase non-ASCII letters (by its
//     locale): protected table names with non-ASCII letters should be
//     configured and written quoted there.
package rewrite

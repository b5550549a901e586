package rewrite

import (
	"strings"
	"testing"
)

func TestOwnTransaction(t *testing.T) {
	on := Settings{StandardConformingStrings: true, ClientEncoding: "UTF8", ServerEncoding: "UTF8"}
	for text, want := range map[string]bool{
		"":                                     true,
		"  -- only a comment\n":                true,
		";;":                                   true,
		"VACUUM":                               true,
		"vacuum analyze t;":                    true,
		"DISCARD ALL":                          true,
		"CREATE DATABASE x":                    true,
		"drop tablespace x":                    true,
		"ALTER SYSTEM SET work_mem = 1":        true,
		"CREATE INDEX CONCURRENTLY i ON t (a)": true,
		"COMMIT PREPARED 'x'":                  true,
		"ROLLBACK":                             true,
		"rollback work":                        true,
		"ROLLBACK PREPARED 'x'":                true,
		"ROLLBACK TO a":                        false, // ends no block
		"rollback to savepoint a":              false,
		"ROLLBACK TRANSACTION TO a":            false,
		"ROLLBACK WORK TO SAVEPOINT a":         false,
		"SELECT 1":                             false,
		"BEGIN":                                false,
		"INSERT INTO t VALUES (1)":             false,
		"CREATE TABLE t (a int)":               false,
		"VACUUM; SELECT 1":                     false, // several statements: a block already
		`SELECT 'vacuum'`:                      false,
		`"vacuum"`:                             false, // a quoted identifier is no keyword
		"/* VACUUM */ SELECT 1":                false,
		"create index CoNcUrReNtLy i on t (a)": true,
		`SELECT "concurrently" FROM t`:         false, // quoted: no keyword
		"DROP averyveryverylongtablespacename": false, // a second word longer than its buffer
		"averyveryverylongfirstword database":  false,
	} {
		if got := OwnTransaction([]byte(text), on); got != want {
			t.Errorf("OwnTransaction(%q) = %v, want %v", text, got, want)
		}
	}
}

func TestCustomSettings(t *testing.T) {
	on := Settings{StandardConformingStrings: true, ClientEncoding: "UTF8", ServerEncoding: "UTF8"}
	for text, want := range map[string]string{
		"SET myapp.tenant = 5":                                      "myapp.tenant",
		"set SESSION MyApp.Tenant TO 'x'":                           "myapp.tenant",
		"SET LOCAL a.b = 1":                                         "a.b",
		`SET "My App"."X" = 1`:                                      "my app.x",
		"RESET a.b.c":                                               "a.b.c",
		"SET local.x = 1":                                           "local.x",
		"SELECT 1; SET a.b = 1; RESET c.d":                          "a.b c.d",
		"SELECT set_config('app.user', '7', false)":                 "app.user",
		"SELECT pg_catalog.set_config(E'app.\\x75ser', 'x', false)": "app.user",
		"SELECT set_config($1, $2, false)":                          "",
		"SET search_path = a.b":                                     "",
		"SET SESSION AUTHORIZATION x":                               "",
		"UPDATE t SET a.b = 1":                                      "",
		"SELECT 'SET a.b = 1'":                                      "",
		"/* SET a.b = 1 */ SELECT 1":                                "",
		"SET fence.token = 5":                                       "fence.token",
	} {
		names, unfollowed := CustomSettings([]byte(text), on)
		if got := strings.Join(names, " "); got != want || unfollowed {
			t.Errorf("CustomSettings(%q) = %q, %v; want %q", text, got, unfollowed, want)
		}
	}
	if _, unfollowed := CustomSettings([]byte("SET app.über = 1"), on); !unfollowed {
		t.Error("a name that is not ASCII is followed")
	}
}

// A text CustomSettings cannot read (non-ASCII while the client's encoding is in flux, or one its lexer cannot
// read) is read byte by byte: its dotted names are asked for, and what it may name otherwise is unfollowed.
// Until 2026-12-04 it named nothing, and a custom setting set in it reached the next client.
func TestCustomSettingsUnreadable(t *testing.T) {
	flux := Settings{StandardConformingStrings: true, ClientEncoding: "UTF8", ServerEncoding: "UTF8", Unsettled: true}
	for text, want := range map[string]string{
		"SET myapp.tenant = 'ténant'":               "myapp.tenant",
		"SET MyApp.Tenant TO 'é'; RESET a.b.c":      "myapp.tenant a.b.c",
		"SELECT set_config('app.user', 'ü', false)": "app.user",
		"UPDATE s.t SET v = 'é' WHERE n = 1.5":      "s.t",
		"SELECT 'é'; SET a.b = 1 /* unterminated":   "a.b",
		"SELECT 'é' AS x; SET a_1$.b2 = 1":          "a_1$.b2",
		"UPDATE t SET v = 'é'":                      "",
	} {
		names, unfollowed := CustomSettings([]byte(text), flux)
		if got := strings.Join(names, " "); got != want || unfollowed {
			t.Errorf("CustomSettings(%q) in flux = %q, %v; want %q", text, got, unfollowed, want)
		}
	}
	for _, text := range []string{
		`SET "myapp".tenant = 'é'`,                    // a quoted name
		"SET myapp . tenant = 'é'",                    // spaces around the dot
		"SET app.über = 1",                            // a name that goes on in a multi-byte character
		"SET über.x = 1",                              // the same, before the dot
		"SELECT set_config(E'app\\x2eu', 'é', false)", // an escape may spell the dot
		"SELECT set_config(U&'app\\002eu', 'é', false)",
		"SELECT t.* FROM t WHERE v = 'é'; SET a.b = 1",
	} {
		if _, unfollowed := CustomSettings([]byte(text), flux); !unfollowed {
			t.Errorf("CustomSettings(%q) in flux is followed", text)
		}
	}
}

func TestBeginsWithTransactionModes(t *testing.T) {
	on := Settings{StandardConformingStrings: true, ClientEncoding: "UTF8", ServerEncoding: "UTF8"}
	for text, want := range map[string]bool{
		"begin isolation level serializable":                          true,
		"BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT 1": true,
		"begin work read only":                                        true,
		"START TRANSACTION READ WRITE, NOT DEFERRABLE":                true,
		";; begin deferrable":                                         true,
		"/* x */ begin read only":                                     true,
		"BEGIN":                                                       false,
		"begin transaction":                                           false,
		"BEGIN WORK; SELECT 1":                                        false,
		"START TRANSACTION":                                           false,
		"start transaction;":                                          false,
		"SELECT 1; BEGIN ISOLATION LEVEL SERIALIZABLE":                false,
		"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE":                false,
		`"begin" read only`:                                           false,
		"":                                                            false,
		"select 'begin read only'":                                    false,
	} {
		if got := BeginsWithTransactionModes([]byte(text), on); got != want {
			t.Errorf("BeginsWithTransactionModes(%q) = %v, want %v", text, got, want)
		}
	}
}

// A lone BEGIN is one statement opening a block without modes, whatever its spelling; anything after it, a
// mode, a quoted "begin" or a text the lexer cannot read is not.
func TestLoneBegin(t *testing.T) {
	on := Settings{StandardConformingStrings: true, ClientEncoding: "UTF8", ServerEncoding: "UTF8"}
	for text, want := range map[string]bool{
		"BEGIN":                              true,
		"begin;":                             true,
		";; Begin Work ;;":                   true,
		"/* x */ BEGIN TRANSACTION -- y":     true,
		"start transaction":                  true,
		"BEGIN; SELECT 1":                    false,
		"BEGIN; COMMIT":                      false,
		"BEGIN ISOLATION LEVEL SERIALIZABLE": false,
		"begin read only":                    false,
		"START TRANSACTION READ WRITE":       false,
		`"begin"`:                            false,
		"BEGIN; SELECT 'unterminated":        false,
		"COMMIT":                             false,
		"":                                   false,
		"SELECT 1; BEGIN":                    false,
	} {
		if got := LoneBegin([]byte(text), on); got != want {
			t.Errorf("LoneBegin(%q) = %v, want %v", text, got, want)
		}
	}
}

func TestPlainStatements(t *testing.T) {
	on := Settings{StandardConformingStrings: true, ClientEncoding: "UTF8", ServerEncoding: "UTF8"}
	off := Settings{StandardConformingStrings: false, ClientEncoding: "UTF8", ServerEncoding: "UTF8"}
	for text, want := range map[string]bool{
		"SELECT abalance FROM pgbench_accounts WHERE aid = 5":                true,
		"select 1; insert into t values (1); update t set a = 2":             true,
		"WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x;":             true,
		"/* SET */ values (1)":                                               true,
		"TABLE t; SHOW search_path; MERGE INTO t USING s ON true DO NOTHING": true,
		"SELECT 'x'; SET search_path = evil":                                 false, // a second statement that SETs
		"SELECT 1; BEGIN":                                                    false,
		"BEGIN; SELECT 1; COMMIT":                                            false,
		"set fence.token = 5":                                                false,
		"RESET ALL":                                                          false,
		"DISCARD ALL":                                                        false,
		"PREPARE p AS SELECT 1":                                              false,
		"EXECUTE p":                                                          false,
		"DECLARE c CURSOR WITH HOLD FOR SELECT 1":                            false,
		"LISTEN x":                        false,
		"CREATE TEMP TABLE t (a int)":     false,
		"DO $$ BEGIN PERFORM 1; END $$":   false,
		"CALL p()":                        false,
		"(SELECT 1)":                      false,
		`"select" FROM t`:                 false, // a quoted word is no keyword
		"":                                false,
		"-- nothing\n":                    false,
		"SELECT 'unterminated":            false,
		`SELECT 'it\'; SET role = x; --'`: false, // without standard_conforming_strings: checked below
	} {
		if got := PlainStatements([]byte(text), on); got != want {
			t.Errorf("PlainStatements(%q) = %v, want %v", text, got, want)
		}
	}
	// With standard_conforming_strings off a backslash escapes the quote: the SET is inside the string.
	if !PlainStatements([]byte(`SELECT 'it\'; SET role = x; --'`), off) {
		t.Error(`PlainStatements with backslash escapes: the string's "SET" was read as a statement`)
	}
}

// The pooler classifies every Query a client sends (proxy/pooled.go: injectTokens): for plain texts that costs
// no allocation.
func TestPoolingClassifiersDoNotAllocate(t *testing.T) {
	on := Settings{StandardConformingStrings: true, ClientEncoding: "UTF8", ServerEncoding: "UTF8"}
	texts := [][]byte{
		[]byte("SELECT abalance FROM pgbench_accounts WHERE aid = 83211;"),
		[]byte("UPDATE pgbench_tellers SET tbalance = tbalance + 12 WHERE tid = 7; INSERT INTO h VALUES (1)"),
		[]byte("create index concurrently i on t (a)"),
	}
	for _, text := range texts {
		if n := testing.AllocsPerRun(100, func() { OwnTransaction(text, on); PlainStatements(text, on) }); n != 0 {
			t.Errorf("%q: %v allocations per call", text, n)
		}
	}
}

// A lone COMMIT, END, ROLLBACK or ABORT with AND CHAIN starts the next transaction at once (ClassifyPooling's
// Chain); AND NO CHAIN, ROLLBACK TO SAVEPOINT, a quoted word or a second statement do not make one the pooler
// can follow.
func TestPoolingClassChain(t *testing.T) {
	on := Settings{StandardConformingStrings: true, ClientEncoding: "UTF8", ServerEncoding: "UTF8"}
	for text, want := range map[string]bool{
		"COMMIT AND CHAIN":                           true,
		"commit work and chain;":                     true,
		"END TRANSACTION AND CHAIN":                  true,
		"ROLLBACK AND CHAIN":                         true,
		"abort and /* c */ chain":                    true,
		"COMMIT":                                     false,
		"COMMIT AND NO CHAIN":                        false,
		"ROLLBACK TO SAVEPOINT chain":                false,
		"rollback to and chain":                      true, // not PostgreSQL's syntax (the server refuses it): no harm
		`COMMIT AND "chain"`:                         false,
		"COMMIT AND CHAIN; INSERT INTO t VALUES (1)": false,
		"SELECT 'COMMIT AND CHAIN'":                  false,
	} {
		if got := ClassifyPooling([]byte(text), on).Chain; got != want {
			t.Errorf("ClassifyPooling(%q).Chain = %v, want %v", text, got, want)
		}
	}
}

package rewrite

import "testing"

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
		"SELECT 1":                             false,
		"BEGIN":                                false,
		"INSERT INTO t VALUES (1)":             false,
		"CREATE TABLE t (a int)":               false,
		"VACUUM; SELECT 1":                     false, // several statements: a block already
		`SELECT 'vacuum'`:                      false,
		`"vacuum"`:                             false, // a quoted identifier is no keyword
		"/* VACUUM */ SELECT 1":                false,
	} {
		if got := OwnTransaction([]byte(text), on); got != want {
			t.Errorf("OwnTransaction(%q) = %v, want %v", text, got, want)
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

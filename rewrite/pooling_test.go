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

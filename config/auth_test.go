package config

import (
	"strings"
	"testing"
)

func TestCheckAuthQuery(t *testing.T) {
	for _, ok := range []string{
		"SELECT usename, passwd FROM fenceproxy_auth.get_auth($1)",
		"SELECT fenceproxy_auth.secret_of($1)",
	} {
		if err := CheckAuthQuery(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for q, want := range map[string]string{
		"SELECT usename, passwd FROM get_auth($1)":                               "without its schema",
		"SELECT usename, passwd FROM pg_shadow WHERE usename = $1":               "must call a schema-qualified function",
		"SELECT passwd FROM pg_catalog.pg_shadow WHERE usename = $1":             "must call",
		"SELECT s.get_auth('alice')":                                             "$1",
		"SELECT s.get_auth($1, $2)":                                              "$1",
		"SELECT s.get_auth($1); SELECT 1":                                        "one SELECT",
		"DELETE FROM s.t WHERE u = $1":                                           "one SELECT",
		"SELECT s.get_auth($1) FROM s.t WHERE lower(u) = $1":                     "without its schema",
		"SELECT usename, passwd FROM s.get_auth($1) WHERE x = (SELECT 1 FROM t)": "without its schema",
	} {
		if err := CheckAuthQuery(q); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", q, err, want)
		}
	}
}

func TestAuthConfig(t *testing.T) {
	base := "upstream: {address: 127.0.0.1:5432}\n"
	cfg, err := Parse("x.yaml", []byte(base))
	if err != nil || cfg.Auth.Type != AuthPassthrough || cfg.Auth.ByProxy() {
		t.Fatalf("default auth: %+v %v", cfg.Auth, err)
	}
	for body, want := range map[string]string{
		"auth: {type: scram-sha-256}":                       "auth.file or auth.query",
		"auth: {type: cert}":                                "tls.client_ca_file",
		"auth: {type: ldap}":                                "must be passthrough",
		"auth: {file: /x}":                                  "passthrough relays",
		"auth: {type: md5, query: 'SELECT s.f($1)'}":        "auth.user",
		"auth: {type: md5, query: 'SELECT f($1)', user: a}": "without its schema",
		"auth: {type: trust, mock_key_file: /k}":            "auth.mock_key_file",
	} {
		if _, err := Parse("x.yaml", []byte(base+body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
	cfg, err = Parse("x.yaml", []byte(base+"auth: {type: md5, query: 'SELECT s.f($1)', user: a, upstream_password: p, upstream_passwords: {bob: q}}"))
	if err != nil || cfg.Auth.Database != DefaultAuthDB || cfg.Auth.UpstreamPasswordFor("bob") != "q" || cfg.Auth.UpstreamPasswordFor("al") != "p" {
		t.Fatalf("%+v %v", cfg.Auth, err)
	}
}

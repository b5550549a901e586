package config

import (
	"encoding/json"
	"fmt"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// Auth is how clients authenticate: to PostgreSQL through the proxy (passthrough, the default), or to the proxy
// itself, which then logs in upstream on their behalf (docs/auth.md).
type Auth struct {
	// Type: passthrough | scram-sha-256 | md5 | trust | cert.
	Type string `yaml:"type"`
	// File is a pgbouncer userlist ("user" "SCRAM-SHA-256$..." or "md5..."), read at start, on SIGHUP and when
	// the upstream refuses a login (28P01).
	File string `yaml:"file"`
	// Query looks a user's secret up (users not in File): a SELECT of a schema-qualified function taking the
	// user name as $1, run as User on a connection of its own with search_path pinned to pg_catalog. Its last
	// column is the secret.
	Query    string `yaml:"query"`
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// Database the query runs in; default postgres.
	Database string `yaml:"database"`
	// UpstreamPassword is the password the proxy logs in upstream with when the client's SCRAM key cannot be
	// used (md5, trust and cert clients, or an upstream secret of another salt); UpstreamPasswords per user wins.
	UpstreamPassword  string            `yaml:"upstream_password"`
	UpstreamPasswords map[string]string `yaml:"upstream_passwords"`
	// MockKeyFile holds the key (at least MinMockKey random bytes) that unknown users' mock secrets derive from,
	// read at start: kept across restarts and shared by proxies that read the same file, as PostgreSQL keeps its
	// mock nonce in pg_control. Without it a key is drawn at each start.
	MockKeyFile string `yaml:"mock_key_file"`
}

// MinMockKey is the fewest bytes auth.mock_key_file may hold.
const MinMockKey = 32

// Values of Auth.Type.
const (
	AuthPassthrough = "passthrough"
	AuthSCRAM       = "scram-sha-256"
	AuthMD5         = "md5"
	AuthTrust       = "trust"
	AuthCert        = "cert"
	DefaultAuthDB   = "postgres"
)

// ByProxy reports whether the proxy authenticates clients itself.
func (a Auth) ByProxy() bool { return a.Type != AuthPassthrough }

// UpstreamPasswordFor is the configured upstream password of user, or "".
func (a Auth) UpstreamPasswordFor(user string) string {
	if p, ok := a.UpstreamPasswords[user]; ok {
		return p
	}
	return a.UpstreamPassword
}

func (a *Auth) applyDefaults() {
	if a.Type == "" {
		a.Type = AuthPassthrough
	}
	if a.Query != "" && a.Database == "" {
		a.Database = DefaultAuthDB
	}
}

func (a *Auth) validate(tls ServerTLS, add func(key, format string, args ...any)) {
	switch a.Type {
	case AuthPassthrough:
		if a.File != "" || a.Query != "" || a.UpstreamPassword != "" || len(a.UpstreamPasswords) > 0 {
			add("auth.type", "passthrough relays authentication to PostgreSQL: auth.file, auth.query and upstream passwords need scram-sha-256, md5, trust or cert")
		}
	case AuthSCRAM, AuthMD5:
		if a.File == "" && a.Query == "" {
			add("auth", "type %s needs auth.file or auth.query to find the users' secrets", a.Type)
		}
	case AuthTrust:
	case AuthCert:
		if !tls.Enabled() || tls.ClientCAFile == "" {
			add("auth.type", "cert needs tls.cert_file, tls.key_file and tls.client_ca_file (the CA of the client certificates)")
		}
	default:
		add("auth.type", "must be passthrough, scram-sha-256, md5, trust or cert, not %q", a.Type)
	}
	if a.MockKeyFile != "" && a.Type != AuthSCRAM && a.Type != AuthMD5 {
		add("auth.mock_key_file", "only scram-sha-256 and md5 challenge unknown users, not %s", a.Type)
	}
	if a.Query != "" {
		if a.User == "" {
			add("auth.user", "required with auth.query: a dedicated role that may run the query's function, and nothing else")
		}
		if err := CheckAuthQuery(a.Query); err != nil {
			add("auth.query", "%v", err)
		}
	}
}

// CheckAuthQuery accepts an auth query only when every function it calls and every relation it reads is
// schema-qualified, and it takes the user name as the bound parameter $1 and nothing else: the name is never
// spliced into SQL, and nothing the query names can be shadowed by an object earlier in a search_path.
func CheckAuthQuery(sql string) error {
	tree, err := pg_query.ParseToJSON(sql)
	if err != nil {
		return fmt.Errorf("does not parse: %w", err)
	}
	var root struct {
		Stmts []struct {
			Stmt map[string]any `json:"stmt"`
		} `json:"stmts"`
	}
	if err := json.Unmarshal([]byte(tree), &root); err != nil {
		return fmt.Errorf("read its parse tree: %w", err)
	}
	if len(root.Stmts) != 1 || root.Stmts[0].Stmt["SelectStmt"] == nil {
		return fmt.Errorf("must be one SELECT")
	}
	var problem error
	funcs, params := 0, map[float64]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch n := v.(type) {
		case map[string]any:
			for k, child := range n {
				m, _ := child.(map[string]any)
				switch k {
				case "FuncCall":
					funcs++
					if names, _ := m["funcname"].([]any); len(names) != 2 && problem == nil {
						problem = fmt.Errorf("calls a function without its schema (write schema.function)")
					}
				case "RangeVar":
					if s, _ := m["schemaname"].(string); s == "" && problem == nil {
						problem = fmt.Errorf("reads %v without its schema (write schema.relation)", m["relname"])
					}
				case "ParamRef":
					num, _ := m["number"].(float64)
					params[num] = true
				}
				walk(child)
			}
		case []any:
			for _, c := range n {
				walk(c)
			}
		}
	}
	walk(root.Stmts[0].Stmt)
	switch {
	case funcs == 0:
		// First: pgbouncer's own auth_query (SELECT ... FROM pg_shadow ...) would otherwise be told to qualify
		// the relation, and then this.
		return fmt.Errorf("must call a schema-qualified function that returns the user's secret, as a role allowed nothing else (docs/auth.md has one to create)")
	case problem != nil:
		return problem
	case len(params) != 1 || !params[1]:
		return fmt.Errorf("must take the user name as $1, its only parameter")
	}
	return nil
}

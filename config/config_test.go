package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestParseFullExample(t *testing.T) {
	cfg, err := Parse("fenceproxy.yaml", []byte(`
listen: 127.0.0.1:7000
upstream:
  address: db.internal:5432
  connect_timeout: 3s
  tls:
    mode: verify-full
    ca_file: /etc/ssl/ca.pem
tables:
  - name: public.accounts
    token_column: fence_token
  - name: ledger
    token_column: fence_token
token:
  setting: app.fence_token
  offset: 1000
  verify:
    etcd:
      endpoints: [127.0.0.1:2379]
metrics:
  listen: 127.0.0.1:9187
limits:
  max_client_connections: 50
  startup_timeout: 5s
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:7000" || cfg.Upstream.Address != "db.internal:5432" || cfg.Upstream.ConnectTimeout != 3*time.Second {
		t.Errorf("listen/upstream: %+v", cfg)
	}
	if got := cfg.Tables[0]; got.Schema != "public" || got.Relation != "accounts" || got.TokenColumn != "fence_token" {
		t.Errorf("qualified table: %+v", got)
	}
	if got := cfg.Tables[1]; got.Schema != "" || got.Relation != "ledger" {
		t.Errorf("bare table: %+v", got)
	}
	if cfg.Token.Setting != "app.fence_token" || cfg.Token.Offset != 1000 || len(cfg.Token.Verify.Etcd.Endpoints) != 1 {
		t.Errorf("token: %+v", cfg.Token)
	}
	if cfg.Limits.MaxClientConnections != 50 || cfg.Limits.StartupTimeout != 5*time.Second || cfg.Limits.MaxMessageSize != DefaultMaxMessageSize {
		t.Errorf("limits: %+v", cfg.Limits)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := Parse("c.yaml", []byte("upstream:\n  address: 127.0.0.1:5432\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != DefaultListen || cfg.Token.Setting != "fence.token" || cfg.Upstream.TLS.Mode != "disable" || cfg.Metrics.Listen != "" {
		t.Errorf("defaults not applied: %+v", cfg)
	}
	if r := cfg.Upstream.Reuse; r.Idle() != DefaultReuseMaxIdle || r.IdleTimeout != DefaultReuseIdleTimeout || r.MaxLifetime != DefaultReuseMaxLifetime {
		t.Errorf("upstream.reuse defaults not applied: max_idle %d, %+v", r.Idle(), r)
	}
}

func TestRelaySettings(t *testing.T) {
	cfg, err := Parse("c.yaml", []byte("upstream:\n  address: a:1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Relay; r.EventLoops != 0 || r.SpinFor() != DefaultRelaySpin {
		t.Errorf("relay defaults: event_loops %d, spin %v; want 0 (one per two CPUs) and %v", r.EventLoops, r.SpinFor(), DefaultRelaySpin)
	}
	cfg, err = Parse("c.yaml", []byte("upstream:\n  address: a:1\nrelay:\n  event_loops: 3\n  spin: 0s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Relay; r.EventLoops != 3 || r.SpinFor() != 0 {
		t.Errorf("relay: event_loops %d, spin %v; want 3 and 0 (off)", r.EventLoops, r.SpinFor())
	}
}

func TestReuseSettings(t *testing.T) {
	cfg, err := Parse("c.yaml", []byte("upstream:\n  address: a:1\n  reuse:\n    max_idle: 0\n    idle_timeout: 5s\n    max_lifetime: 10m\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Upstream.Reuse; r.Idle() != 0 || r.IdleTimeout != 5*time.Second || r.MaxLifetime != 10*time.Minute {
		t.Errorf("max_idle: 0 must turn reuse off and keep the other values: max_idle %d, %+v", r.Idle(), r)
	}
}

// upstream.hosts: the router's defaults, and Address is the first host (for what reads only the catalog).
func TestHostsSettings(t *testing.T) {
	cfg, err := Parse("c.yaml", []byte("upstream:\n  hosts: [a:1, b:2]\n"))
	if err != nil {
		t.Fatal(err)
	}
	u := cfg.Upstream
	if !u.Routed() || u.Address != "a:1" || len(u.HostList()) != 2 || u.Target != TargetReadWrite ||
		u.HealthInterval != DefaultHealthInterval || u.Health.User != DefaultHealthUser || u.Barrier.Etcd.Prefix != DefaultLocksEtcdPrefix {
		t.Errorf("hosts defaults: %+v", u)
	}
	cfg, err = Parse("c.yaml", []byte("upstream:\n  address: a:1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Upstream.Routed() || len(cfg.Upstream.HostList()) != 1 {
		t.Errorf("one address is not routed: %+v", cfg.Upstream)
	}
}

func TestPoolSettings(t *testing.T) {
	cfg, err := Parse("c.yaml", []byte("upstream:\n  address: a:1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Pool; p.Transaction() || p.Size != DefaultPoolSize || p.MaxClientWait != DefaultPoolMaxClientWait || p.OnSessionState != PoolPin ||
		p.ServerLifetime != DefaultPoolServerLifetime || p.ServerIdleTimeout != DefaultPoolServerIdleTimeout {
		t.Errorf("pool defaults: %+v, auth %+v", p, cfg.Auth)
	}
	cfg, err = Parse("c.yaml", []byte("upstream:\n  address: a:1\npool:\n  mode: transaction\n  size: 3\n  max_client_wait: 2s\n  on_session_state: refuse\nauth:\n  type: trust\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Pool; !p.Transaction() || p.Size != 3 || p.MaxClientWait != 2*time.Second || p.OnSessionState != PoolRefuse {
		t.Errorf("pool settings: %+v", p)
	}
}

// pool.min_idle and pool.max_clients: read, and every problem with them reported together.
func TestPoolLimits(t *testing.T) {
	cfg, err := Parse("c.yaml", []byte("upstream:\n  address: a:1\npool:\n  mode: transaction\n  size: 3\n  min_idle: 2\n  max_clients: 500\nauth:\n  type: trust\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Pool; p.MinIdle != 2 || p.MaxClients != 500 {
		t.Errorf("pool limits: %+v", p)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"pool:\n  mode: transaction\n  size: 3\n  min_idle: 4\n  max_clients: 2000\nauth:\n  type: trust\n",
			"c.yaml:6: pool.min_idle: must not exceed pool.size (3)\nc.yaml:7: pool.max_clients: must not exceed limits.max_client_connections (1000), which bounds every client connection"},
		{"pool:\n  min_idle: -1\n  max_clients: -1\n", "c.yaml:4: pool.min_idle: must not be negative\nc.yaml:5: pool.max_clients: must not be negative"},
		{"pool:\n  min_idle: 1\n  max_clients: 10\n", "c.yaml:4: pool.min_idle: needs pool.mode transaction (session mode keeps no pools)\nc.yaml:5: pool.max_clients: needs pool.mode transaction (limits.max_client_connections bounds session mode's clients)"},
		{"pool:\n  admin_users: [admin]\n", "c.yaml:4: pool.admin_users: needs pool.mode transaction: the admin console serves the pools (in session mode a connection to the database fenceproxy goes to PostgreSQL)"},
	} {
		_, err := Parse("c.yaml", []byte("upstream:\n  address: a:1\n"+tc.yaml))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q:\ngot:\n%v\nwant:\n%s", tc.yaml, err, tc.want)
		}
	}
}

func TestErrorsNameFileLineAndKey(t *testing.T) {
	cases := []struct{ name, yaml, want string }{
		{"unknown top-level key", "upstream:\n  address: a:1\ntabels: []\n", `c.yaml:3: tabels: unknown key; did you mean "tables"?`},
		{"unknown nested key", "upstream:\n  address: a:1\n  adress: b:2\n", `c.yaml:3: upstream.adress: unknown key`},
		{"unknown key in a table", "upstream:\n  address: a:1\ntables:\n  - name: t\n    token_column: c\n    colour: red\n", `c.yaml:6: tables[0].colour: unknown key`},
		{"missing upstream", "listen: 127.0.0.1:1\n", `c.yaml:1: upstream.address: required`},
		{"missing upstream.address", "upstream:\n  connect_timeout: 1s\n", `c.yaml:1: upstream.address: required`},
		{"duration without a unit", "upstream:\n  address: a:1\n  connect_timeout: 10\n", "c.yaml:3: upstream.connect_timeout: cannot unmarshal !!int 10 into time.Duration (write a duration with its unit"},
		{"bad indentation", "upstream:\n  address: 127.0.0.1:5432\n tables:\n  - name: a\n", "c.yaml:2: did not find expected key (YAML syntax, at or just after this line: check the indentation"},
		{"bad indentation in a list", "upstream:\n  address: a:1\ntables:\n  - name: a\n   token_column: x\n", "c.yaml:3: did not find expected '-' indicator"},
		{"tab indentation", "upstream:\n\taddress: a:1\n", "c.yaml:2: found character that cannot start any token (YAML syntax, at or just after this line: check the indentation; use spaces, not tabs)"},
		{"missing token column", "upstream:\n  address: a:1\ntables:\n  - name: t\n", `c.yaml:4: tables[0].token_column: required`},
		{"bad tls mode", "upstream:\n  address: a:1\n  tls:\n    mode: maybe\n", `c.yaml:4: upstream.tls.mode: must be disable, require or verify-full`},
		{"bad duration", "upstream:\n  address: a:1\n  connect_timeout: soon\n", "c.yaml:3: upstream.connect_timeout: cannot unmarshal !!str soon into time.Duration"},
		{"bad listen", "listen: nowhere\nupstream:\n  address: a:1\n", `c.yaml:1: listen: "nowhere" is not host:port`},
		{"upper-case table", "upstream:\n  address: a:1\ntables:\n  - name: Accounts\n    token_column: c\n", `c.yaml:4: tables[0].name: "Accounts" is not a table name`},
		{"duplicate table", "upstream:\n  address: a:1\ntables:\n  - name: t\n    token_column: c\n  - name: t\n    token_column: c\n", `tables[1].name: table "t" listed twice`},
		{"bad setting", "upstream:\n  address: a:1\ntoken:\n  setting: token\n", `c.yaml:4: token.setting`},
		{"verify-full without CA", "upstream:\n  address: a:1\n  tls:\n    mode: verify-full\n", `upstream.tls.ca_file: required`},
		{"wrong shape", "upstream: 5\n", `c.yaml:1: upstream: expected a mapping`},
		{"not yaml", "upstream: [\n", `c.yaml:1: did not find expected node content`},
		{"negative max_idle", "upstream:\n  address: a:1\n  reuse:\n    max_idle: -1\n", `c.yaml:4: upstream.reuse.max_idle: must be 0 (off) or more`},
		{"negative idle_timeout", "upstream:\n  address: a:1\n  reuse:\n    idle_timeout: -1s\n", `c.yaml:4: upstream.reuse.idle_timeout: must be positive`},
		{"negative event_loops", "upstream:\n  address: a:1\nrelay:\n  event_loops: -1\n", `c.yaml:4: relay.event_loops: must be 0 (one per two CPUs) to 256`},
		{"spin too long", "upstream:\n  address: a:1\nrelay:\n  spin: 2s\n", `c.yaml:4: relay.spin: must be 0 (off) to 1ms`},
		{"spin not a duration", "upstream:\n  address: a:1\nrelay:\n  spin: fast\n", "c.yaml:4: relay.spin: cannot unmarshal !!str fast into time.Duration"},
		{"unknown reuse key", "upstream:\n  address: a:1\n  reuse:\n    pool_size: 3\n", `c.yaml:4: upstream.reuse.pool_size: unknown key`},
		{"hosts and address", "upstream:\n  address: a:1\n  hosts: [b:1]\n", `c.yaml:3: upstream.hosts: give upstream.address (one server) or upstream.hosts`},
		{"host without port", "upstream:\n  hosts: [a:1, b]\n", `c.yaml:2: upstream.hosts[1]: "b" is not host:port`},
		{"host twice", "upstream:\n  hosts: [a:1, a:1]\n", `c.yaml:2: upstream.hosts[1]: a:1 is listed twice`},
		{"bad target", "upstream:\n  hosts: [a:1]\n  target: primary\n", `c.yaml:3: upstream.target: must be read-write, any, prefer-standby or read-only, not "primary"`},
		{"bad synchronous_commit", "upstream:\n  address: a:1\nfence:\n  synchronous_commit: always\n", `c.yaml:4: fence.synchronous_commit: must be remote_apply, on, remote_write, local or off, not "always"`},
		{"bad pool mode", "upstream:\n  address: a:1\npool:\n  mode: statement\n", `c.yaml:4: pool.mode: must be session or transaction, not "statement"`},
		{"bad on_session_state", "upstream:\n  address: a:1\npool:\n  on_session_state: ignore\n", `c.yaml:4: pool.on_session_state: must be pin or refuse`},
		{"transaction pooling with passthrough auth", "upstream:\n  address: a:1\npool:\n  mode: transaction\n", `c.yaml:4: pool.mode: transaction needs auth.type`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("c.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("no error for %q", tc.yaml)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			// Every line of every error has the one form: FILE:LINE: then the key and the problem.
			for _, line := range strings.Split(err.Error(), "\n") {
				if !errorForm.MatchString(line) || strings.Contains(line, "  ") || strings.Contains(line, "line ") {
					t.Errorf("error line %q is not FILE:LINE: KEY: PROBLEM", line)
				}
			}
		})
	}
}

// errorForm is FILE:LINE: then a key and a problem, or a YAML syntax problem.
var errorForm = regexp.MustCompile(`^c\.yaml:[1-9][0-9]*: ([a-z_.\[\]0-9]+: \S|[a-z])`)

// Several problems are reported together, each on its own line in the same form.
func TestSeveralErrorsEachWithFileLineAndKey(t *testing.T) {
	_, err := Parse("c.yaml", []byte("listen: nowhere\nupstream:\n  connect_timeout: 10\n  reuse:\n    idle_timeout: 5\n"))
	if err == nil {
		t.Fatal("no error")
	}
	want := []string{
		`c.yaml:1: listen: "nowhere" is not host:port`,
		`c.yaml:2: upstream.address: required (host:port of the PostgreSQL server)`,
		"c.yaml:3: upstream.connect_timeout: cannot unmarshal !!int 10 into time.Duration (write a duration with its unit: 10s, 500ms, 1m)",
		"c.yaml:5: upstream.reuse.idle_timeout: cannot unmarshal !!int 5 into time.Duration (write a duration with its unit: 10s, 500ms, 1m)",
	}
	if got := strings.Split(err.Error(), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s", err, strings.Join(want, "\n"))
	}
	_, err = Parse("c.yaml", []byte("listen: nowhere\nupstream:\n  connect_timeout: 1s\n"))
	want = []string{`c.yaml:1: listen: "nowhere" is not host:port`, `c.yaml:2: upstream.address: required (host:port of the PostgreSQL server)`}
	if err == nil || err.Error() != strings.Join(want, "\n") {
		t.Errorf("got:\n%v\nwant:\n%s", err, strings.Join(want, "\n"))
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(path, []byte("upstream:\n  address: a:1\nbogus: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path+":3: bogus: unknown key") {
		t.Fatalf("got %v", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}
}

func TestTokenScopeLockAndTokenColumnWrites(t *testing.T) {
	cfg, err := Parse("c.yaml", []byte("upstream:\n  address: 127.0.0.1:5432\ntables:\n  - name: a\n    token_column: t\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Token.Scope != TokenScopeSession || cfg.Token.LockSetting != DefaultLockSetting ||
		cfg.Tables[0].TokenColumnWrites != TokenColumnOverride || cfg.Tables[0].RequireLock {
		t.Errorf("defaults: token %+v, table %+v", cfg.Token, cfg.Tables[0])
	}
	cfg, err = Parse("c.yaml", []byte("upstream:\n  address: 127.0.0.1:5432\ntoken:\n  scope: transaction\n  lock_setting: app.lock\ntables:\n  - name: a\n    token_column: t\n    require_lock: true\n    token_column_writes: refuse\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Token.Scope != TokenScopeTransaction || cfg.Token.LockSetting != "app.lock" ||
		cfg.Tables[0].TokenColumnWrites != TokenColumnRefuse || !cfg.Tables[0].RequireLock {
		t.Errorf("set: token %+v, table %+v", cfg.Token, cfg.Tables[0])
	}
	for _, bad := range []struct{ yaml, want string }{
		{"token:\n  scope: statement\n", `c.yaml:4: token.scope: must be session or transaction, not "statement"`},
		{"token:\n  lock_setting: lock\n", `c.yaml:4: token.lock_setting: "lock" is not a custom setting name`},
		{"token:\n  lock_setting: fence.token\n", `c.yaml:4: token.lock_setting: must differ from token.setting`},
		{"tables:\n  - name: a\n    token_column: t\n    token_column_writes: ignore\n", `c.yaml:6: tables[0].token_column_writes: must be override or refuse, not "ignore"`},
	} {
		_, err := Parse("c.yaml", []byte("upstream:\n  address: 127.0.0.1:5432\n"+bad.yaml))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: got %v, want %q", bad.yaml, err, bad.want)
		}
	}
}

func TestRelayMode(t *testing.T) {
	cfg, err := Parse("c.yaml", []byte("upstream:\n  address: 127.0.0.1:5432\n"))
	if err != nil || cfg.Relay.Mode != RelayModeLoop {
		t.Fatalf("default relay.mode: %v %v", cfg.Relay.Mode, err)
	}
	cfg, err = Parse("c.yaml", []byte("upstream:\n  address: 127.0.0.1:5432\nrelay:\n  mode: goroutines\n"))
	if err != nil || cfg.Relay.Mode != RelayModeGoroutines {
		t.Fatalf("relay.mode goroutines: %v %v", cfg.Relay.Mode, err)
	}
	_, err = Parse("c.yaml", []byte("upstream:\n  address: 127.0.0.1:5432\nrelay:\n  mode: threads\n"))
	if err == nil || !strings.Contains(err.Error(), `c.yaml:4: relay.mode: must be loop or goroutines, not "threads"`) {
		t.Fatalf("bad relay.mode: %v", err)
	}
}

func TestLogConnections(t *testing.T) {
	cfg, err := Parse("c.yaml", []byte("upstream:\n  address: a:1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Log.Connections != "info" {
		t.Errorf("log.connections default %q, want info", cfg.Log.Connections)
	}
	for _, v := range []string{"debug", "info", "off"} {
		cfg, err := Parse("c.yaml", []byte("upstream:\n  address: a:1\nlog:\n  connections: "+v+"\n"))
		if err != nil || cfg.Log.Connections != v {
			t.Errorf("log.connections: %s: %v %+v", v, err, cfg)
		}
	}
	// YAML reads a bare off as the string "off" (YAML 1.2), and "warn" is not a choice: a typo must not pass.
	_, err = Parse("c.yaml", []byte("upstream:\n  address: a:1\nlog:\n  connections: warn\n"))
	if err == nil || !strings.Contains(err.Error(), `c.yaml:4: log.connections: must be debug, info or off, not "warn"`) {
		t.Errorf("log.connections: warn: %v", err)
	}
}

func TestZooKeeperVerification(t *testing.T) {
	cfg, err := Parse("c.yaml", []byte("upstream:\n  address: 127.0.0.1:5432\ntoken:\n  verify:\n    zookeeper:\n      servers: [127.0.0.1:2181]\n"))
	if err != nil || len(cfg.Token.Verify.ZooKeeper.Servers) != 1 || cfg.Token.Verify.ZooKeeper.Timeout != DefaultVerifyTimeout {
		t.Fatalf("zookeeper verification: %+v %v", cfg.Token.Verify, err)
	}
	_, err = Parse("c.yaml", []byte("upstream:\n  address: 127.0.0.1:5432\ntoken:\n  verify:\n    etcd:\n      endpoints: [127.0.0.1:2379]\n    zookeeper:\n      servers: [127.0.0.1:2181]\n"))
	if err == nil || !strings.Contains(err.Error(), "c.yaml:7: token.verify.zookeeper: tokens come from one lock service") {
		t.Fatalf("both verifiers: %v", err)
	}
}

// The four mistakes (a misspelt key, a duration without a unit, a misspelt key in a table, a bad level)
// are four lines in one pass, each FILE:LINE: KEY: PROBLEM; a misspelling that leaves a required key missing
// names it on its own line, not on a fifth.
func TestEveryProblemInOnePass(t *testing.T) {
	_, err := Parse("c.yaml", []byte(`upstream:
  adress: 127.0.0.1:5432
  connect_timeout: 10
tables:
  - name: public.accounts
    token_colum: fence_token
log:
  level: verbose
`))
	want := []string{
		`c.yaml:2: upstream.adress: unknown key; did you mean "address"? (so upstream.address is missing: required (host:port of the PostgreSQL server))`,
		"c.yaml:3: upstream.connect_timeout: cannot unmarshal !!int 10 into time.Duration (write a duration with its unit: 10s, 500ms, 1m)",
		`c.yaml:6: tables[0].token_colum: unknown key; did you mean "token_column"? (so tables[0].token_column is missing: required)`,
		`c.yaml:8: log.level: must be debug, info, warn or error, not "verbose"`,
	}
	if err == nil || err.Error() != strings.Join(want, "\n") {
		t.Errorf("got:\n%v\nwant:\n%s", err, strings.Join(want, "\n"))
	}

	// A misspelt section: the suggestion, and the required key under it that is therefore missing.
	_, err = Parse("c.yaml", []byte("upstrem:\n  address: a:1\n"))
	if want := `c.yaml:1: upstrem: unknown key; did you mean "upstream"? (so upstream.address is missing: required (host:port of the PostgreSQL server))`; err == nil || err.Error() != want {
		t.Errorf("got:\n%v\nwant:\n%s", err, want)
	}

	// A required key missing with no misspelling to explain it is a line of its own; a key far from every
	// known one gets no suggestion.
	_, err = Parse("c.yaml", []byte("listen: 127.0.0.1:1\nwhatever: 1\n"))
	want = []string{`c.yaml:1: upstream.address: required (host:port of the PostgreSQL server)`, `c.yaml:2: whatever: unknown key`}
	if err == nil || err.Error() != strings.Join(want, "\n") {
		t.Errorf("got:\n%v\nwant:\n%s", err, strings.Join(want, "\n"))
	}

	// A section of the wrong shape is one problem, not one more for every required key inside it.
	_, err = Parse("c.yaml", []byte("upstream: 5\n"))
	if want := `c.yaml:1: upstream: expected a mapping`; err == nil || err.Error() != want {
		t.Errorf("got:\n%v\nwant:\n%s", err, want)
	}
}

// Suggestions come from the Go type, not from a list of keys: every struct of Config gets them.
func TestSuggestionsForEveryStruct(t *testing.T) {
	for yaml, want := range map[string]string{
		"upstream:\n  address: a:1\n  reuse:\n    max_idel: 1\n":       `c.yaml:4: upstream.reuse.max_idel: unknown key; did you mean "max_idle"?`,
		"upstream:\n  address: a:1\nrelay:\n  event_lops: 1\n":         `c.yaml:4: relay.event_lops: unknown key; did you mean "event_loops"?`,
		"upstream:\n  address: a:1\nlocks:\n  postgers: {dsn: x}\n":    `c.yaml:4: locks.postgers: unknown key; did you mean "postgres"?`,
		"upstream:\n  address: a:1\nMetrics:\n  listen: 127.0.0.1:1\n": `c.yaml:3: Metrics: unknown key; did you mean "metrics"?`,
		"upstream:\n  address: a:1\ntoken:\n  verify:\n    etdc: {}\n": `c.yaml:5: token.verify.etdc: unknown key; did you mean "etcd"?`,
		"upstream:\n  address: a:1\n  address: b:2\n":                  `c.yaml:3: upstream.address: duplicate key (first at line 2)`,
	} {
		_, err := Parse("c.yaml", []byte(yaml))
		if err == nil || err.Error() != want {
			t.Errorf("%q: got %v, want %s", yaml, err, want)
		}
	}
}

func TestEditDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"adress", "address", 1}, {"tabels", "tables", 1}, {"usr", "user", 1}, {"abc", "xyz", 3}, {"token_colum", "token_column", 1}} {
		if got := editDistance(c.a, c.b); got != c.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

// upstream.barrier: ZooKeeper and Redis as the barrier's lock service, and never two services at once.
func TestBarrierSources(t *testing.T) {
	cfg, err := Parse("c.yaml", []byte("upstream:\n  hosts: [a:1, b:2]\n  barrier:\n    zookeeper:\n      servers: [127.0.0.1:2181]\n      root: /locks\n"))
	if err != nil || cfg.Upstream.Barrier.ZooKeeper.Root != "/locks" || len(cfg.Upstream.Barrier.Sources()) != 1 {
		t.Fatalf("barrier zookeeper: %+v %v", cfg.Upstream.Barrier, err)
	}
	cfg, err = Parse("c.yaml", []byte("upstream:\n  hosts: [a:1, b:2]\n  barrier:\n    redis:\n      address: 127.0.0.1:6379\n"))
	if err != nil || cfg.Upstream.Barrier.Redis.Address != "127.0.0.1:6379" || len(cfg.Upstream.Barrier.Sources()) != 1 {
		t.Fatalf("barrier redis: %+v %v", cfg.Upstream.Barrier, err)
	}
	_, err = Parse("c.yaml", []byte("upstream:\n  hosts: [a:1, b:2]\n  barrier:\n    etcd:\n      endpoints: [127.0.0.1:2379]\n    redis:\n      address: 127.0.0.1:6379\n"))
	if err == nil || !strings.Contains(err.Error(), "c.yaml:6: upstream.barrier.redis: the barrier reads one lock service") {
		t.Errorf("etcd and redis: %v", err)
	}
	_, err = Parse("c.yaml", []byte("upstream:\n  hosts: [a:1, b:2]\n  barrier:\n    zookeeper:\n      servers: [127.0.0.1:2181]\n    redis:\n      address: 127.0.0.1:6379\n"))
	if err == nil || !strings.Contains(err.Error(), "c.yaml:6: upstream.barrier.redis: the barrier reads one lock service") {
		t.Errorf("zookeeper and redis: %v", err)
	}
	_, err = Parse("c.yaml", []byte("upstream:\n  hosts: [a:1, b:2]\n  barrier:\n    redis:\n      address: nowhere\n"))
	if err == nil || !strings.Contains(err.Error(), "c.yaml:5: upstream.barrier.redis.address:") {
		t.Errorf("redis address without a port: %v", err)
	}
	_, err = Parse("c.yaml", []byte("upstream:\n  hosts: [a:1, b:2]\n  barrier:\n    zookeeper:\n      servers: [\" \"]\n"))
	if err == nil || !strings.Contains(err.Error(), "upstream.barrier.zookeeper.servers[0]: empty server") {
		t.Errorf("empty zookeeper server: %v", err)
	}
}

// TestPreparedFencesDefault: prepared fences are on by default in session mode, off with token.scope transaction
// and with the proxy's own transaction pooling (where they measured no faster), and an explicit value wins.
func TestPreparedFencesDefault(t *testing.T) {
	eight := 8
	for _, tc := range []struct {
		name     string
		u        Upstream
		scope    string
		pooled   bool
		prepared int
	}{
		{"session mode", Upstream{}, TokenScopeSession, false, DefaultPreparedFences},
		{"token.scope transaction", Upstream{}, TokenScopeTransaction, false, 0},
		{"pool.mode transaction", Upstream{}, TokenScopeSession, true, 0},
		{"pool.mode transaction, set", Upstream{PreparedFences: &eight}, TokenScopeSession, true, 8},
	} {
		if got := tc.u.Prepared(tc.scope, tc.pooled); got != tc.prepared {
			t.Errorf("%s: %d prepared fences, want %d", tc.name, got, tc.prepared)
		}
	}
}

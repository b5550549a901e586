// Package config loads and validates fenceproxy's YAML configuration.
//
// Every problem is reported with the file, the line and the dotted key it concerns, because the configuration is
// the one thing an operator edits by hand at three in the morning. Unknown keys are errors, not warnings: a
// misspelled "tabels:" must not silently leave every table unprotected.
package config

import (
	"fmt"
	"net"
	"os"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fenceproxy/fenceproxy/setting"
)

// Config is the whole configuration of a fenceproxy process. The zero value is not usable: use Load or Parse,
// which apply defaults and validate.
type Config struct {
	Listen   string    `yaml:"listen"`
	Upstream Upstream  `yaml:"upstream"`
	TLS      ServerTLS `yaml:"tls"`
	Tables   []Table   `yaml:"tables"`
	Token    Token     `yaml:"token"`
	Metrics  Metrics   `yaml:"metrics"`
	Limits   Limits    `yaml:"limits"`
	Relay    Relay     `yaml:"relay"`
	Log      Log       `yaml:"log"`
	// Catalog, when set, makes the proxy read PostgreSQL's catalog (partitions, inheritance, views, foreign keys)
	// over its own connection and protect what is related to the configured tables (docs/catalog.md).
	Catalog *Catalog `yaml:"catalog"`
	Auth    Auth     `yaml:"auth"`
	Locks   Locks    `yaml:"locks"`
	Fence   Fence    `yaml:"fence"`
	Pool    Pool     `yaml:"pool"`

	// File is the path the configuration was read from ("" when parsed from memory).
	File string `yaml:"-"`
}

// Upstream is the PostgreSQL server every session is relayed to, or the servers of a primary and its standbys
// (Hosts), among which the proxy follows the primary (docs/ha.md).
type Upstream struct {
	Address string `yaml:"address"`
	// Hosts are the servers of one replicated cluster, host:port each (instead of Address, which is then the
	// first of them, for what reads only the catalog). Sessions go to the one Target asks for.
	Hosts []string `yaml:"hosts"`
	// Target is which host a session goes to, as libpq's target_session_attrs: TargetReadWrite (default),
	// TargetAny, TargetPreferStandby or TargetReadOnly.
	Target string `yaml:"target"`
	// HealthInterval is how often each of Hosts is checked (its role, and on the primary the lock marks); the
	// default is DefaultHealthInterval.
	HealthInterval time.Duration `yaml:"health_interval"`
	// HealthTimeout bounds one check (connecting included); a host that does not answer in time is down.
	HealthTimeout time.Duration `yaml:"health_timeout"`
	// Health is the role the checks and the failover barrier connect as (one connection per host). The
	// barrier raises lock marks, so it must own the fenceproxy schema (the role that ran install) or be a
	// superuser.
	Health HealthLogin `yaml:"health"`
	// Barrier is the lock service the failover barrier asks for the newest token granted per lock.
	Barrier        Barrier       `yaml:"barrier"`
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	TLS            UpstreamTLS   `yaml:"tls"`
	Reuse          Reuse         `yaml:"reuse"`
	// PreparedFences is how many fenced statement shapes the proxy keeps prepared on each upstream connection
	// (PREPARE once, then EXECUTE with each statement's constants: the server skips parsing and planning the
	// fence). 0 turns it off. The default is DefaultPreparedFences, or 0 with token.scope transaction: behind a
	// transaction pooler a later statement may reach a server connection that never saw the PREPARE. With
	// pool.mode transaction the proxy is that pooler and each server connection of a pool keeps its own; the
	// default is 0 there too, since they measured no faster (docs/benchmark.md, seventh pass).
	PreparedFences *int `yaml:"prepared_fences"`
}

// HostList is the servers sessions may go to: Hosts, or Address alone.
func (u Upstream) HostList() []string {
	if len(u.Hosts) > 0 {
		return u.Hosts
	}
	return []string{u.Address}
}

// Routed reports whether the proxy follows a primary among several hosts (upstream.hosts), with health checks
// and the failover barrier, rather than relaying to the one upstream.address.
func (u Upstream) Routed() bool { return len(u.Hosts) > 0 }

// Prepared is PreparedFences, or its default when it is not set: DefaultPreparedFences, or 0 with token.scope
// transaction or with the proxy's own transaction pooling (transactionPool).
func (u Upstream) Prepared(scope string, transactionPool bool) int {
	switch {
	case u.PreparedFences != nil:
		return *u.PreparedFences
	case scope == TokenScopeTransaction, transactionPool:
		return 0
	}
	return DefaultPreparedFences
}

// Fence tunes how fenced writes are committed.
type Fence struct {
	// SynchronousCommit is the synchronous_commit level the transaction of every fenced write runs with
	// (remote_apply, on, remote_write, local), transaction-locally; off (the default) leaves the server's.
	// With a synchronous standby, remote_apply or on means a fenced write the client saw committed survives a
	// failover (docs/ha.md).
	SynchronousCommit string `yaml:"synchronous_commit"`
}

// SynchronousCommitLevel is SynchronousCommit for the rewrite: "" when off.
func (f Fence) SynchronousCommitLevel() string {
	if f.SynchronousCommit == "off" {
		return ""
	}
	return f.SynchronousCommit
}

// Values of Upstream.Target, with libpq's target_session_attrs meaning.
const (
	TargetReadWrite     = "read-write"     // the primary: not in hot standby, default_transaction_read_only off
	TargetAny           = "any"            // the first host that is up, in the order of upstream.hosts
	TargetPreferStandby = "prefer-standby" // a standby if one is up, else any host
	TargetReadOnly      = "read-only"      // a standby, or a server with default_transaction_read_only on
)

// HealthLogin is the role the router's connections log in as.
type HealthLogin struct {
	User     string `yaml:"user"`
	Database string `yaml:"database"`
	// PasswordFile holds the password (trailing newline ignored), so that it need not be in the YAML.
	PasswordFile string `yaml:"password_file"`
}

// Barrier names the lock service whose grants the failover barrier reads: one of Etcd, ZooKeeper and Redis
// (tokens of different services are not comparable), or none.
type Barrier struct {
	Etcd      BarrierEtcd      `yaml:"etcd"`
	ZooKeeper BarrierZooKeeper `yaml:"zookeeper"`
	Redis     BarrierRedis     `yaml:"redis"`
}

// Sources names the lock services set, as their keys (upstream.barrier.etcd, ...).
func (b Barrier) Sources() []string {
	var set []string
	if len(b.Etcd.Endpoints) > 0 {
		set = append(set, "upstream.barrier.etcd")
	}
	if len(b.ZooKeeper.Servers) > 0 {
		set = append(set, "upstream.barrier.zookeeper")
	}
	if b.Redis.Address != "" {
		set = append(set, "upstream.barrier.redis")
	}
	return set
}

// BarrierZooKeeper is the ZooKeeper ensemble of `fenceproxy lock --zk`, whose locks live under Root.
type BarrierZooKeeper struct {
	Servers []string `yaml:"servers"`
	// Root is the parent path of the locks; default /fenceproxy/locks (fenceproxy lock --zk's).
	Root string `yaml:"root"`
}

// BarrierRedis is the Redis server (the primary) of `fenceproxy lock --redis`, whose keys start with Prefix.
type BarrierRedis struct {
	Address string `yaml:"address"`
	// Prefix is the prefix of the store's keys; default {fenceproxy}: (fenceproxy lock --redis's).
	Prefix string `yaml:"prefix"`
}

// BarrierEtcd is the etcd cluster of `fenceproxy lock --etcd`, whose locks live under Prefix.
type BarrierEtcd struct {
	Endpoints []string `yaml:"endpoints"`
	// Prefix is the key prefix of the locks; default /fenceproxy/locks/ (fenceproxy lock's).
	Prefix string `yaml:"prefix"`
}

// Reuse keeps upstream connections of finished sessions for later sessions with the same startup parameters,
// as pgbouncer's session pooling does, but only for connections whose authentication asked for no secret
// (trust, and the like): a client that must prove a password always authenticates against a fresh backend.
type Reuse struct {
	// MaxIdle is how many finished sessions' connections are kept at most; 0 turns reuse off. The default is
	// DefaultReuseMaxIdle.
	MaxIdle *int `yaml:"max_idle"`
	// IdleTimeout closes a kept connection nobody took for this long.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxLifetime closes a connection this old when its session ends instead of keeping it.
	MaxLifetime time.Duration `yaml:"max_lifetime"`
}

// Idle is MaxIdle, or DefaultReuseMaxIdle when it is not set.
func (r Reuse) Idle() int {
	if r.MaxIdle == nil {
		return DefaultReuseMaxIdle
	}
	return *r.MaxIdle
}

// UpstreamTLS says how the proxy talks TLS to PostgreSQL.
type UpstreamTLS struct {
	// Mode is disable, require (encrypt, do not verify) or verify-full (verify the chain against CAFile and the
	// host name against ServerName or the upstream host).
	Mode       string `yaml:"mode"`
	CAFile     string `yaml:"ca_file"`
	ServerName string `yaml:"server_name"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
}

// ServerTLS is the certificate the proxy presents to clients that send SSLRequest. Without it, the proxy answers
// SSLRequest with 'N' and clients that require TLS refuse to connect.
type ServerTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile makes the proxy ask clients for a certificate signed by these CAs (auth.type cert).
	ClientCAFile string `yaml:"client_ca_file"`
}

// Enabled reports whether client-side TLS is configured.
func (t ServerTLS) Enabled() bool { return t.CertFile != "" }

// Table is a protected table and the bigint column that holds the token of its last writer.
type Table struct {
	Name        string `yaml:"name"`
	TokenColumn string `yaml:"token_column"`
	// RequireLock makes fence.lock (Token.LockSetting) mandatory for writes to the table: 55F02 without it.
	RequireLock bool `yaml:"require_lock"`
	// TokenColumnWrites says what happens to a write that names the token column (as ORMs that map every
	// column do): TokenColumnOverride (default) fences it and writes the session's token whatever value was
	// supplied; TokenColumnRefuse refuses it with 55F04.
	TokenColumnWrites string `yaml:"token_column_writes"`

	// Schema and Relation are Name split at the dot; Schema is "" for a bare name, which protects that name in
	// every schema.
	Schema   string `yaml:"-"`
	Relation string `yaml:"-"`
}

// Token configures how the session's token is found and checked.
type Token struct {
	// Setting is the PostgreSQL setting that carries the session's token.
	Setting string `yaml:"setting"`
	// Scope is TokenScopeSession (default) or TokenScopeTransaction: behind a transaction pooler, session-level
	// tokens (SET without LOCAL, set_config(..., false), startup options) are refused with 55F03, because they
	// would stay on the pooled connection for its next client.
	Scope string `yaml:"scope"`
	// LockSetting is the PostgreSQL setting that names the lock a session's token belongs to (lock fences).
	LockSetting string `yaml:"lock_setting"`
	// Offset is added to every etcd-issued token, by verification as by `fenceproxy lock`, to cure an etcd
	// restored from a snapshot with smaller revisions.
	Offset int64       `yaml:"offset"`
	Verify TokenVerify `yaml:"verify"`
}

// TokenVerify configures the forged-token defence.
type TokenVerify struct {
	Etcd      EtcdVerify `yaml:"etcd"`
	ZooKeeper ZKVerify   `yaml:"zookeeper"`
}

// ZKVerify refuses tokens higher than the ZooKeeper ensemble's current zxid (plus Token.Offset): the tokens of
// `fenceproxy lock --zk` are czxids.
type ZKVerify struct {
	Servers  []string      `yaml:"servers"`
	Timeout  time.Duration `yaml:"timeout"`
	FailOpen bool          `yaml:"fail_open"`
}

// EtcdVerify refuses tokens higher than the etcd cluster's current revision (plus Token.Offset).
type EtcdVerify struct {
	Endpoints []string      `yaml:"endpoints"`
	Timeout   time.Duration `yaml:"timeout"`
	// FailOpen lets tokens through unverified while etcd is unreachable. Off by default: fail closed.
	FailOpen bool `yaml:"fail_open"`
}

// Metrics configures the Prometheus endpoint; an empty Listen turns it off.
type Metrics struct {
	Listen string `yaml:"listen"`
	// Pprof serves Go's profiles (/debug/pprof/: CPU profiles and execution traces included) on Listen. Off by
	// default: the metrics address is one Prometheus must reach, and profiles are not for everyone who can.
	Pprof bool `yaml:"pprof"`
}

// Limits bound what one client, or all of them, can make the proxy spend.
type Limits struct {
	MaxClientConnections int           `yaml:"max_client_connections"`
	StartupTimeout       time.Duration `yaml:"startup_timeout"`
	MaxMessageSize       int           `yaml:"max_message_size"`
	ShutdownTimeout      time.Duration `yaml:"shutdown_timeout"`
	RewriteCacheSize     int           `yaml:"rewrite_cache_size"`
}

// Relay tunes the event loops that relay established plain-TCP sessions (Linux).
type Relay struct {
	// Mode is RelayModeLoop (default: plain-TCP sessions move to the epoll event loops after startup) or
	// RelayModeGoroutines (every session stays on two goroutines, one per direction).
	Mode string `yaml:"mode"`
	// EventLoops is how many epoll loops share the sessions, each on its own thread; 0 (the default) means one
	// per two CPUs the process may use (GOMAXPROCS/2, at least one).
	EventLoops int `yaml:"event_loops"`
	// Spin is how long a loop keeps polling its sockets before it goes to sleep, while polling takes no CPU
	// from anyone else (see docs/operating.md); 0 turns it off. The default is DefaultRelaySpin.
	Spin *time.Duration `yaml:"spin"`
}

// SpinFor is Spin, or DefaultRelaySpin when it is not set.
func (r Relay) SpinFor() time.Duration {
	if r.Spin == nil {
		return DefaultRelaySpin
	}
	return *r.Spin
}

// Log configures log/slog output.
type Log struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
	// Connections is the level of the per-connection lines (one when a session starts, one when it ends, with
	// the client, user, database, application_name, duration, bytes and outcome): debug, info, or off.
	Connections string `yaml:"connections"`
}

// Catalog is the catalog reader's own upstream connection. It needs only to connect and read pg_catalog, which
// every role may: a dedicated role with LOGIN and no other privilege is enough.
type Catalog struct {
	// DSN is a libpq connection string or URL; host and port default to upstream.address.
	DSN string `yaml:"dsn"`
	// User and Database override the DSN's.
	User     string `yaml:"user"`
	Database string `yaml:"database"`
	// PasswordFile holds the password (trailing newline ignored), so that it need not be in the YAML.
	PasswordFile string `yaml:"password_file"`
	// Refresh is how often the catalog is read again (besides at start and on SIGHUP). The default is
	// DefaultCatalogRefresh.
	Refresh time.Duration `yaml:"refresh"`
}

// Pool says how client sessions share upstream connections (docs/pooling.md).
type Pool struct {
	// Mode is PoolModeSession (default: each client session has an upstream connection of its own, as it always
	// had) or PoolModeTransaction: a client holds a server connection only for a transaction, and the clients of
	// one (database, user) share at most Size of them.
	Mode string `yaml:"mode"`
	// Size is the most server connections of one (database, user) pool; DefaultPoolSize when 0.
	Size int `yaml:"size"`
	// MaxClientWait is how long a client waits for a server connection of a full pool before it is refused with
	// an error naming the pool; DefaultPoolMaxClientWait when 0.
	MaxClientWait time.Duration `yaml:"max_client_wait"`
	// OnSessionState is what happens to a client that leaves session state a server connection cannot carry to
	// another client (a temporary table, LISTEN, a session advisory lock, a WITH HOLD cursor, SQL PREPARE, a
	// session-level SET): PoolPin (default) keeps that server connection for the client until it disconnects,
	// PoolRefuse ends the client's session with 0A000 naming what it left.
	OnSessionState string `yaml:"on_session_state"`
	// ServerLifetime closes a server connection this old when it is given back; DefaultPoolServerLifetime when 0.
	ServerLifetime time.Duration `yaml:"server_lifetime"`
	// ServerIdleTimeout closes a server connection idle in the pool this long; DefaultPoolServerIdleTimeout when 0.
	ServerIdleTimeout time.Duration `yaml:"server_idle_timeout"`
	// MinIdle is how many idle server connections each pool keeps open (opened in the background, within Size;
	// pool.server_idle_timeout does not close these); 0, the default, keeps none.
	MinIdle int `yaml:"min_idle"`
	// MaxClients is the most client sessions of all pools together (counted after authentication; the admin
	// console is not counted); a client beyond it is refused with 53300. 0, the default: no limit but
	// limits.max_client_connections.
	MaxClients int `yaml:"max_clients"`
	// AdminUsers may connect to the virtual database "fenceproxy", the admin console (SHOW POOLS, CLIENTS,
	// SERVERS, STATS, LOCKS, CONFIG; RELOAD, PAUSE, RESUME).
	AdminUsers []string `yaml:"admin_users"`
}

// Transaction reports whether clients share server connections per transaction.
func (p Pool) Transaction() bool { return p.Mode == PoolModeTransaction }

// Values of Pool.Mode and Pool.OnSessionState, and the pool's defaults.
const (
	PoolModeSession          = "session"
	PoolModeTransaction      = "transaction"
	PoolPin                  = "pin"
	PoolRefuse               = "refuse"
	DefaultPoolSize          = 20
	DefaultPoolMaxClientWait = 30 * time.Second

	DefaultPoolServerLifetime    = time.Hour
	DefaultPoolServerIdleTimeout = 10 * time.Minute
)

// Values of Log.Connections; DefaultLogConnections is the default.
const (
	LogConnectionsDebug   = "debug"
	LogConnectionsInfo    = "info"
	LogConnectionsOff     = "off"
	DefaultLogConnections = LogConnectionsInfo
)

// Defaults, chosen to be safe for a first run on a laptop and documented in the README.
const (
	DefaultListen               = "127.0.0.1:6432"
	DefaultTokenSetting         = setting.DefaultToken
	DefaultLockSetting          = setting.DefaultLock
	DefaultMaxClientConnections = 1000
	DefaultStartupTimeout       = 15 * time.Second
	DefaultMaxMessageSize       = 256 << 20
	DefaultShutdownTimeout      = 30 * time.Second
	DefaultConnectTimeout       = 10 * time.Second
	DefaultReuseMaxIdle         = 20
	DefaultPreparedFences       = 64
	DefaultReuseIdleTimeout     = 60 * time.Second
	DefaultReuseMaxLifetime     = time.Hour
	DefaultRewriteCacheSize     = 10000
	DefaultVerifyTimeout        = 2 * time.Second
	// DefaultRelaySpin is off: polling bought a lone client's round trips with CPU time, and CPU per
	// transaction measured higher than without it in every workload of bench/run (issue 15: polling stays off
	// unless it wins on both).
	DefaultRelaySpin      = 0
	MaxRelaySpin          = time.Millisecond
	MaxEventLoops         = 256
	DefaultCatalogRefresh = 5 * time.Second
	DefaultHealthInterval = time.Second
	DefaultHealthTimeout  = 2 * time.Second
	DefaultHealthUser     = "postgres"
	DefaultHealthDatabase = "postgres"
)

// Values of Relay.Mode.
const (
	RelayModeLoop       = "loop"
	RelayModeGoroutines = "goroutines"
)

// Values of Token.Scope and Table.TokenColumnWrites.
const (
	TokenScopeSession     = "session"
	TokenScopeTransaction = "transaction"
	TokenColumnOverride   = "override"
	TokenColumnRefuse     = "refuse"
)

// Load reads and validates the configuration file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data)
}

// Parse validates a configuration read from file (used only in messages). It reports every problem it finds,
// one a line (see report).
func Parse(file string, data []byte) (*Config, error) {
	if file == "" {
		file = "config"
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, syntaxError(file, err)
	}
	r := &report{file: file, lines: map[string]int{}}
	cfg := &Config{File: file}
	if len(root.Content) > 0 {
		doc := root.Content[0]
		r.checkKeys(doc, reflect.TypeOf(*cfg), "")
		// A value of the wrong type is left at its zero value and decoding goes on, so the rest is still
		// validated in this pass.
		if err := doc.Decode(cfg); err != nil {
			r.decodeProblems(err)
		}
	}
	cfg.applyDefaults()
	cfg.validate(r.add)
	if err := r.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func displayPath(path string) string {
	if path == "" {
		return "document"
	}
	return path
}

// Defaults is the configuration every key of which has its default value (the admin console's SHOW CONFIG
// shows them); it names no upstream, so it is not a configuration to run with.
func Defaults() *Config {
	c := &Config{}
	c.applyDefaults()
	return c
}

func (c *Config) applyDefaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Upstream.ConnectTimeout == 0 {
		c.Upstream.ConnectTimeout = DefaultConnectTimeout
	}
	if c.Fence.SynchronousCommit == "" {
		c.Fence.SynchronousCommit = "off"
	}
	if c.Upstream.Target == "" {
		c.Upstream.Target = TargetReadWrite
	}
	if c.Upstream.HealthInterval == 0 {
		c.Upstream.HealthInterval = DefaultHealthInterval
	}
	if c.Upstream.HealthTimeout == 0 {
		c.Upstream.HealthTimeout = DefaultHealthTimeout
	}
	if c.Upstream.Health.User == "" {
		c.Upstream.Health.User = DefaultHealthUser
	}
	if c.Upstream.Health.Database == "" {
		c.Upstream.Health.Database = DefaultHealthDatabase
	}
	if c.Upstream.Barrier.Etcd.Prefix == "" {
		c.Upstream.Barrier.Etcd.Prefix = DefaultLocksEtcdPrefix
	}
	if c.Upstream.TLS.Mode == "" {
		c.Upstream.TLS.Mode = "disable"
	}
	if c.Upstream.Reuse.IdleTimeout == 0 {
		c.Upstream.Reuse.IdleTimeout = DefaultReuseIdleTimeout
	}
	if c.Upstream.Reuse.MaxLifetime == 0 {
		c.Upstream.Reuse.MaxLifetime = DefaultReuseMaxLifetime
	}
	if c.Token.Setting == "" {
		c.Token.Setting = DefaultTokenSetting
	}
	if c.Token.Scope == "" {
		c.Token.Scope = TokenScopeSession
	}
	if c.Token.LockSetting == "" {
		c.Token.LockSetting = DefaultLockSetting
	}
	for i := range c.Tables {
		if c.Tables[i].TokenColumnWrites == "" {
			c.Tables[i].TokenColumnWrites = TokenColumnOverride
		}
	}
	if c.Token.Verify.Etcd.Timeout == 0 {
		c.Token.Verify.Etcd.Timeout = DefaultVerifyTimeout
	}
	if c.Token.Verify.ZooKeeper.Timeout == 0 {
		c.Token.Verify.ZooKeeper.Timeout = DefaultVerifyTimeout
	}
	if c.Limits.MaxClientConnections == 0 {
		c.Limits.MaxClientConnections = DefaultMaxClientConnections
	}
	if c.Limits.StartupTimeout == 0 {
		c.Limits.StartupTimeout = DefaultStartupTimeout
	}
	if c.Limits.MaxMessageSize == 0 {
		c.Limits.MaxMessageSize = DefaultMaxMessageSize
	}
	if c.Limits.ShutdownTimeout == 0 {
		c.Limits.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Limits.RewriteCacheSize == 0 {
		c.Limits.RewriteCacheSize = DefaultRewriteCacheSize
	}
	if c.Pool.Mode == "" {
		c.Pool.Mode = PoolModeSession
	}
	if c.Pool.Size == 0 {
		c.Pool.Size = DefaultPoolSize
	}
	if c.Pool.MaxClientWait == 0 {
		c.Pool.MaxClientWait = DefaultPoolMaxClientWait
	}
	if c.Pool.OnSessionState == "" {
		c.Pool.OnSessionState = PoolPin
	}
	if c.Pool.ServerLifetime == 0 {
		c.Pool.ServerLifetime = DefaultPoolServerLifetime
	}
	if c.Pool.ServerIdleTimeout == 0 {
		c.Pool.ServerIdleTimeout = DefaultPoolServerIdleTimeout
	}
	if c.Relay.Mode == "" {
		c.Relay.Mode = RelayModeLoop
	}
	if c.Log.Level == "" {
		c.Log.Level = "info"
	}
	if c.Catalog != nil && c.Catalog.Refresh == 0 {
		c.Catalog.Refresh = DefaultCatalogRefresh
	}
	if c.Log.Format == "" {
		c.Log.Format = "text"
	}
	if c.Log.Connections == "" {
		c.Log.Connections = DefaultLogConnections
	}
	c.Locks.applyDefaults()
	c.Auth.applyDefaults()
}

// validate reports every problem of the decoded values through add (key, then the problem).
func (c *Config) validate(add func(key, format string, args ...any)) {
	if err := checkHostPort(c.Listen); err != nil {
		add("listen", "%v", err)
	}
	switch {
	case len(c.Upstream.Hosts) > 0 && c.Upstream.Address != "":
		add("upstream.hosts", "give upstream.address (one server) or upstream.hosts (a primary and its standbys), not both")
	case len(c.Upstream.Hosts) > 0:
		seenHosts := map[string]bool{}
		for i, h := range c.Upstream.Hosts {
			key := fmt.Sprintf("upstream.hosts[%d]", i)
			if err := checkHostPort(h); err != nil {
				add(key, "%v", err)
			} else if seenHosts[h] {
				add(key, "%s is listed twice", h)
			}
			seenHosts[h] = true
		}
		// What reads only the catalog (catalog awareness, check) connects to the first host.
		c.Upstream.Address = c.Upstream.Hosts[0]
	case c.Upstream.Address == "":
		add("upstream.address", "required (host:port of the PostgreSQL server)")
	default:
		if err := checkHostPort(c.Upstream.Address); err != nil {
			add("upstream.address", "%v", err)
		}
	}
	switch c.Fence.SynchronousCommit {
	case "off", "on", "remote_apply", "remote_write", "local":
	default:
		add("fence.synchronous_commit", "must be remote_apply, on, remote_write, local or off, not %q", c.Fence.SynchronousCommit)
	}
	switch c.Upstream.Target {
	case TargetReadWrite, TargetAny, TargetPreferStandby, TargetReadOnly:
	default:
		add("upstream.target", "must be read-write, any, prefer-standby or read-only, not %q", c.Upstream.Target)
	}
	if c.Upstream.HealthInterval < 0 {
		add("upstream.health_interval", "must be positive")
	}
	if c.Upstream.HealthTimeout < 0 {
		add("upstream.health_timeout", "must be positive")
	}
	for i, ep := range c.Upstream.Barrier.Etcd.Endpoints {
		if strings.TrimSpace(ep) == "" {
			add(fmt.Sprintf("upstream.barrier.etcd.endpoints[%d]", i), "empty endpoint")
		}
	}
	for i, s := range c.Upstream.Barrier.ZooKeeper.Servers {
		if strings.TrimSpace(s) == "" {
			add(fmt.Sprintf("upstream.barrier.zookeeper.servers[%d]", i), "empty server")
		}
	}
	if a := c.Upstream.Barrier.Redis.Address; a != "" {
		if err := checkHostPort(a); err != nil {
			add("upstream.barrier.redis.address", "%v", err)
		}
	}
	if set := c.Upstream.Barrier.Sources(); len(set) > 1 {
		add(set[1], "the barrier reads one lock service (tokens of different services are not comparable): set only one of %s", strings.Join(set, ", "))
	}
	if c.Upstream.ConnectTimeout < 0 {
		add("upstream.connect_timeout", "must be positive")
	}
	if c.Upstream.Reuse.Idle() < 0 {
		add("upstream.reuse.max_idle", "must be 0 (off) or more")
	}
	if n := c.Upstream.Prepared(c.Token.Scope, c.Pool.Transaction()); n < 0 || n > 10000 {
		add("upstream.prepared_fences", "must be 0 (off) to 10000")
	}
	if c.Upstream.Reuse.IdleTimeout < 0 {
		add("upstream.reuse.idle_timeout", "must be positive")
	}
	if c.Upstream.Reuse.MaxLifetime < 0 {
		add("upstream.reuse.max_lifetime", "must be positive")
	}
	switch c.Upstream.TLS.Mode {
	case "disable", "require":
	case "verify-full":
		if c.Upstream.TLS.CAFile == "" {
			add("upstream.tls.ca_file", "required when upstream.tls.mode is verify-full")
		}
	default:
		add("upstream.tls.mode", "must be disable, require or verify-full, not %q", c.Upstream.TLS.Mode)
	}
	if (c.Upstream.TLS.CertFile == "") != (c.Upstream.TLS.KeyFile == "") {
		add("upstream.tls", "cert_file and key_file go together")
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		add("tls", "cert_file and key_file go together")
	}
	seen := map[string]bool{}
	for i := range c.Tables {
		t := &c.Tables[i]
		key := fmt.Sprintf("tables[%d]", i)
		if t.Name == "" {
			add(key+".name", "required")
			continue
		}
		parts := strings.Split(t.Name, ".")
		switch {
		case len(parts) == 1 && validIdent(parts[0]):
			t.Relation = parts[0]
		case len(parts) == 2 && validIdent(parts[0]) && validIdent(parts[1]):
			t.Schema, t.Relation = parts[0], parts[1]
		default:
			add(key+".name", "%q is not a table name (name or schema.name, lower case, as PostgreSQL stores unquoted names)", t.Name)
			continue
		}
		if seen[t.Name] {
			add(key+".name", "table %q listed twice", t.Name)
		}
		seen[t.Name] = true
		if t.TokenColumn == "" {
			add(key+".token_column", "required")
		} else if !validIdent(t.TokenColumn) {
			add(key+".token_column", "%q is not a column name", t.TokenColumn)
		}
		switch t.TokenColumnWrites {
		case TokenColumnOverride, TokenColumnRefuse:
		default:
			add(key+".token_column_writes", "must be %s or %s, not %q", TokenColumnOverride, TokenColumnRefuse, t.TokenColumnWrites)
		}
	}
	if err := setting.Validate(c.Token.Setting); err != nil {
		add("token.setting", "%v", err)
	}
	switch c.Token.Scope {
	case TokenScopeSession, TokenScopeTransaction:
	default:
		add("token.scope", "must be %s or %s, not %q", TokenScopeSession, TokenScopeTransaction, c.Token.Scope)
	}
	if err := setting.Validate(c.Token.LockSetting); err != nil {
		add("token.lock_setting", "%v", err)
	} else if strings.EqualFold(c.Token.LockSetting, c.Token.Setting) {
		add("token.lock_setting", "must differ from token.setting (%q)", c.Token.Setting)
	}
	if c.Token.Offset < 0 {
		add("token.offset", "must not be negative")
	}
	for i, s := range c.Token.Verify.ZooKeeper.Servers {
		if strings.TrimSpace(s) == "" {
			add(fmt.Sprintf("token.verify.zookeeper.servers[%d]", i), "empty server")
		}
	}
	if len(c.Token.Verify.Etcd.Endpoints) > 0 && len(c.Token.Verify.ZooKeeper.Servers) > 0 {
		add("token.verify.zookeeper", "tokens come from one lock service: set token.verify.etcd or token.verify.zookeeper, not both")
	}
	for i, ep := range c.Token.Verify.Etcd.Endpoints {
		if strings.TrimSpace(ep) == "" {
			add(fmt.Sprintf("token.verify.etcd.endpoints[%d]", i), "empty endpoint")
		}
	}
	if c.Metrics.Listen != "" {
		if err := checkHostPort(c.Metrics.Listen); err != nil {
			add("metrics.listen", "%v", err)
		}
	} else if c.Metrics.Pprof {
		add("metrics.pprof", "needs metrics.listen (the profiles are served there)")
	}
	if c.Limits.MaxClientConnections < 0 {
		add("limits.max_client_connections", "must be positive")
	}
	if c.Limits.StartupTimeout < 0 {
		add("limits.startup_timeout", "must be positive")
	}
	if c.Limits.MaxMessageSize < 0 || (c.Limits.MaxMessageSize > 0 && c.Limits.MaxMessageSize < 8192) {
		add("limits.max_message_size", "must be at least 8192 bytes")
	}
	if c.Limits.ShutdownTimeout < 0 {
		add("limits.shutdown_timeout", "must be positive")
	}
	if c.Limits.RewriteCacheSize < 0 {
		add("limits.rewrite_cache_size", "must be positive")
	}
	switch c.Pool.Mode {
	case PoolModeSession, PoolModeTransaction:
	default:
		add("pool.mode", "must be %s or %s, not %q", PoolModeSession, PoolModeTransaction, c.Pool.Mode)
	}
	if c.Pool.Size < 0 {
		add("pool.size", "must be positive")
	}
	if c.Pool.MaxClientWait < 0 {
		add("pool.max_client_wait", "must be positive")
	}
	if c.Pool.ServerLifetime < 0 {
		add("pool.server_lifetime", "must be positive")
	}
	if c.Pool.ServerIdleTimeout < 0 {
		add("pool.server_idle_timeout", "must be positive")
	}
	switch {
	case c.Pool.MinIdle < 0:
		add("pool.min_idle", "must not be negative")
	case c.Pool.MinIdle > 0 && !c.Pool.Transaction():
		add("pool.min_idle", "needs pool.mode transaction (session mode keeps no pools)")
	case c.Pool.Size > 0 && c.Pool.MinIdle > c.Pool.Size:
		add("pool.min_idle", "must not exceed pool.size (%d)", c.Pool.Size)
	}
	switch {
	case c.Pool.MaxClients < 0:
		add("pool.max_clients", "must not be negative")
	case c.Pool.MaxClients > 0 && !c.Pool.Transaction():
		add("pool.max_clients", "needs pool.mode transaction (limits.max_client_connections bounds session mode's clients)")
	case c.Limits.MaxClientConnections > 0 && c.Pool.MaxClients > c.Limits.MaxClientConnections:
		add("pool.max_clients", "must not exceed limits.max_client_connections (%d), which bounds every client connection", c.Limits.MaxClientConnections)
	}
	if len(c.Pool.AdminUsers) > 0 && !c.Pool.Transaction() {
		add("pool.admin_users", "needs pool.mode transaction: the admin console serves the pools (in session mode a connection to the database fenceproxy goes to PostgreSQL)")
	}
	switch c.Pool.OnSessionState {
	case PoolPin, PoolRefuse:
	default:
		add("pool.on_session_state", "must be %s or %s, not %q", PoolPin, PoolRefuse, c.Pool.OnSessionState)
	}
	if c.Pool.Transaction() && !c.Auth.ByProxy() {
		add("pool.mode", "transaction needs auth.type trust, scram-sha-256, md5 or cert: the proxy authenticates the clients of its pools (passthrough relays a client's login to a server connection of its own)")
	}
	switch c.Relay.Mode {
	case RelayModeLoop, RelayModeGoroutines:
	default:
		add("relay.mode", "must be %s or %s, not %q", RelayModeLoop, RelayModeGoroutines, c.Relay.Mode)
	}
	if c.Relay.EventLoops < 0 || c.Relay.EventLoops > MaxEventLoops {
		add("relay.event_loops", "must be 0 (one per two CPUs) to %d", MaxEventLoops)
	}
	if d := c.Relay.SpinFor(); d < 0 || d > MaxRelaySpin {
		add("relay.spin", "must be 0 (off) to %v", MaxRelaySpin)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		add("log.level", "must be debug, info, warn or error, not %q", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		add("log.format", "must be text or json, not %q", c.Log.Format)
	}
	if c.Catalog != nil && c.Catalog.Refresh < time.Second {
		add("catalog.refresh", "must be at least 1s")
	}
	switch c.Log.Connections {
	case LogConnectionsDebug, LogConnectionsInfo, LogConnectionsOff:
	default:
		add("log.connections", "must be %s, %s or %s, not %q", LogConnectionsDebug, LogConnectionsInfo, LogConnectionsOff, c.Log.Connections)
	}
	c.Locks.validate(add, c.Metrics.Listen != "" || (c.Pool.Transaction() && len(c.Pool.AdminUsers) > 0))
	c.Auth.validate(c.TLS, add)
}

func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not host:port", s)
	}
	_ = host
	if port == "" {
		return fmt.Errorf("%q has no port", s)
	}
	return nil
}

// validIdent accepts what PostgreSQL stores for an unquoted identifier: lower-case letters, digits, _ and $,
// not starting with a digit or $. Configured names are compared with the parser's folded names, so an upper-case
// letter here could never match and is refused rather than silently protecting nothing.
func validIdent(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r == '_':
		case (r >= '0' && r <= '9') || r == '$':
			if i == 0 {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// Locks makes the metrics endpoint observe lock services: per lock, the holder's token, hold time, waiters,
// acquisitions, releases, expirations and more (see tokens.Observer); the admin console's SHOW LOCKS lists the
// same stores. Several stores may be observed at once; none is observed by default. It needs metrics.listen
// or the admin console.
type Locks struct {
	Etcd      LocksEtcd      `yaml:"etcd"`
	Postgres  LocksPostgres  `yaml:"postgres"`
	ZooKeeper LocksZooKeeper `yaml:"zookeeper"`
	Redis     LocksRedis     `yaml:"redis"`
	// MaxLocks is how many lock names get a label of their own; later ones are summed under "other".
	MaxLocks int `yaml:"max_locks"`
	// Interval is how often the stores are read (etcd also re-reads when its lock prefix changes).
	Interval time.Duration `yaml:"interval"`
}

// LocksEtcd is an etcd cluster whose locks (under Prefix) are observed.
type LocksEtcd struct {
	Endpoints []string `yaml:"endpoints"`
	// Prefix is the key prefix of the locks; default /fenceproxy/locks/ (fenceproxy lock's).
	Prefix string `yaml:"prefix"`
}

// LocksPostgres is a database whose PostgreSQL lock store (the fenceproxy schema) is observed.
type LocksPostgres struct {
	DSN string `yaml:"dsn"`
}

// LocksZooKeeper is a ZooKeeper ensemble whose locks (under Root) are observed.
type LocksZooKeeper struct {
	Servers []string `yaml:"servers"`
	// Root is the parent path of the locks; default /fenceproxy/locks (fenceproxy lock --zk's).
	Root string `yaml:"root"`
}

// LocksRedis is a Redis server whose locks (keys under Prefix) are observed.
type LocksRedis struct {
	Address string `yaml:"address"`
	// Prefix is the prefix of the lock keys; default {fenceproxy}: (fenceproxy lock --redis's).
	Prefix string `yaml:"prefix"`
}

// Defaults of the lock observer.
const (
	DefaultLocksMaxLocks   = 50
	DefaultLocksInterval   = 2 * time.Second
	DefaultLocksEtcdPrefix = "/fenceproxy/locks/"
)

// Enabled reports whether any lock store is observed.
func (l Locks) Enabled() bool {
	return len(l.Etcd.Endpoints) > 0 || l.Postgres.DSN != "" || len(l.ZooKeeper.Servers) > 0 || l.Redis.Address != ""
}

func (l *Locks) applyDefaults() {
	if l.MaxLocks == 0 {
		l.MaxLocks = DefaultLocksMaxLocks
	}
	if l.Interval == 0 {
		l.Interval = DefaultLocksInterval
	}
	if l.Etcd.Prefix == "" {
		l.Etcd.Prefix = DefaultLocksEtcdPrefix
	}
}

// validate checks the section; read says whether anything reads the stores: the metrics endpoint or the
// admin console (SHOW LOCKS).
func (l *Locks) validate(add func(key, format string, args ...any), read bool) {
	if l.Enabled() && !read {
		add("locks", "observing locks needs metrics.listen (the series are exported there) or the admin console (pool.mode transaction with pool.admin_users: SHOW LOCKS)")
	}
	if l.MaxLocks < 0 {
		add("locks.max_locks", "must be positive")
	}
	if l.Interval < 0 {
		add("locks.interval", "must be positive")
	}
	for i, ep := range l.Etcd.Endpoints {
		if strings.TrimSpace(ep) == "" {
			add(fmt.Sprintf("locks.etcd.endpoints[%d]", i), "empty endpoint")
		}
	}
}

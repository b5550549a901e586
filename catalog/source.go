package catalog

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/config"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

// ConnConfig builds the catalog reader's connection from the catalog section: its DSN (PG* environment
// variables fill what it leaves out, as in libpq), host and port from upstream.address unless the DSN names a
// host, then user, database and the password file.
func ConnConfig(cfg *config.Config) (*pgx.ConnConfig, error) {
	cc := cfg.Catalog
	if cc == nil {
		return nil, fmt.Errorf("catalog: not configured")
	}
	pc, err := pgx.ParseConfig(cc.DSN)
	if err != nil {
		return nil, fmt.Errorf("catalog.dsn: %w", err)
	}
	if !dsnNamesHost(cc.DSN) {
		host, port, err := net.SplitHostPort(cfg.Upstream.Address)
		if err != nil {
			return nil, fmt.Errorf("upstream.address: %w", err)
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("upstream.address: port %q: %w", port, err)
		}
		pc.Host, pc.Port, pc.Fallbacks = host, uint16(p), nil
	}
	if cc.User != "" {
		pc.User = cc.User
	}
	if cc.Database != "" {
		pc.Database = cc.Database
	}
	if cc.PasswordFile != "" {
		b, err := os.ReadFile(cc.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("catalog.password_file: %w", err)
		}
		pc.Password = strings.TrimRight(string(b), "\r\n")
	}
	if pc.RuntimeParams == nil {
		pc.RuntimeParams = map[string]string{}
	}
	pc.RuntimeParams["application_name"] = "fenceproxy catalog"
	pc.ConnectTimeout = cfg.Upstream.ConnectTimeout
	return pc, nil
}

func dsnNamesHost(dsn string) bool {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		rest := dsn[strings.Index(dsn, "://")+3:]
		if i := strings.IndexAny(rest, "/?"); i >= 0 {
			rest = rest[:i]
		}
		if i := strings.LastIndex(rest, "@"); i >= 0 {
			rest = rest[i+1:]
		}
		return rest != ""
	}
	for _, f := range strings.Fields(dsn) {
		if strings.HasPrefix(f, "host=") || strings.HasPrefix(f, "hostaddr=") {
			return true
		}
	}
	return false
}

// Source reads snapshots over one connection of its own, reconnecting after a failure. It is safe for
// concurrent use (reads are serialised).
type Source struct {
	connConfig *pgx.ConnConfig
	probe      GuardProbe
	mu         sync.Mutex
	conn       *pgx.Conn
}

// NewSource makes a Source; probe nil means DefaultGuardProbe.
func NewSource(cc *pgx.ConnConfig, probe GuardProbe) *Source {
	if probe == nil {
		probe = DefaultGuardProbe()
	}
	return &Source{connConfig: cc, probe: probe}
}

// Snapshot reads the catalog and derives the snapshot for the configured tables.
func (s *Source) Snapshot(ctx context.Context, tables []rewrite.Table) (*Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil || s.conn.IsClosed() {
		conn, err := pgx.ConnectConfig(ctx, s.connConfig)
		if err != nil {
			return nil, fmt.Errorf("catalog: connect %s:%d: %w", s.connConfig.Host, s.connConfig.Port, err)
		}
		s.conn = conn
	}
	c, err := Read(ctx, s.conn, s.probe)
	if err != nil {
		s.conn.Close(context.Background())
		s.conn = nil
		return nil, err
	}
	return Derive(c, tables), nil
}

// Close closes the connection.
func (s *Source) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Close(context.Background())
		s.conn = nil
	}
}

// Watcher refreshes the snapshot every interval and when kicked, and hands every snapshot whose rules
// differ from the last one to publish. A failed refresh keeps the last snapshot (logged).
type Watcher struct {
	Source   *Source
	Interval time.Duration
	// Tables returns the configured tables now (they change on SIGHUP).
	Tables func() []rewrite.Table
	// Publish receives each new snapshot; an error is logged and the snapshot retried at the next refresh.
	Publish func(*Snapshot) error
	Log     *slog.Logger
	// Last is the snapshot published at start, if any.
	Last *Snapshot
	// Metrics, if set, records every refresh.
	Metrics *Metrics

	kick chan struct{}
	once sync.Once
	mu   sync.Mutex // one refresh at a time (the ticker's and SIGHUP's)
}

func (w *Watcher) kicks() chan struct{} {
	w.once.Do(func() { w.kick = make(chan struct{}, 1) })
	return w.kick
}

// Kick asks Run for a refresh now; it does not wait for it.
func (w *Watcher) Kick() {
	select {
	case w.kicks() <- struct{}{}:
	default:
	}
}

// Run refreshes until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	kick := w.kicks()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
		w.Refresh(ctx)
	}
}

// Refresh reads a snapshot now and publishes it if its rules changed.
func (w *Watcher) Refresh(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	snap, err := w.Source.Snapshot(rctx, w.Tables())
	cancel()
	w.Metrics.Observe(snap, err)
	if err != nil {
		w.Log.Error("catalog refresh failed; keeping the last snapshot", "err", err)
		return
	}
	if snap.SameRules(w.Last) {
		w.Last = snap
		return
	}
	if err := w.Publish(snap); err != nil {
		w.Log.Error("catalog snapshot not applied", "err", err)
		return
	}
	w.Last = snap
	w.Log.Info("catalog snapshot applied", "protected", len(snap.Protected), "refused", len(snap.Refused), "unresolved", len(snap.Unresolved))
}

package proxy

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// The admin console (pool.mode transaction): a client of pool.admin_users that connects to the virtual database
// "fenceproxy" talks to the proxy itself, as pgbouncer's users expect: SHOW POOLS and SHOW STATS, over the simple
// query protocol. Everyone else is refused.

// adminDatabase is the admin console's database name.
const adminDatabase = "fenceproxy"

// sqlstateInsufficientPrivilege is PostgreSQL's insufficient_privilege.
const sqlstateInsufficientPrivilege = "42501"

// serveAdmin serves an admin console session (after the client's authentication).
func (s *Server) serveAdmin(ss *session) {
	user := ss.params["user"]
	if !slices.Contains(s.cfg.Pool.AdminUsers, user) {
		s.metrics.sessionRefused("admin_not_allowed")
		ss.fatal(sqlstateInsufficientPrivilege, fmt.Sprintf("user %q may not use the admin console (pool.admin_users)", user), "")
		return
	}
	out := ss.cw
	writeMsg(out, msgAuthentication, []byte{0, 0, 0, authOK}, "")
	for _, p := range []paramStatus{{"server_version", "15.0 (fenceproxy admin console)"}, {"client_encoding", "UTF8"},
		{"server_encoding", "UTF8"}, {"standard_conforming_strings", "on"}, {"DateStyle", "ISO, MDY"}, {"integer_datetimes", "on"}} {
		writeMsg(out, msgParameterStatus, []byte(p.name+"\x00"+p.value+"\x00"), "")
	}
	s.registerPooledKey(ss) // a cancel finds no server connection: it does nothing
	defer s.unregister(ss)
	writeMsg(out, msgBackendKeyData, ss.clientKey, "")
	writeMsg(out, msgReadyForQuery, []byte{txIdle}, "")
	if out.Flush() != nil {
		return
	}
	ss.client.SetDeadline(time.Time{})
	ss.log.Info("admin console session started")
	for {
		typ, _, err := ss.cr.next()
		if err != nil {
			return
		}
		body, err := ss.cr.body()
		if err != nil {
			return
		}
		switch typ {
		case msgTerminate:
			return
		case msgQuery:
			text, ok := planText(msgQuery, body)
			if !ok {
				ss.fatal(sqlstateProtocolViolation, "invalid message from client", "Query message that is not one zero-terminated string")
				return
			}
			s.adminCommand(out, string(text))
			writeMsg(out, msgReadyForQuery, []byte{txIdle}, "")
			if out.Flush() != nil {
				return
			}
		default:
			ss.fatal(sqlstateFeatureNotSupported, "the admin console takes the simple query protocol only", "")
			return
		}
	}
}

// adminCommand answers one admin console command.
func (s *Server) adminCommand(out msgSink, text string) {
	cmd := strings.ToUpper(strings.Join(strings.Fields(strings.TrimRight(strings.TrimSpace(text), "; \t\n")), " "))
	var cols []string
	var rows [][]string
	switch cmd {
	case "SHOW POOLS":
		cols = []string{"database", "user", "cl_active", "cl_waiting", "sv_active", "sv_idle", "pool_mode"}
		for _, p := range s.pools.list() {
			p.mu.Lock()
			idle := len(p.idle)
			p.mu.Unlock()
			waiting := p.waiting.Load()
			rows = append(rows, []string{p.params["database"], p.params["user"], itoa(p.clients.Load() - waiting), itoa(waiting),
				itoa(int64(len(p.slots))), itoa(int64(idle)), s.cfg.Pool.Mode})
		}
	case "SHOW STATS":
		cols = []string{"database", "user", "total_xact_count", "total_server_conns", "total_pins"}
		for _, p := range s.pools.list() {
			rows = append(rows, []string{p.params["database"], p.params["user"], itoa(p.lends.Load()), itoa(p.opened.Load()), itoa(p.pins.Load())})
		}
	default:
		writeRaw(out, errorResponse("ERROR", sqlstateFeatureNotSupported, fmt.Sprintf("fenceproxy admin console: unknown command %q", strings.TrimSpace(text)), "", "Try SHOW POOLS or SHOW STATS."))
		return
	}
	rd := pgproto3.RowDescription{}
	for _, c := range cols {
		rd.Fields = append(rd.Fields, pgproto3.FieldDescription{Name: []byte(c), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1})
	}
	b, _ := rd.Encode(nil)
	for _, r := range rows {
		dr := pgproto3.DataRow{}
		for _, v := range r {
			dr.Values = append(dr.Values, []byte(v))
		}
		b, _ = dr.Encode(b)
	}
	b, _ = (&pgproto3.CommandComplete{CommandTag: []byte("SHOW")}).Encode(b)
	writeRaw(out, b)
}

func writeRaw(out msgSink, b []byte) { out.Write(b) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// list returns the pools, by name.
func (ps *txPools) list() []*txPool {
	ps.mu.Lock()
	pools := make([]*txPool, 0, len(ps.byKey))
	for _, p := range ps.byKey {
		pools = append(pools, p)
	}
	ps.mu.Unlock()
	sort.Slice(pools, func(i, j int) bool { return pools[i].name < pools[j].name })
	return pools
}

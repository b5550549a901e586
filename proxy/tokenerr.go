package proxy

import (
	"fmt"
	"strings"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// An invalid token refused where the proxy sees it (a SET, set_config, the startup packet) concerns no one
// table yet: it is the token every later write would present. The contract says every error names the table,
// so such a refusal names the setting and all the protected tables the token is for, in one place for every
// path that refuses a token: the refusal of a statement and the refusal of a startup.

// withTokenContext completes a 55F03 message that names no table:
// `invalid fencing token: ... (fence.token, for writes to public.accounts, ledger)`.
func (s *Server) withTokenContext(msg string) string {
	tables := s.protectedTables()
	if len(tables) == 0 {
		return fmt.Sprintf("%s (%s)", msg, s.cfg.Token.Setting)
	}
	return fmt.Sprintf("%s (%s, for writes to %s)", msg, s.cfg.Token.Setting, strings.Join(tables, ", "))
}

// refusalMessage is the message a refused statement's error carries.
func (ss *session) refusalMessage(plan rewrite.Plan) string {
	if plan.Code == sqlstateInvalid && plan.Table == "" {
		return ss.srv.withTokenContext(plan.Message)
	}
	return plan.Message
}

// protectedTables are the labels of the tables the running planner protects: the table list in force, a
// reload (SIGHUP, RELOAD) and the catalog included; without a planner, the configured ones.
func (s *Server) protectedTables() []string {
	if lp, ok := s.currentPlanner().(interface{ Tables() []string }); ok {
		return lp.Tables()
	}
	var tables []string
	for _, t := range s.cfg.Tables {
		tables = append(tables, t.Name)
	}
	return tables
}

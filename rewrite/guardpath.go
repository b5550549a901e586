package rewrite

import (
	"fmt"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The guard's schemas and the search_path.
//
// DDL naming a schema of the in-database guard (fenceproxy, fenceproxy_ddl) is refused (ddl.go: namesGuard). A
// name left unqualified is the search_path's to resolve: after SET search_path = fenceproxy, CREATE OR REPLACE
// FUNCTION guard_truncate() replaces the guard's own function, in a text (or a later message) that names no
// guard schema, and DDL texts that name no protected table are not even analysed. What schema an unqualified
// name lands in is decided where the search_path is set, so that is where the rule is kept: through the proxy, a
// guard schema never enters the search_path. Every SET of it (SET, SET LOCAL, SET SCHEMA, ALTER ROLE/DATABASE
// ... SET, a function's SET clause: every VariableSetStmt) and every set_config of it whose value names
// fenceproxy (fenceproxy_ddl included), or whose value cannot be read, is refused 55F04. The ways around this
// the proxy cannot see (a role or database default set directly, a function calling set_config, set_config with
// both its name and its value bound, which clients use for the token, a role named like the schema under
// "$user") are the DDL guard's: it refuses DDL on the guard's objects from any connection (docs/guard.md).

// GuardOnSearchPath reports whether a search_path value may name a guard schema: it holds "fenceproxy" in any
// case, quoted or not. It errs toward naming (a schema called myfenceproxy counts). The proxy applies it to the
// startup packet's search_path too.
func GuardOnSearchPath(value string) bool {
	return containsFoldBytes([]byte(value), "fenceproxy")
}

// isSearchPath reports whether a setting name is search_path (GUC names are case-insensitive; SET SCHEMA sets it
// too, under that name).
func isSearchPath(name string) bool { return strings.EqualFold(name, "search_path") }

// refuseGuardPath refuses a statement that may put a guard schema on the search_path; how says how.
func (a *analysis) refuseGuardPath(how string) {
	a.refuse(CodeUnfenceable, "", fmt.Sprintf("unfenceable write: %s may put fenceproxy, a schema of the fenceproxy guard, on the search_path, "+
		"where unqualified DDL could change the guard; fenceproxy refuses it (name objects in that schema schema-qualified, "+
		"and run changes to the guard with fenceproxy install)", how))
}

// checkSearchPathSet applies the rule to SET search_path (any VariableSetStmt of it: v.Name is search_path).
func (a *analysis) checkSearchPathSet(v *pg.VariableSetStmt) {
	if v.Kind != pg.VariableSetKind_VAR_SET_VALUE {
		return // RESET, TO DEFAULT, FROM CURRENT: a value set before, or the default
	}
	for _, arg := range v.Args {
		c := arg.GetAConst()
		if c == nil {
			a.refuseGuardPath("SET search_path with a value fenceproxy cannot read")
			return
		}
		if s, ok := c.Val.(*pg.A_Const_Sval); ok && GuardOnSearchPath(s.Sval.GetSval()) {
			a.refuseGuardPath("SET search_path naming " + s.Sval.GetSval())
			return
		}
	}
}

// checkSearchPathConfig applies the rule to set_config(name, value, is_local); name is the constant setting
// name when known.
func (a *analysis) checkSearchPathConfig(f *pg.FuncCall, name string, known bool) {
	value, ok := constString(f.Args[1])
	switch {
	case ok && GuardOnSearchPath(value) && (!known || isSearchPath(name)):
		a.refuseGuardPath("set_config of search_path naming " + value)
	case !ok && known && isSearchPath(name):
		if c := unwrapCast(f.Args[1]).GetAConst(); c != nil && c.Isnull {
			return // NULL resets it
		}
		a.refuseGuardPath("set_config of search_path with a value fenceproxy cannot read")
	}
}

// namesGuard reports whether a statement names one of the guard's schemas where it names something: a name
// part (qualified function, type, operator and object names are lists of String nodes), a string field of the
// tree that holds a schema (a RangeVar's schemaname, SET SCHEMA's newschema, CREATE SCHEMA's schemaname, IMPORT
// FOREIGN SCHEMA's local_schema: the parse tree's own naming), or the role CREATE SCHEMA AUTHORIZATION names its
// schema after. String constants (A_Const) and column references name no schema and are not looked into: a
// default, a check or a view holding the word changes no guard, and a qualified column reference needs a FROM
// item, a RangeVar looked at here. A function's body is one String constant of its AS clause and names nothing
// here (other DefElem arguments, which may be names or constants, are taken as names).
func namesGuard(n *pg.Node) bool { return namesGuardIn(n.ProtoReflect()) }

func namesGuardIn(m protoreflect.Message) bool {
	switch x := m.Interface().(type) {
	case *pg.A_Const, *pg.ColumnRef:
		return false
	case *pg.String:
		return isGuardSchema(x.Sval)
	case *pg.CreateSchemaStmt:
		if x.Schemaname == "" && isGuardSchema(x.GetAuthrole().GetRolename()) {
			return true
		}
	}
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.Kind() == protoreflect.StringKind && !fd.IsList() && strings.Contains(string(fd.Name()), "schema") &&
			isGuardSchema(m.Get(fd).String()) {
			return true
		}
	}
	found := false
	eachChild(m, func(c protoreflect.Message) {
		found = found || namesGuardIn(c)
	})
	return found
}

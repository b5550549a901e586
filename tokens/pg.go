package tokens

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/setting"
)

// DefaultSetting is the PostgreSQL setting that carries the session's fencing token.
const DefaultSetting = setting.DefaultToken

// SetToken makes token the session's fencing token on conn with `SET setting = token`: it lasts for the session
// (until RESET, DISCARD ALL or another SET), and it is undone if the surrounding transaction rolls back. The
// token is written as a literal, so a proxy that verifies tokens (token.verify.etcd) can check it at the SET.
// setting "" means [DefaultSetting].
func SetToken(ctx context.Context, conn *pgx.Conn, token int64, setting string) error {
	if token < 1 {
		return fmt.Errorf("set fencing token: %d is not a valid token (1..%d)", token, int64(^uint64(0)>>1))
	}
	if setting == "" {
		setting = DefaultSetting
	}
	name := pgx.Identifier(strings.Split(setting, ".")).Sanitize()
	if _, err := conn.Exec(ctx, "SET "+name+" = "+strconv.FormatInt(token, 10), pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("set fencing token %s = %d: %w", setting, token, err)
	}
	return nil
}

// PGOptions returns the PGOPTIONS value that gives a libpq client the fencing token as a startup option:
// inherited with " -c setting=token" appended (just "-c setting=token" if inherited is blank). Options already
// in inherited are kept; PostgreSQL applies startup options in order, so an inherited token for the same
// setting (an outer lock's) is overridden. setting "" means [DefaultSetting].
func PGOptions(inherited string, setting string, token int64) string {
	if setting == "" {
		setting = DefaultSetting
	}
	opt := "-c " + setting + "=" + strconv.FormatInt(token, 10)
	if strings.TrimSpace(inherited) == "" {
		return opt
	}
	return inherited + " " + opt
}

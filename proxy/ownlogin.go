package proxy

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceproxy/fenceproxy/auth"
)

// connectOwnRole opens a pgx connection as one of the proxy's own roles (the auth query's, the health check's)
// with the password the configuration gave it. pgx normalizes a SCRAM password with PRECIS OpaqueString (NFC)
// where PostgreSQL salted the role's secret from its SASLprep (NFKC, auth.SASLprep): a password the two read
// apart (a Roman numeral, a ligature, fullwidth letters) never logged in, and with the auth query's role every
// client was refused (TestAuthQueryRolePasswordSASLprep). So the SASLprepped password goes first where it
// differs (pgx leaves it as it is); a 28P01 to it tries the password as written, which md5 and cleartext take.
// The proxy's logins for clients prepare it themselves (auth.SCRAMKeys).
func connectOwnRole(ctx context.Context, cc *pgx.ConnConfig) (*pgx.Conn, error) {
	if prepped := auth.SASLprep(cc.Password); prepped != cc.Password {
		pc := cc.Copy()
		pc.Password = prepped
		c, err := pgx.ConnectConfig(ctx, pc)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != sqlstateInvalidPassword {
			return c, err
		}
	}
	return pgx.ConnectConfig(ctx, cc)
}

// Package setting holds the one rule for the names of the PostgreSQL settings that carry a session's fencing
// token and lock name, and their defaults. config validates with it, the rewriter relies on it (a name goes
// into generated SQL and into the marker a refusal carries), and `fenceproxy lock` checks its flags with it:
// one rule, so a name one part accepts is never refused, or read differently, by another.
package setting

import "fmt"

const (
	// DefaultToken is the setting that carries the session's fencing token.
	DefaultToken = "fence.token"
	// DefaultLock is the setting that names the lock the session's token belongs to (lock fences).
	DefaultLock = "fence.lock"
)

// maxPart is PostgreSQL's identifier length (NAMEDATALEN - 1).
const maxPart = 63

// Validate accepts a custom setting name: two or more parts joined by dots, each a lower-case ASCII identifier
// (a letter or '_' first, then letters, digits, '_' or '$'), at most 63 bytes.
//
// Why this narrow: PostgreSQL compares setting names without regard to case, so the proxy compares the names it
// reads from clients (startup options, SET, set_config arguments) with EqualFold against this lower-case
// spelling, as the server would; the name is written into generated SQL literals and into error markers (fields
// split at '|'), so only characters that need no quoting anywhere are allowed.
func Validate(name string) error {
	if name == "" {
		return fmt.Errorf("the setting name is empty (it needs a prefix and a dot, like %s)", DefaultToken)
	}
	parts := 0
	start := 0
	for i := 0; i <= len(name); i++ {
		if i < len(name) && name[i] != '.' {
			continue
		}
		if err := validPart(name, name[start:i]); err != nil {
			return err
		}
		parts++
		start = i + 1
	}
	if parts < 2 {
		return fmt.Errorf("%q is not a custom setting name (it needs a prefix and a dot, like %s)", name, DefaultToken)
	}
	return nil
}

func validPart(name, part string) error {
	if part == "" {
		return fmt.Errorf("%q is not a custom setting name: it has an empty part", name)
	}
	if len(part) > maxPart {
		return fmt.Errorf("%q: part %q is longer than %d bytes", name, part, maxPart)
	}
	for i := 0; i < len(part); i++ {
		c := part[i]
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case i > 0 && (c >= '0' && c <= '9' || c == '$'):
		case c >= 'A' && c <= 'Z':
			return fmt.Errorf("%q: write setting names in lower case (PostgreSQL folds setting names to lower case)", name)
		default:
			return fmt.Errorf("%q: invalid character %q in a setting name", name, c)
		}
	}
	return nil
}

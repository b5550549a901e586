package tokens

import (
	"strings"
	"unicode"

	"github.com/fenceproxy/fenceproxy/setting"
)

// DefaultLockSetting is the PostgreSQL setting that names the lock a session's token belongs to (lock fences).
const DefaultLockSetting = setting.DefaultLock

// PGOptionsLock is [PGOptions] plus the lock's name: inherited, then "-c setting=token -c lockSetting=lock".
// PostgreSQL splits startup options at whitespace and reads a backslash as "take the next character as is", so
// whitespace and backslashes in the lock's name are escaped with a backslash. "" settings mean the defaults.
func PGOptionsLock(inherited, setting string, token int64, lockSetting, lock string) string {
	if lockSetting == "" {
		lockSetting = DefaultLockSetting
	}
	var b strings.Builder
	for _, r := range lock {
		if r == '\\' || unicode.IsSpace(r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return PGOptions(inherited, setting, token) + " -c " + lockSetting + "=" + b.String()
}

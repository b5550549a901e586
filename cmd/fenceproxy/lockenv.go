package main

import "strings"

// lockOption is the PGOPTIONS part that names the lock a token belongs to (lock fences): " -c SETTING=NAME",
// with the name escaped as libpq's options want (a backslash before every space and backslash), so that any
// lock name reaches the server as one value.
func lockOption(setting, name string) string {
	return " -c " + setting + "=" + strings.NewReplacer(`\`, `\\`, " ", `\ `).Replace(name)
}

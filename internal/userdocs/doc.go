// Package userdocs holds tests that keep what a new user reads and runs true: the README's Quickstart is run as
// written, the compose stack is checked against the Quickstart, and the scripts are held to their promises
// (scripts/setup never touches a running service; scripts/test checks gofmt and go mod tidy), and bench/run
// produces the tables bench/README.md describes, one column per target and fenceproxy variant.
package userdocs

// Package faults is fenceproxy's fault-injection suite: real PostgreSQL, a real etcd the tests stop and restart,
// real fenceproxy processes, and writers that the tests freeze, kill and cut off. Every run records what each
// writer attempted and what the database applied, and a history checker asserts the fencing guarantees.
//
// The package holds tests only. Flags:
//
//	-faults.long      longer randomized runs (more workers, iterations and faults)
//	-faults.seed N    replay a randomized schedule; a failing run prints its seed
package faults

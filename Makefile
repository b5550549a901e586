# Convenience targets; scripts/test is the test command (the README and .ci/run use it).
GO ?= go

.PHONY: demo test

# Replays the accident (a frozen lock holder writing late) against a throwaway PostgreSQL, an embedded etcd and
# fenceproxy in-process; needs Go and the PostgreSQL server binaries (scripts/setup installs them). `go run`
# builds silently before the demo starts, so say what the wait is; -v lists packages as they compile.
demo:
	@echo "demo: building (the first build downloads the Go modules and compiles pg_query's C parser: a few minutes; later ones take seconds)" >&2
	$(GO) build -v -o /dev/null ./examples/demo
	@echo "demo: running" >&2
	$(GO) run ./examples/demo

# Installs what the tests need when missing, runs go vet and every Go test.
test:
	scripts/test

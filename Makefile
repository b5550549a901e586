# Convenience targets; scripts/test is the test command (the README and .ci/run use it).
GO ?= go

.PHONY: demo test

# Replays the accident (a frozen lock holder writing late) against a throwaway PostgreSQL, an embedded etcd and
# fenceproxy in-process; needs Go and the PostgreSQL server binaries (scripts/setup installs them).
demo:
	$(GO) run ./examples/demo

# Installs what the tests need when missing, runs go vet and every Go test.
test:
	scripts/test

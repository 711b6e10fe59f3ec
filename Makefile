# labkeep — two commands: `make run` and `make test`. Both set up what is
# missing first (see localrun/setup.sh): Debian packages when root, and the
# local Kubernetes control-plane binaries (built once, ~7 minutes cold).

SHELL := /bin/bash
# PostgreSQL's server binaries live outside PATH on Debian.
export PATH := $(PATH):$(shell ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1):/usr/sbin
GO ?= go
GOTEST_FLAGS ?=

.PHONY: help setup setup-test run test bench bench-quick bench-all vet

# help lists the targets: each documented target has a "## " line after it.
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## /  \1\t/' | expand -t 14

setup: ## install what `make run` needs (packages as root, control-plane binaries)
	@./localrun/setup.sh run

setup-test: ## install what `make test` needs too (sshd, nginx, kubectl, qemu, chromium, ...)
	@./localrun/setup.sh test

run: setup ## start the local stack and the functions until Ctrl-C
	$(GO) run ./localrun/cmd/labkeep-run

# Every test, against the real local stack. The race detector is on for
# everything; integration packages start their own control plane, node and
# PostgreSQL, so they need no running `make run`. guardian's end-to-end
# scenarios and the Pod labs on the real node load the CPU on purpose
# (memory hogs, fork bombs, CPU storms) and measure how the workspace
# reacts, so they run after the rest, one package at a time, not beside
# other packages; test/guardianvm runs the same scenarios in a cgroup v2 VM
# and localrun/guestnode runs the production workspace Pod on a cgroup v2
# node in a VM (two emulated vCPUs each: the machine's two cores).
# localrun/images, localrun/kubevirt and test/vmlab (BOOTS) then boot real
# guests under software emulation, one vCPU each, busy for a minute or
# more and measuring nothing: two packages at a time, so both cores work
# (test/vmlab's own tests run one after another: its node holds one such
# guest at a time).
# Each go test's -json stream goes through localrun/cmd/skipcheck: it prints
# go test's usual output and fails on any skip test/skips.md does not list.
ALONE := ./guardian/e2e ./test/podlab ./test/guardianvm ./localrun/guestnode
BOOTS := ./localrun/images ./localrun/kubevirt ./test/vmlab
test: setup-test vet ## every test (race detector on), against the real local stack
	set -o pipefail; $(GO) test -json -race -count=1 -timeout 30m $(GOTEST_FLAGS) $$($(GO) list ./... | grep -v -e '/guardian/e2e$$' -e '/test/podlab$$' -e '/test/guardianvm$$' -e '/localrun/guestnode$$' -e '/localrun/images$$' -e '/localrun/kubevirt$$' -e '/test/vmlab$$') | $(GO) run ./localrun/cmd/skipcheck test/skips.md
	set -o pipefail; $(GO) test -json -race -count=1 -p 1 -timeout 30m $(GOTEST_FLAGS) $(ALONE) | $(GO) run ./localrun/cmd/skipcheck test/skips.md
	set -o pipefail; $(GO) test -json -race -count=1 -p 2 -timeout 40m $(GOTEST_FLAGS) $(BOOTS) | $(GO) run ./localrun/cmd/skipcheck test/skips.md
	@$(MAKE) --no-print-directory bench-quick

# vet also fails on an untidy go.mod: `go mod tidy` must leave nothing to change.
vet: ## go vet, go mod tidy check, gofmt check
	$(GO) vet ./...
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod/go.sum are not tidy: run go mod tidy"; $(GO) mod tidy -diff; exit 1; }
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi

# The table's benchmarks: every BenchmarkTable… (in whichever package holds
# one) runs once (-benchtime=1x: each sizes its own work), one package at a
# time so they don't load each other's figures, against the real local
# stack, and records its figures with their baselines from the same run
# (localrun/benchtable); localrun/cmd/benchtable then prints the one table
# and saves it with the machine under test/bench/results. bench-quick runs
# each case once at its smallest scale: CI's check that they still run (it
# never fails on a number); its results go to a temp dir.
BENCH_PKGS = $$(grep -rl --include='*_test.go' '^func BenchmarkTable' . | xargs -r -n1 dirname | sort -u)
BENCH_RUN = $(GO) test -run '^$$' -bench '^BenchmarkTable' -benchtime=1x -benchmem -count=1 -p 1
bench: setup-test ## the benchmarks' table with baselines (~30 min), saved in test/bench/results; written into test/bench/README.md
	@rows=$$(mktemp) && trap 'rm -f "$$rows"' EXIT && \
	LABKEEP_BENCH_ROWS=$$rows $(BENCH_RUN) -timeout 40m $(BENCH_PKGS) && \
	LABKEEP_BENCH_ROWS=$$rows LABKEEP_BENCH_README=test/bench/README.md $(GO) run ./localrun/cmd/benchtable

bench-quick: setup-test ## each table benchmark once at small scale (part of make test)
	@dir=$$(mktemp -d) && trap 'rm -rf "$$dir"' EXIT && \
	export LABKEEP_BENCH_QUICK=1 LABKEEP_BENCH_ROWS=$$dir/rows.jsonl LABKEEP_BENCH_RESULTS=$$dir && \
	$(BENCH_RUN) -timeout 10m $(BENCH_PKGS) && \
	$(GO) run ./localrun/cmd/benchtable

bench-all: setup-test ## every benchmark, the table's and the others, with go test's output
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./...

# sandgate developer entry points; `make help` lists them.
# setup, run and test need root on Debian 12 (they install packages and start dockerd).

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
# cargo parallelises on its own; setup must finish before anything uses Docker.
.NOTPARALLEL:

# rustup puts cargo in ~/.cargo/bin, which non-login shells (CI, sudo) often lack.
ifeq ($(shell command -v cargo 2>/dev/null),)
  ifneq ($(wildcard $(HOME)/.cargo/env),)
    export PATH := $(shell . "$(HOME)/.cargo/env" && printf '%s' "$$PATH")
  endif
endif

TARGET_TRIPLE ?= x86_64-unknown-linux-gnu
GATEWAY := target/release/sandgate
# sandbox-init runs as PID 1 inside the images, which carry no Rust runtime: it must be static.
INIT_STATIC := target/$(TARGET_TRIPLE)/release/sandbox-init
# The gateway looks for sandbox-init next to its own executable by default.
INIT_BESIDE_GATEWAY := target/release/sandbox-init
SHELL_SCRIPTS := scripts/setup.sh scripts/lib.sh scripts/netns.sh scripts/test-pg-clean.sh images/build.sh .ci/run

.PHONY: help setup images build gateway init run check test policy-test bench lint fmt fmt-check \
	clippy shellcheck module-cycles clean check-cargo fuzz

help: ## list the targets
	@awk 'BEGIN { FS = ":.*## " } /^[a-z-]+:.*## / { printf "  %-14s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

setup: ## install packages, start dockerd with runsc, build the sandbox images (root)
	bash scripts/setup.sh

images: ## rebuild the sandbox images if their recipe changed (root; FORCE=1 always)
	bash images/build.sh $(if $(filter 1,$(FORCE)),--force)

build: gateway init ## build target/release/sandgate and the static sandbox-init beside it
	install -m 0755 $(INIT_STATIC) $(INIT_BESIDE_GATEWAY)

gateway: check-cargo ## build target/release/sandgate
	cargo build --release --bin sandgate

init: check-cargo ## build the static sandbox-init into target/<triple>/release
	RUSTFLAGS="$${RUSTFLAGS:-} -C target-feature=+crt-static" \
		cargo build --release -p sandbox-init --target $(TARGET_TRIPLE)
	@ldd $(INIT_STATIC) 2>&1 | grep -qE 'not a dynamic executable|statically linked' \
		|| { echo "make: $(INIT_STATIC) is not statically linked" >&2; exit 1; }

run: setup build ## set up, build and start the gateway (SANDGATE_* variables pass through)
	exec $(GATEWAY) serve

# The fast tier: no root, no dockerd, no PostgreSQL, no network namespace. Every crate's unit
# tests (--lib, --bins) and the integration tests that need no service, named here (a new one
# joins the list); the end-to-end tests (gateway's e2e, egress-proxy's netns suites, the Python
# SDK against a live gateway) are `make test`'s. One cargo invocation over the workspace, so the
# features (and so the builds) are the same as for the policy cases' debug binary.
CHECK_TESTS := --test cases --test decisions --test egress --test engine --test grants \
	--test shipped_policy --test init --test bridge --test fuzz_spec --test fuzz_names \
	--test kubernetes_manifests
PY_VENV ?= $(or $(SANDGATE_PY_VENV),$(CURDIR)/target/py)
DEBUG_GATEWAY = $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/debug/sandgate

check: fmt-check clippy module-cycles ## the fast tier, no root, Docker or PostgreSQL: fmt, clippy, every crate's unit tests and service-free tests, the policy cases, the Python SDK's offline tests
	cargo test --workspace --lib --bins $(CHECK_TESTS)
	cargo build --workspace --bins
	"$(DEBUG_GATEWAY)" policy test policies --min-coverage 90
	@test -x "$(PY_VENV)/bin/python" \
		|| { echo "make: no Python test environment at $(PY_VENV): run 'make setup' once, or set SANDGATE_PY_VENV" >&2; exit 1; }
	PYTHONPATH=clients/python/src "$(PY_VENV)/bin/python" -m pytest -q -p no:cacheprovider -m offline clients/python/tests

# The isolation and limit suites run a second time against warm (pooled) sandboxes: modules of
# the one end-to-end binary (gateway/tests/e2e), selected by their path.
WARM_SUITES := executions:: limits:: situations:: egress:: egress_tls:: sandbox_ends::

test: setup lint init policy-test ## everything CI checks: lints, policy cases, all unit and end-to-end tests, the isolation suites warm
	SANDGATE_SANDBOX_INIT="$(CURDIR)/$(INIT_STATIC)" cargo test --workspace --no-fail-fast
	SANDGATE_SANDBOX_INIT="$(CURDIR)/$(INIT_STATIC)" SANDGATE_TEST_START=warm \
		cargo test -p gateway --no-fail-fast --test e2e -- $(WARM_SUITES)

policy-test: gateway ## the policy bundle's YAML cases and golden decision matrix (policies/tests), failing under 90% line coverage
	$(GATEWAY) policy test policies --min-coverage 90

bench: check-cargo init ## measure, with baselines in the same run: policy decision latency, proxy throughput and CONNECT latency, cold execution vs raw Docker, the warm pool (refill booted vs restored, session creation, the four-tenant mix), 16 concurrent executions, E2B's SDK against sandgate's own API, pause/resume/fork of a pandas session vs a cold one on a private experimental dockerd, audit writes (group commit) vs COPY, single-writer latency and the chain lock under two replicas, audit rows per 10,000 failed authentications before/after bounding, the time to create a policy proposal over 10,000 recorded decisions (DESIGN 8; root, after setup)
	cargo bench -p policy-engine --bench decide
	bash scripts/netns.sh up
	cargo bench -p egress-proxy --bench throughput
	cargo bench -p egress-proxy --bench inspect
	SANDGATE_SANDBOX_INIT="$(CURDIR)/$(INIT_STATIC)" cargo bench -p gateway --bench cold
	SANDGATE_SANDBOX_INIT="$(CURDIR)/$(INIT_STATIC)" cargo bench -p gateway --bench warm
	SANDGATE_SANDBOX_INIT="$(CURDIR)/$(INIT_STATIC)" cargo bench -p gateway --bench session
	SANDGATE_SANDBOX_INIT="$(CURDIR)/$(INIT_STATIC)" cargo bench -p gateway --bench pool_refill
	SANDGATE_SANDBOX_INIT="$(CURDIR)/$(INIT_STATIC)" cargo bench -p gateway --bench e2b
	SANDGATE_SANDBOX_INIT="$(CURDIR)/$(INIT_STATIC)" cargo bench -p gateway --bench snapshots
	cargo bench -p gateway --bench refusals
	cargo bench -p gateway --bench audit
	cargo bench -p gateway --bench proposals

# Each fuzz harness also runs in `make test` with proptest's default number of cases.
FUZZ_CASES ?= 200000
fuzz: check-cargo ## long fuzzing runs of the parsers facing the sandbox (FUZZ_CASES per property, default 200000); failures land in proptest-regressions files: commit them
	PROPTEST_CASES=$(FUZZ_CASES) cargo test --release -p egress-proxy --lib fuzz::
	PROPTEST_CASES=$(FUZZ_CASES) cargo test --release -p sandbox-init --test fuzz_spec
	PROPTEST_CASES=$(FUZZ_CASES) cargo test --release -p gateway --test fuzz_names

lint: fmt-check clippy shellcheck module-cycles ## formatting, clippy with warnings denied, shellcheck, no import cycles between any crate's modules

fmt: check-cargo ## format the Rust code
	cargo fmt --all

fmt-check: check-cargo ## check formatting (cargo fmt --check)
	cargo fmt --all --check

clippy: check-cargo ## clippy on every target, warnings denied
	cargo clippy --workspace --all-targets -- -D warnings

shellcheck: ## shellcheck the shell scripts
	@command -v shellcheck >/dev/null \
		|| { echo "make: shellcheck not found: run 'make setup' or apt-get install shellcheck" >&2; exit 1; }
	shellcheck -x $(SHELL_SCRIPTS)

# Every crate of the workspace: a cycle is as hard to read in the proxy as in the gateway.
CYCLE_CRATES := gateway/src egress-proxy/src policy-engine/src sandbox-init/src \
	sandbox-protocol/src api-types/src

module-cycles: ## fail when a crate's top-level modules import each other in a cycle
	python3 scripts/module-cycles.py $(CYCLE_CRATES)

clean: ## remove build output (keeps .sandgate: it holds the audit database)
	cargo clean

check-cargo:
	@command -v cargo >/dev/null \
		|| { echo "make: cargo not found on PATH or via $(HOME)/.cargo/env: install Rust with rustup" >&2; exit 1; }

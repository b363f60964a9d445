#!/usr/bin/env bash
# Prepare a Debian 12 host to run and test sandgate (run as root):
#   1. install the missing Debian packages (docker.io, runsc, postgresql, debootstrap, ...);
#   2. register the gVisor runtime `runsc` in dockerd with the flags sandgate relies on;
#   3. start dockerd when it is not running (there may be no init system to do it);
#   4. build the sandbox images (images/build.sh) and run one sandbox as a smoke test;
#   5. check that the PostgreSQL binaries are present (sandgate runs its own private cluster);
#   6. make the Python environment the toolkit tests use (target/py: the SDK's and the MCP
#      tests' packages from PyPI).
# Idempotent: a second run changes nothing and takes seconds.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
SG_LOG_PREFIX=setup

# gcc and libc6-dev: cargo needs a linker, and the static sandbox-init needs libc.a;
# `make lint` runs shellcheck over the scripts; chromium: gateway/tests/e2e/review_page.rs drives the
# review page in headless Chromium; prometheus: gateway/tests/e2e/metrics.rs checks /metrics with
# its `promtool`; python3-venv: the toolkit tests' Python environment (target/py).
readonly PACKAGES=(
    docker.io runsc postgresql debootstrap
    ca-certificates curl iproute2 jq procps
    gcc libc6-dev shellcheck
    chromium prometheus python3 python3-venv
)
# What the Python tests import (clients/python/tests, gateway/tests/toolkit_python.rs, and E2B's SDKs for gateway/tests/e2e/e2b.rs); the SDK
# itself is imported from clients/python/src, so it is never stale.
readonly PY_VENV=${SANDGATE_PY_VENV:-$ROOT/target/py}
readonly PY_PACKAGES=(httpx==0.28.1 pytest==9.2.0 pytest-asyncio==1.5.0 openapi-spec-validator==0.9.0 mcp==2.3.0 e2b==2.63.0 e2b-code-interpreter==2.11.5 wheel)
# E2B's JS SDKs for gateway/tests/e2e/e2b_js.rs, from npm into a project-local directory (the
# machine's node, 18 or later; none: that test says so and fails).
readonly JS_DIR=${SANDGATE_JS_DIR:-$ROOT/target/js}
readonly JS_PACKAGES=(e2b@2.51.0 @e2b/code-interpreter@2.8.0)
# The isolation floor (DESIGN.md section 5): no network stack inside the sandbox; the only way
# out is the egress Unix socket that sandgate bind-mounts in, which needs --host-uds=open.
readonly RUNSC_ARGS=(--network=none --host-uds=open)
readonly DAEMON_JSON=/etc/docker/daemon.json
readonly DOCKERD_LOG=/var/log/sandgate-dockerd.log
readonly APT_LOG=/var/log/sandgate-apt.log
readonly DOCKERD_WAIT_SECS=30
readonly POLICY_RC=/usr/sbin/policy-rc.d
readonly LOCK_FILE=/var/tmp/sandgate-setup.lock

install_packages() {
    local missing=() pkg
    for pkg in "${PACKAGES[@]}"; do
        # A Docker engine from another source (docker-ce) conflicts with docker.io: keep it.
        [[ $pkg == docker.io ]] && command -v dockerd >/dev/null && continue
        pkg_installed "$pkg" || missing+=("$pkg")
    done
    # dockerd loads an AppArmor profile when the kernel has AppArmor enabled; it needs the parser.
    if [[ $(cat /sys/module/apparmor/parameters/enabled 2>/dev/null) == Y ]] && ! pkg_installed apparmor; then
        missing+=(apparmor)
    fi
    if ((${#missing[@]} == 0)); then
        log "packages already installed"
        return
    fi
    command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian 12 only"
    log "installing: ${missing[*]} (log: $APT_LOG)"
    # Package scripts must not start services (the system PostgreSQL cluster, dockerd):
    # sandgate starts what it needs itself. policy-rc.d exit 101 = "action forbidden".
    if [[ ! -e $POLICY_RC ]]; then
        printf '#!/bin/sh\n# temporary, from sandgate scripts/setup.sh\nexit 101\n' >"$POLICY_RC"
        chmod 0755 "$POLICY_RC"
        trap 'rm -f "$POLICY_RC"' EXIT
    fi
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
        >>"$APT_LOG" 2>&1; then
        tail -n 20 "$APT_LOG" >&2
        die "apt-get failed (packages: ${missing[*]}); read $APT_LOG"
    fi
    log "installed: ${missing[*]}"
}

# runsc_configured: true when daemon.json already declares runsc with exactly RUNSC_ARGS.
runsc_configured() {
    [[ -f $DAEMON_JSON ]] || return 1
    jq -e --arg path "$(command -v runsc)" --argjson args "$(runsc_args_json)" \
        '.runtimes.runsc.path == $path and .runtimes.runsc.runtimeArgs == $args' \
        "$DAEMON_JSON" >/dev/null
}

runsc_args_json() {
    printf '%s\n' "${RUNSC_ARGS[@]}" | jq -R . | jq -cs .
}

# register_runsc: add (or correct) the runsc entry in daemon.json, keeping every other setting.
register_runsc() {
    command -v runsc >/dev/null || die "runsc not found after install: apt-get install runsc"
    if [[ -f $DAEMON_JSON ]] && ! jq empty "$DAEMON_JSON" 2>/dev/null; then
        die "$DAEMON_JSON is not valid JSON: fix it (or move it away) and run setup again"
    fi
    if runsc_configured; then
        log "runsc runtime already registered in $DAEMON_JSON"
        return
    fi
    mkdir -p "$(dirname "$DAEMON_JSON")"
    if [[ -f $DAEMON_JSON ]]; then
        cp -p "$DAEMON_JSON" "$DAEMON_JSON.sandgate-backup"
        log "saved the previous $DAEMON_JSON as $DAEMON_JSON.sandgate-backup"
    fi
    runsc install --runtime runsc -- "${RUNSC_ARGS[@]}" \
        || die "runsc install failed; check $DAEMON_JSON"
    runsc_configured || die "runsc install did not write the expected entry into $DAEMON_JSON"
    log "registered runsc runtime (${RUNSC_ARGS[*]}) in $DAEMON_JSON"
}

start_dockerd() {
    if docker_answers; then
        log "docker already running"
        return
    fi
    if pgrep -x dockerd >/dev/null; then
        log "dockerd is running but not answering yet; waiting"
    else
        log "starting dockerd (log: $DOCKERD_LOG)"
        # Own session, no inherited stdio: dockerd must outlive this script and must not hold
        # open the pipe of whoever runs it (make, CI), or they would wait forever.
        # Close the lock descriptor too, or dockerd would hold the setup lock forever.
        setsid nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null 8>&- &
    fi
    local waited
    for ((waited = 0; waited < DOCKERD_WAIT_SECS; waited++)); do
        if docker_answers; then
            log "docker is up"
            return
        fi
        sleep 1
    done
    tail -n 20 "$DOCKERD_LOG" >&2 || true
    die "dockerd did not answer 'docker info' within ${DOCKERD_WAIT_SECS}s; read $DOCKERD_LOG"
}

# daemon_runsc_ok: true when the running daemon reports runsc with exactly RUNSC_ARGS.
daemon_runsc_ok() {
    local runtime
    runtime=$(timeout 10 docker info -f '{{json .Runtimes.runsc}}' 2>/dev/null) || return 1
    jq -e --argjson args "$(runsc_args_json)" '.runtimeArgs == $args' <<<"$runtime" >/dev/null 2>&1
}

dockerd_pid() {
    local pid=""
    [[ -r /var/run/docker.pid ]] && pid=$(</var/run/docker.pid)
    [[ -n $pid ]] || pid=$(pgrep -x -o dockerd || true)
    printf '%s' "$pid"
}

# check_runtime: make the running dockerd use the runsc entry from daemon.json.
check_runtime() {
    if daemon_runsc_ok; then
        log "dockerd lists the runsc runtime (${RUNSC_ARGS[*]})"
        return
    fi
    local pid
    pid=$(dockerd_pid)
    [[ -n $pid ]] || die "cannot find the dockerd process to reload its runtimes; restart dockerd"
    # SIGHUP makes dockerd re-read daemon.json; runtimes are among the reloadable settings.
    log "reloading dockerd (pid $pid) to pick up the runsc runtime"
    kill -HUP "$pid"
    local waited
    for ((waited = 0; waited < 10; waited++)); do
        if daemon_runsc_ok; then
            log "dockerd lists the runsc runtime (${RUNSC_ARGS[*]})"
            return
        fi
        sleep 1
    done
    die "dockerd does not list runsc with ${RUNSC_ARGS[*]} after a reload; restart dockerd and read $DOCKERD_LOG"
}

build_images() {
    bash "$ROOT/images/build.sh" || die "building the sandbox images failed; see the output above"
}

smoke_test() {
    local name="sandgate-setup-smoke-$$"
    if timeout 60 docker run --rm --name "$name" --runtime runsc --network none \
        --log-driver none sandgate/bash true; then
        log "smoke test passed: sandgate/bash runs under runsc"
        return
    fi
    # A sandbox that failed to start can linger; do not leave it behind.
    timeout 20 docker rm -f "$name" >/dev/null 2>&1 || true
    die "a runsc container did not start: try 'docker run --rm --runtime runsc --network none sandgate/bash true' and read $DOCKERD_LOG"
}

check_postgres() {
    local initdbs=(/usr/lib/postgresql/*/bin/initdb)
    [[ -x ${initdbs[0]} ]] || die "no /usr/lib/postgresql/*/bin/initdb: apt-get install postgresql"
    if ! id -u postgres >/dev/null 2>&1; then
        useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/sh postgres
        log "created system user postgres"
    fi
    log "postgres binaries present (${initdbs[*]}); sandgate starts its own private cluster"
}

python_env() {
    if [[ -x $PY_VENV/bin/python ]] \
        && "$PY_VENV/bin/python" -c 'import httpx, pytest, pytest_asyncio, openapi_spec_validator, mcp, e2b, e2b_code_interpreter, wheel' 2>/dev/null; then
        log "python test environment ready ($PY_VENV)"
        return
    fi
    /usr/bin/python3 -m venv "$PY_VENV" || die "/usr/bin/python3 -m venv failed: apt-get install python3-venv"
    "$PY_VENV/bin/pip" install -q "${PY_PACKAGES[@]}" >>"$APT_LOG" 2>&1 \
        || die "pip install ${PY_PACKAGES[*]} into $PY_VENV failed; read $APT_LOG"
    log "python test environment made ($PY_VENV: ${PY_PACKAGES[*]})"
}

# True when `node` runs and is at least 20.18.1 (what E2B's JS SDKs declare in `engines`).
node_is_recent() {
    command -v node >/dev/null 2>&1 \
        && node -e 'const [a, b] = process.versions.node.split(".").map(Number);
                    process.exit(a > 20 || (a === 20 && b >= 18) ? 0 : 1)' 2>/dev/null
}

js_env() {
    if ! command -v npm >/dev/null 2>&1; then
        log "installing nodejs and npm for E2B's JS SDKs (log: $APT_LOG)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs npm >>"$APT_LOG" 2>&1 \
            || die "apt-get install nodejs npm failed; read $APT_LOG"
    fi
    if ! node_is_recent; then
        # Debian 12 ships Node 18; the SDKs refuse it. gateway/tests/e2e/e2b_js.rs then fails
        # naming this directory, and this line says what to install.
        log "node $(node --version 2>/dev/null || echo missing) is older than the 20.18.1 E2B's JS SDKs need:" \
            "install Node 20 or newer (e.g. nodesource's nodejs 20), then run setup again"
        return
    fi
    if [[ -f $JS_DIR/node_modules/e2b/package.json && -f $JS_DIR/node_modules/@e2b/code-interpreter/package.json ]] \
        && grep -q '"version": "2.51.0"' "$JS_DIR/node_modules/e2b/package.json"; then
        log "JS test environment ready ($JS_DIR)"
        return
    fi
    mkdir -p "$JS_DIR"
    npm install --prefix "$JS_DIR" --no-audit --no-fund --save-exact "${JS_PACKAGES[@]}" >>"$APT_LOG" 2>&1 \
        || die "npm install ${JS_PACKAGES[*]} into $JS_DIR failed; read $APT_LOG"
    log "JS test environment made ($JS_DIR: ${JS_PACKAGES[*]})"
}

main() {
    require_root
    local start=$SECONDS
    exec 8>"$LOCK_FILE"
    if ! flock -n 8; then
        log "another setup is running; waiting for it"
        flock 8
    fi
    install_packages
    register_runsc
    start_dockerd
    check_runtime
    build_images
    smoke_test
    check_postgres
    python_env
    js_env
    log "done in $((SECONDS - start))s"
}

main "$@"

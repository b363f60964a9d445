# shellcheck shell=bash
# Helpers shared by the scripts in scripts/. Source this file; do not execute it.
# Callers set SG_LOG_PREFIX (e.g. "setup") before logging.

log() { printf '%s: %s\n' "${SG_LOG_PREFIX:-sandgate}" "$*"; }

warn() { printf '%s: warning: %s\n' "${SG_LOG_PREFIX:-sandgate}" "$*" >&2; }

# die MESSAGE: print what went wrong and what to do about it, then exit 1.
die() {
    printf '%s: error: %s\n' "${SG_LOG_PREFIX:-sandgate}" "$*" >&2
    exit 1
}

require_root() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (try: sudo $0)"
}

# pkg_installed NAME: true when dpkg reports NAME as fully installed.
pkg_installed() {
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]
}

# docker_answers: true when the daemon answers `docker info` within 10 s.
docker_answers() {
    timeout 10 docker info >/dev/null 2>&1
}

#!/usr/bin/env bash
# A test network of this machine's own: network namespace `sgtest`, joined to the host by a veth
# pair (host side `sg-host` 198.51.100.1/24, namespace side `sg-ns` 198.51.100.2/24). Tests start
# their upstream servers inside the namespace and reach them at 198.51.100.2 from the host, so
# that traffic never leaves the machine and never uses loopback (which the egress proxy always
# denies). No routing or forwarding is set up: the namespace reaches nothing but the host side.
#
#   scripts/netns.sh up     create what is missing (idempotent; safe to run concurrently)
#   scripts/netns.sh down   remove it all (idempotent)
#   scripts/netns.sh check  exit 0 when both ends are up with their addresses
#
# Needs root and iproute2 (`ip netns`, veth). This kernel has no dummy interfaces, hence veth.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
export SG_LOG_PREFIX=netns

NS=sgtest
HOST_IF=sg-host
NS_IF=sg-ns
HOST_ADDR=198.51.100.1/24
NS_ADDR=198.51.100.2/24
LOCK=/run/sandgate-netns.lock

# (Outputs are captured, not piped into `grep -q`: with pipefail, grep's early exit would fail
# the pipeline through SIGPIPE.)
ns_exists() { [[ " $(ip netns list | cut -d' ' -f1 | tr '\n' ' ') " == *" $NS "* ]]; }
link_exists() { ip link show "$1" >/dev/null 2>&1; }
ns_link_exists() { ip -n "$NS" link show "$1" >/dev/null 2>&1; }
# has_addr IFACE ADDR/LEN [ip options]: IFACE carries ADDR.
has_addr() { [[ $(ip "${@:3}" addr show dev "$1" 2>/dev/null) == *"inet $2 "* ]]; }
# link_up IFACE [ip options]: IFACE is up with a carrier.
link_up() { [[ $(ip "${@:2}" link show "$1" 2>/dev/null) == *"LOWER_UP"* ]]; }

up() {
    ns_exists || ip netns add "$NS"
    # A half-made pair (the peer never moved, or the namespace was recreated) is rebuilt.
    if link_exists "$HOST_IF" && ! ns_link_exists "$NS_IF"; then
        if link_exists "$NS_IF"; then
            ip link set "$NS_IF" netns "$NS"
        else
            ip link del "$HOST_IF"
        fi
    fi
    if ! link_exists "$HOST_IF"; then
        link_exists "$NS_IF" && ip link del "$NS_IF"
        ip link add "$HOST_IF" type veth peer name "$NS_IF"
        ip link set "$NS_IF" netns "$NS"
    fi
    has_addr "$HOST_IF" "$HOST_ADDR" || ip addr add "$HOST_ADDR" dev "$HOST_IF"
    has_addr "$NS_IF" "$NS_ADDR" -n "$NS" || ip -n "$NS" addr add "$NS_ADDR" dev "$NS_IF"
    ip link set "$HOST_IF" up
    ip -n "$NS" link set lo up
    ip -n "$NS" link set "$NS_IF" up
    # The link takes a moment to come up.
    for _ in $(seq 1 50); do
        check && return 0
        sleep 0.1
    done
    die "namespace $NS is set up but the veth pair $HOST_IF/$NS_IF has no carrier"
}

down() {
    link_exists "$HOST_IF" && ip link del "$HOST_IF"
    ns_exists && ip netns del "$NS"
    return 0
}

check() {
    ns_exists && link_up "$HOST_IF" && link_up "$NS_IF" -n "$NS" \
        && has_addr "$HOST_IF" "$HOST_ADDR" && has_addr "$NS_IF" "$NS_ADDR" -n "$NS"
}

require_root
command -v ip >/dev/null || die "iproute2 (ip) is not installed: apt-get install iproute2"
exec 9>"$LOCK"
flock 9
case "${1:-}" in
    up) up && log "up: $HOST_IF ${HOST_ADDR} <-> $NS/$NS_IF ${NS_ADDR}" ;;
    down) down && log "down" ;;
    check) check ;;
    *) die "usage: $0 up|down|check" ;;
esac

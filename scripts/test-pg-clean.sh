#!/usr/bin/env bash
# Stops and removes the test PostgreSQL cluster of this checkout (target/test-pg), and every
# cluster relocated under /var/lib/sandgate/pg whose data_dir no longer exists. A checkout
# under a private directory (a fresh clone in `mktemp -d`) has its test cluster relocated
# there (the postgres user cannot enter the checkout), and nothing else removes it: each CI
# run left ~3 GB of test databases behind. `.ci/run` calls this after `make test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

readonly RELOCATED=/var/lib/sandgate/pg
readonly PG_BIN=/usr/lib/postgresql/15/bin
own="$(pwd)/target/test-pg"

# Stops the cluster in $1 (a directory holding `data`) if a server runs there.
stop_cluster() {
    local pgdata="$1/data"
    if [[ -f "$pgdata/postmaster.pid" ]]; then
        runuser -u postgres -- "$PG_BIN/pg_ctl" stop -D "$pgdata" -m fast -w >/dev/null 2>&1 || true
    fi
}

if [[ -d "$own/pg" ]]; then
    stop_cluster "$own/pg"
fi
if [[ -d "$RELOCATED" ]]; then
    for cluster in "$RELOCATED"/*/; do
        cluster="${cluster%/}"
        [[ -f "$cluster/data_dir" ]] || continue
        data_dir="$(cat "$cluster/data_dir")"
        if [[ "$data_dir" == "$own" || ! -e "$data_dir" ]]; then
            stop_cluster "$cluster"
            rm -rf "$cluster"
            echo "test-pg-clean: removed $cluster (data_dir $data_dir)"
        fi
    done
fi
rm -rf "$own"

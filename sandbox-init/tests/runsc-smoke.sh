#!/usr/bin/env bash
# sandbox-init as PID 1 inside real gVisor containers, started the way the gateway starts them
# (read-only root, uid 65534, no capabilities, no network, log driver none, init bind-mounted
# read-only). Needs dockerd with the `runsc` runtime and the image(s) named below.
#
#   sandbox-init/tests/runsc-smoke.sh [path/to/static/sandbox-init]
#
# Without an argument it builds the static binary (CARGO_TARGET_DIR is honoured).
# SANDGATE_IMAGE (default sandgate/bash) must have bash, grep, sleep and cat;
# SANDGATE_PYTHON_IMAGE (default sandgate/python) is used for one case, skipped if absent.
set -euo pipefail

image=${SANDGATE_IMAGE:-sandgate/bash}
python_image=${SANDGATE_PYTHON_IMAGE:-sandgate/python}
root=$(cd "$(dirname "$0")/../.." && pwd)

if [[ $# -ge 1 ]]; then
  init=$(realpath "$1")
else
  target_dir=${CARGO_TARGET_DIR:-$root/target}
  (cd "$root" && RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --quiet --release -p sandbox-init --target x86_64-unknown-linux-gnu)
  init=$target_dir/x86_64-unknown-linux-gnu/release/sandbox-init
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0

# sandbox NAME [docker run options...] -- IMAGE: runs one container, spec on stdin.
sandbox() {
  local name=$1
  shift
  docker run --rm -i --name "sandgate-init-smoke-$name-$$" --runtime runsc --network none \
    --read-only --user 65534 --cap-drop ALL --security-opt no-new-privileges \
    --pids-limit 64 --memory 256m --memory-swap 256m \
    --tmpfs /workspace:size=64m,mode=1777 --tmpfs /tmp:size=64m,mode=1777 \
    --tmpfs /output:size=64m,mode=1777 --log-driver none \
    -e PATH=/usr/local/bin:/usr/bin:/bin -e HOME=/tmp -e LANG=C.UTF-8 \
    -v "$init:/sandgate/init:ro" --entrypoint /sandgate/init "$@"
}

b64() { printf '%s' "$1" | base64 -w0; }

# A spec that writes SCRIPT to /tmp/sandgate/main.sh and runs it with bash.
script_spec() {
  printf '{"argv":["bash","/tmp/sandgate/main.sh"],"files":[{"path":"/tmp/sandgate/main.sh","content_b64":"%s"}]}' "$(b64 "$1")"
}

# check NAME WANT_RC WANT_STDOUT WANT_STDERR_PREFIX SPEC [IMAGE]
check() {
  local name=$1 want_rc=$2 want_out=$3 want_err=$4 spec=$5 img=${6:-$image}
  local rc=0 start end
  start=$(date +%s)
  sandbox "$name" "$img" <<<"$spec" >"$work/out" 2>"$work/err" || rc=$?
  end=$(date +%s)
  local out err
  out=$(cat "$work/out")
  err=$(cat "$work/err")
  if [[ $rc == "$want_rc" && $out == "$want_out" && $err == "$want_err"* ]]; then
    passed=$((passed + 1))
    printf 'ok   %-28s rc=%s %ss\n' "$name" "$rc" "$((end - start))"
  else
    failed=$((failed + 1))
    printf 'FAIL %-28s rc=%s (want %s)\n  stdout: %q (want %q)\n  stderr: %q (want prefix %q)\n' \
      "$name" "$rc" "$want_rc" "$out" "$want_out" "$err" "$want_err"
  fi
}

check exit-status 3 hi "err" "$(script_spec 'echo hi; echo err >&2; sleep 1 & exit 3')"
check pid-1-and-cwd 0 $'1\n/workspace\n0' "" \
  "$(script_spec 'echo $PPID; pwd; wc -c')"
check not-found 127 "" 'sandgate-init: cannot run "no-such-command": No such file or directory' \
  '{"argv":["no-such-command"]}'
check not-executable 126 "" 'sandgate-init: cannot run "/tmp/x": Permission denied' \
  "{\"argv\":[\"/tmp/x\"],\"files\":[{\"path\":\"/tmp/x\",\"content_b64\":\"$(b64 'echo hi')\"}]}"
check executable-mode 0 hi "" \
  "{\"argv\":[\"./x\"],\"cwd\":\"/tmp\",\"files\":[{\"path\":\"/tmp/x\",\"content_b64\":\"$(b64 $'#!/bin/sh\necho hi')\",\"mode\":493}]}"
check bad-json 125 "" "sandgate-init: job spec is not valid: " 'not json'
check empty-stdin 125 "" "sandgate-init: no job spec on stdin" ''
check unknown-field 125 "" "sandgate-init: job spec is not valid: unknown field" \
  '{"argv":["true"],"env":{}}'
check path-escape 125 "" 'sandgate-init: file path "/workspace/../etc/x": has a' \
  '{"argv":["true"],"files":[{"path":"/workspace/../etc/x","content_b64":""}]}'
check path-outside 125 "" 'sandgate-init: file path "/etc/passwd": must name' \
  '{"argv":["true"],"files":[{"path":"/etc/passwd","content_b64":""}]}'
check output-file 0 "data" "" \
  "{\"argv\":[\"cat\",\"/output/a/b.txt\"],\"files\":[{\"path\":\"/output/a/b.txt\",\"content_b64\":\"$(b64 data)\"}]}"
check killed-by-sigkill 137 "" "" "$(script_spec 'kill -9 $$')"
check killed-by-sigterm 143 "" "" "$(script_spec 'kill -TERM $$')"
check background-killed 0 started "" "$(script_spec 'sleep 300 & (sleep 300 &); echo started')"
# An orphan (the inner sleep, re-parented to PID 1) exits during the sleep; then no child of
# PID 1 may be a zombie.
check orphans-reaped 0 "" "" "$(script_spec '(sleep 0.2 &); sleep 1.5
for f in /proc/[0-9]*/stat; do read -r p c s pp rest <"$f"; [ "$pp" = 1 ] && [ "$s" = Z ] && echo "zombie $p $c"; done; exit 0')"
check clean-signal-state 0 $'SigBlk:\t0000000000000000' "" \
  '{"argv":["grep","^SigBlk:","/proc/self/status"]}'

# Signals from outside: docker kill --signal and docker stop reach PID 1, which forwards them.
signal_case() {
  local name=$1 how=$2 want_rc=$3
  local rc=0
  sandbox "$name" "$image" <<<"$(script_spec 'trap "echo got-term; exit 42" TERM; echo ready; while :; do sleep 0.1; done')" \
    >"$work/out" 2>"$work/err" &
  local pid=$!
  for _ in $(seq 100); do grep -q ready "$work/out" 2>/dev/null && break; sleep 0.1; done
  $how "sandgate-init-smoke-$name-$$" >/dev/null
  wait "$pid" || rc=$?
  if [[ $rc == "$want_rc" ]] && grep -q got-term "$work/out"; then
    passed=$((passed + 1))
    printf 'ok   %-28s rc=%s\n' "$name" "$rc"
  else
    failed=$((failed + 1))
    printf 'FAIL %-28s rc=%s (want %s) stdout=%q\n' "$name" "$rc" "$want_rc" "$(cat "$work/out")"
  fi
}
signal_case docker-kill-term "docker kill --signal TERM" 42
signal_case docker-stop "docker stop --time 10" 42

# stdin left open by the caller must not keep the container alive.
rc=0
start=$(date +%s)
{ printf '%s\n' '{"argv":["true"]}'; sleep 20; } | sandbox stdin-open "$image" >/dev/null 2>&1 || rc=$?
if [[ $rc == 0 && $(($(date +%s) - start)) -lt 15 ]]; then
  passed=$((passed + 1)); echo "ok   stdin-open"
else
  failed=$((failed + 1)); echo "FAIL stdin-open rc=$rc after $(($(date +%s) - start))s"
fi

if docker image inspect "$python_image" >/dev/null 2>&1; then
  check python 0 "4" "" \
    "{\"argv\":[\"python3\",\"/tmp/sandgate/main.py\"],\"files\":[{\"path\":\"/tmp/sandgate/main.py\",\"content_b64\":\"$(b64 'print(2 + 2)')\"}]}" \
    "$python_image"
else
  echo "skip python (no image $python_image)"
fi

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]

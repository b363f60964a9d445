#!/usr/bin/env bash
# Scripts below are sent verbatim into the sandbox: their $ must not expand here.
# shellcheck disable=SC2016
#
# sandbox-init as PID 1 inside real gVisor containers, started the way the gateway starts them
# (read-only root, uid 65534, no capabilities, no network, log driver none, init bind-mounted
# read-only). Needs dockerd with the `runsc` runtime and the image(s) named below.
#
# Two facts found with it that the gateway must live with:
# - under runsc the pids cgroup counts the sentry's own host threads (about 45 for an idle
#   sandbox), so --pids-limit 64 kills sandboxes at random with exit status 2 (the Go runtime
#   failing to create a thread) as soon as a few processes fork; 256 is used here;
# - docker's --tmpfs is noexec unless told `exec`: /workspace has it here, /tmp does not, and
#   a case checks each.
#
#   sandbox-init/tests/runsc-smoke.sh [path/to/static/sandbox-init]
#
# Without an argument it builds the static binary (CARGO_TARGET_DIR is honoured).
# SANDGATE_IMAGE (default sandgate/bash) must have bash, grep, sleep and cat;
# SANDGATE_PYTHON_IMAGE (default sandgate/python) is used for two cases, skipped if absent.
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
    --pids-limit 256 --memory 256m --memory-swap 256m \
    --tmpfs /workspace:size=64m,mode=1777,exec --tmpfs /tmp:size=64m,mode=1777 \
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
check not-executable 126 "" 'sandgate-init: cannot run "/workspace/x": Permission denied' \
  "{\"argv\":[\"/workspace/x\"],\"files\":[{\"path\":\"/workspace/x\",\"content_b64\":\"$(b64 'echo hi')\"}]}"
check executable-mode 0 hi "" \
  "{\"argv\":[\"./x\"],\"files\":[{\"path\":\"/workspace/x\",\"content_b64\":\"$(b64 $'#!/bin/sh\necho hi')\",\"mode\":493}]}"
check noexec-tmp 126 "" 'sandgate-init: cannot run "/tmp/x": Permission denied' \
  "{\"argv\":[\"/tmp/x\"],\"files\":[{\"path\":\"/tmp/x\",\"content_b64\":\"$(b64 $'#!/bin/sh\necho hi')\",\"mode\":493}]}"
check bad-json 125 "" "sandgate-init: job spec is not valid: " 'not json'
check empty-stdin 125 "" "sandgate-init: no job spec on stdin" ''
check unknown-field 125 "" "sandgate-init: job spec is not valid: unknown field" \
  '{"argv":["true"],"environment":{}}'
check path-escape 125 "" 'sandgate-init: file path "/workspace/../etc/x": has a' \
  '{"argv":["true"],"files":[{"path":"/workspace/../etc/x","content_b64":""}]}'
check path-outside 125 "" 'sandgate-init: file path "/etc/passwd": must name' \
  '{"argv":["true"],"files":[{"path":"/etc/passwd","content_b64":""}]}'
check output-file 0 "data" "" \
  "{\"argv\":[\"cat\",\"/output/a/b.txt\"],\"files\":[{\"path\":\"/output/a/b.txt\",\"content_b64\":\"$(b64 data)\"}]}"
# The shape the gateway sends today (runtime::JobSpec): cwd, env and mode spelled out.
check gateway-shape 0 $'/workspace\nC.UTF-8 /tmp only' "" \
  "{\"argv\":[\"bash\",\"/tmp/sandgate/main.sh\"],\"cwd\":\"/workspace\",\"env\":{\"HOME\":\"/tmp\",\"LANG\":\"C.UTF-8\",\"PATH\":\"/usr/bin:/bin\",\"X\":\"only\"},\"files\":[{\"path\":\"/tmp/sandgate/main.sh\",\"content_b64\":\"$(b64 'pwd; echo "$LANG $HOME $X"')\",\"mode\":420}]}"
check killed-by-sigkill 137 "" "" "$(script_spec 'kill -9 $$')"
check killed-by-sigterm 143 "" "" "$(script_spec 'kill -TERM $$')"
check background-killed 0 started "" "$(script_spec 'sleep 300 & (sleep 300 &); echo started')"
# An orphan (the inner sleep, re-parented to PID 1) exits during the sleep; afterwards the
# script itself must be PID 1's only child: an unreaped orphan would show as "(sleep) Z".
check orphans-reaped 0 "(bash) R" "" "$(script_spec '(sleep 0.2 &); sleep 1.5
for f in /proc/[0-9]*/stat; do read -r p c s pp rest <"$f"; [ "$pp" = 1 ] && echo "$c $s"; done; exit 0')"

# Signals from outside: docker kill --signal and docker stop reach PID 1, which forwards them.
signal_case() {
  local name=$1 how=$2 want_rc=$3
  local rc=0
  : >"$work/out"
  sandbox "$name" "$image" <<<"$(script_spec 'trap "echo got-term; exit 42" TERM; echo ready; while :; do sleep 0.1; done')" \
    >"$work/out" 2>"$work/err" &
  local pid=$!
  for _ in $(seq 100); do grep -q ready "$work/out" 2>/dev/null && break; sleep 0.1; done
  $how "sandgate-init-smoke-$name-$$" >/dev/null || true
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

# A SIGTERM that reaches PID 1 before the spec does is kept, and ends the program at once.
rc=0
start=$(date +%s)
sandbox early-term "$image" < <(sleep 3; script_spec 'sleep 60') >/dev/null 2>&1 &
pid=$!
sleep 1.5
docker kill --signal TERM "sandgate-init-smoke-early-term-$$" >/dev/null || true
wait "$pid" || rc=$?
if [[ $rc == 143 && $(($(date +%s) - start)) -lt 20 ]]; then
  passed=$((passed + 1)); echo "ok   early-term                   rc=$rc"
else
  failed=$((failed + 1)); echo "FAIL early-term rc=$rc (want 143) after $(($(date +%s) - start))s"
fi

# stdin left open by the caller must not keep the container alive.
rc=0
start=$(date +%s)
sandbox stdin-open "$image" < <(printf '%s\n' '{"argv":["true"]}'; sleep 20) >/dev/null 2>&1 || rc=$?
if [[ $rc == 0 && $(($(date +%s) - start)) -lt 15 ]]; then
  passed=$((passed + 1)); echo "ok   stdin-open"
else
  failed=$((failed + 1)); echo "FAIL stdin-open rc=$rc after $(($(date +%s) - start))s"
fi

if docker image inspect "$python_image" >/dev/null 2>&1; then
  check python 0 "4" "" \
    "{\"argv\":[\"python3\",\"/tmp/sandgate/main.py\"],\"files\":[{\"path\":\"/tmp/sandgate/main.py\",\"content_b64\":\"$(b64 'print(2 + 2)')\"}]}" \
    "$python_image"
  # gVisor's /proc/PID/status has no SigBlk line: ask the program itself. python3 leaves the
  # mask it inherits alone, so an empty list means the init's blocked signals did not leak.
  check clean-signal-mask 0 "set()" "" \
    '{"argv":["python3","-c","import signal; print(signal.pthread_sigmask(signal.SIG_BLOCK, []))"]}' \
    "$python_image"
else
  echo "skip python cases (no image $python_image)"
fi

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]

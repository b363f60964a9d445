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
# The proxy bridge cases serve a Unix socket from the host (python3 needed there) in a
# directory mounted at /run/sandgate, as the gateway mounts the egress socket's. Under runsc
# `--network none` still gives the sandbox `lo` (127.0.0.1 and ::1), which the bridge listens
# on; the socket is reachable only because runsc runs with `--host-uds=open`, and only if uid
# 65534 may search its directory and write to it (else: EACCES, reported by the bridge).
#
#   sandbox-init/tests/runsc-smoke.sh [path/to/static/sandbox-init]
#
# Without an argument it builds the static binary (CARGO_TARGET_DIR is honoured).
# SANDGATE_IMAGE (default sandgate/bash) must have bash, grep, sleep and cat;
# SANDGATE_PYTHON_IMAGE (default sandgate/python) is used for the python and most bridge
# cases, skipped if absent.
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
server=
trap '[[ -n $server ]] && kill "$server"; rm -rf "$work"' EXIT
passed=0
failed=0
# Extra `docker run` options for the next cases (the bridge's socket mount).
sandbox_opts=()

# sandbox NAME [docker run options...] -- IMAGE: runs one container, spec on stdin.
sandbox() {
  local name=$1
  shift
  docker run --rm -i --name "sandgate-init-smoke-$name-$$" --runtime runsc --network none \
    --read-only --user 65534 --cap-drop ALL --security-opt no-new-privileges \
    --pids-limit 256 --memory 256m --memory-swap 256m \
    --tmpfs /workspace:size=64m,mode=1777,exec --tmpfs /tmp:size=64m,mode=1777 \
    --tmpfs /output:size=64m,mode=1777 --log-driver none --ulimit nofile=1024:1024 \
    -e PATH=/usr/local/bin:/usr/bin:/bin -e HOME=/tmp -e LANG=C.UTF-8 \
    -v "$init:/sandgate/init:ro" "${sandbox_opts[@]}" --entrypoint /sandgate/init "$@"
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

# The proxy bridge. Host side: a Unix socket server whose answer depends on what it gets
# first. "HOLD...": never answers nor closes; "PING...": echoes each chunk; "BYE": answers
# "bye" and closes at once; "HALF": answers "half", half-closes, waits a second and counts
# what it gets until EOF, which "REPORT" then answers; an HTTP request
# head: 200 with its request line as the body; anything else: "echo:" + all it got once the
# client has half-closed.
egress=$work/egress
mkdir -m 755 "$egress"
python3 - "$egress/egress.sock" <<'EOF' &
import socket, sys, threading, time
half_done, half_got = threading.Event(), [0]
def serve(conn):
    data = conn.recv(65536)
    if data.startswith(b"HOLD"):
        time.sleep(3600)
    elif data.startswith(b"BYE"):
        conn.sendall(b"bye")
    elif data.startswith(b"HALF"):
        conn.sendall(b"half")
        conn.shutdown(socket.SHUT_WR)
        time.sleep(1)  # so that the program's FIN arrives before all its bytes are relayed
        got = len(data) - 4
        while chunk := conn.recv(65536):
            got += len(chunk)
        half_got[0] = got
        half_done.set()
    elif data.startswith(b"REPORT"):
        half_done.wait(10)
        conn.sendall(b"%d" % half_got[0])
    elif data.startswith(b"PING"):
        while data:
            conn.sendall(data)
            data = conn.recv(65536)
    else:
        while data and b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        if b"\r\n\r\n" in data:
            line = data.split(b"\r\n", 1)[0]
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            conn.sendall(head % len(line) + line)
        else:
            conn.sendall(b"echo:" + data)
    conn.close()
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen(512)
while True:
    threading.Thread(target=serve, args=(listener.accept()[0],), daemon=True).start()
EOF
server=$!
for _ in $(seq 50); do [[ -S $egress/egress.sock ]] && break; sleep 0.1; done
chmod 666 "$egress/egress.sock"
sandbox_opts=(-v "$egress:/run/sandgate")
proxy='"proxy":{"listen":"127.0.0.1:3128","socket":"/run/sandgate/egress.sock"}'
# py_spec SCRIPT [PROXY]: python3 runs SCRIPT with the proxy variables set, behind the bridge.
py_spec() {
  printf '{"argv":["python3","/tmp/sandgate/main.py"],"files":[{"path":"/tmp/sandgate/main.py","content_b64":"%s"}],"env":{"PATH":"/usr/local/bin:/usr/bin:/bin","HTTP_PROXY":"http://127.0.0.1:3128","http_proxy":"http://127.0.0.1:3128"},%s}' \
    "$(b64 "$1")" "${2:-$proxy}"
}
bash_spec() { # bash_spec SCRIPT: as script_spec, behind the bridge
  printf '{"argv":["bash","/tmp/sandgate/main.sh"],"files":[{"path":"/tmp/sandgate/main.sh","content_b64":"%s"}],%s}' \
    "$(b64 "$1")" "$proxy"
}
check bridge-bash-dev-tcp 0 "HTTP/1.1 200 OK" "" "$(bash_spec 'exec 3<>/dev/tcp/127.0.0.1/3128
printf "GET http://example.invalid/ HTTP/1.1\r\nHost: example.invalid\r\n\r\n" >&3
head -1 <&3 | tr -d "\r"')"
if docker image inspect "$python_image" >/dev/null 2>&1; then
  check bridge-half-close 0 "b'echo:hello'" "" "$(py_spec 'import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"hello")
s.shutdown(socket.SHUT_WR)
print(s.recv(100))')" "$python_image"
  check bridge-bulk 0 "True" "" "$(py_spec 'import socket, threading
s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
sent = bytes(range(256)) * (64 << 10)
def send():
    s.sendall(sent)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=send).start()
got = bytearray()
while chunk := s.recv(1 << 16):
    got += chunk
print(got == b"echo:" + sent)')" "$python_image"
  # The proxy half-closes first and reads slowly; the program's FIN arrives while its last
  # bytes are still to be relayed (gVisor then reports POLLHUP | POLLERR on the TCP socket).
  check bridge-proxy-half-closes-first 0 "b'half' b'100000'" "" "$(py_spec 'import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"HALF")
got = b""
while chunk := s.recv(100):
    got += chunk
s.sendall(b"x" * 100000)
s.close()
r = socket.create_connection(("127.0.0.1", 3128), timeout=10)
r.sendall(b"REPORT")
print(got, r.recv(100))')" "$python_image"
  # The proxy hangs up while the program keeps its end open: the relay must wait, not spin
  # (on Linux poll reports such a hang-up on every call; gVisor does not, for host sockets).
  check bridge-idle-after-hang-up 0 "b'bye' idle" "" "$(py_spec 'import os, socket, time
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"BYE")
data = b""
while chunk := s.recv(100):
    data += chunk
def cpu_of_init():
    fields = open("/proc/1/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
before = cpu_of_init()
time.sleep(1.5)
used = cpu_of_init() - before
print(data, "idle" if used < 0.3 else f"busy for {used}s")')" "$python_image"
  check bridge-ipv6-loopback 0 "b'PING6'" "" "$(py_spec 'import socket
s = socket.create_connection(("::1", 3128), timeout=10)
s.sendall(b"PING6")
print(s.recv(100))' '"proxy":{"listen":"[::1]:3128","socket":"/run/sandgate/egress.sock"}')" \
    "$python_image"
  # The standard proxy variable: urllib sends the absolute-form request line through it.
  check bridge-proxy-env 0 "GET http://example.invalid/path?q=1 HTTP/1.1" "" "$(py_spec 'import urllib.request
print(urllib.request.urlopen("http://example.invalid/path?q=1", timeout=10).read().decode())')" \
    "$python_image"
  check bridge-socket-missing 7 $'closed\nclosed' \
    'sandgate-init: proxy bridge: connecting to /run/sandgate/absent.sock: No such file or directory' \
    "$(py_spec 'import socket, sys
for _ in range(2):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    try:
        s.sendall(b"GET http://example.invalid/ HTTP/1.1\r\n\r\n")
        print("closed" if s.recv(100) == b"" else "data")
    except (ConnectionResetError, BrokenPipeError):
        print("closed")
sys.exit(7)' '"proxy":{"listen":"127.0.0.1:3128","socket":"/run/sandgate/absent.sock"}')" \
    "$python_image"
  # Relays still open when the program exits (one the server never answers, one blocked
  # writing to it): the init exits with the program's status all the same.
  check bridge-exit-while-relaying 5 "held" "" "$(py_spec 'import socket, sys
hold = socket.create_connection(("127.0.0.1", 3128))
hold.sendall(b"HOLD")
full = socket.create_connection(("127.0.0.1", 3128))
full.sendall(b"HOLD")
full.setblocking(False)
try:
    while True:
        full.send(b"x" * 65536)
except BlockingIOError:
    pass
print("held")
sys.exit(5)')" "$python_image"
  # 256 relays at once within the gateway's 1024 descriptors; the 257th is closed at once.
  check bridge-bound 0 $'held True\nnext False\nagain True' \
    "sandgate-init: proxy bridge: 256 connections open already; closing new ones until some end" \
    "$(py_spec 'import socket, time
def dial():
    return socket.create_connection(("127.0.0.1", 3128), timeout=10)
def echoed(s):
    try:
        s.sendall(b"PING")
        return s.recv(4) == b"PING"
    except (ConnectionResetError, BrokenPipeError):
        return False
held = [dial() for _ in range(256)]
print("held", all(echoed(s) for s in held))
print("next", echoed(dial()))
held.pop().close()
for _ in range(200):
    if echoed(dial()):
        print("again True")
        break
    time.sleep(0.05)')" "$python_image"
fi
sandbox_opts=()

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]

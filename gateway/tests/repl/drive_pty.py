"""Drives `sandgate repl` in a real pseudo-terminal, as a person at a keyboard would: typing,
the Up arrow, a multi-line block, Ctrl-C while code runs, Ctrl-C at the prompt, Ctrl-D.
Started by gateway/tests/e2e/repl.rs with the binary and a live gateway's URL (the key in
SANDGATE_KEY). Prints the whole transcript; exits 1 with it when something did not appear."""

import os
import pty
import select
import sys
import time

BIN, URL = sys.argv[1], sys.argv[2]
WAIT_S = 120


class Terminal:
    def __init__(self):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.environ["TERM"] = "xterm"
            os.execv(BIN, [BIN, "repl", "--url", URL])
        self.seen = b""
        self.at = 0

    def read_some(self, until):
        ready, _, _ = select.select([self.fd], [], [], max(0.0, until - time.monotonic()))
        if not ready:
            return False
        try:
            chunk = os.read(self.fd, 4096)
        except OSError:  # the child closed the terminal
            return None
        if not chunk:
            return None
        self.seen += chunk
        return True

    def expect(self, marker: bytes):
        """Waits for `marker` after what was matched last; answers cursor-position queries."""
        deadline = time.monotonic() + WAIT_S
        while True:
            if b"\x1b[6n" in self.seen[self.at:]:
                self.seen = self.seen.replace(b"\x1b[6n", b"", 1)
                os.write(self.fd, b"\x1b[1;1R")
            found = self.seen.find(marker, self.at)
            if found >= 0:
                self.at = found + len(marker)
                return
            if time.monotonic() > deadline or self.read_some(deadline) is None:
                fail(f"never saw {marker!r}")

    def type(self, keys: bytes):
        os.write(self.fd, keys)

    def drain(self):
        while self.read_some(time.monotonic() + 5) is not None:
            pass


def fail(why):
    print(term.seen.decode(errors="replace"))
    print(f"drive_pty: {why}", file=sys.stderr)
    sys.exit(1)


term = Terminal()
term.expect(b"Ctrl-D closes the session")
term.expect(b">>> ")
term.type(b"x = 41\r")
term.expect(b">>> ")
term.type(b"x + 1\r")
term.expect(b"42")
term.expect(b">>> ")
# History: Up recalls the last cell, Enter runs it again.
term.type(b"\x1b[A")
term.expect(b"x + 1")
term.type(b"\r")
term.expect(b"42")
term.expect(b">>> ")
# A block: the prompt continues until an empty line.
term.type(b"def double(a):\r")
term.expect(b"... ")
term.type(b"    return a * 2\r")
term.expect(b"... ")
term.type(b"\r")
term.expect(b">>> ")
term.type(b"double(x)\r")
term.expect(b"82")
term.expect(b">>> ")
# Ctrl-C while code runs interrupts it; the session and its state live on.
term.type(b"import time\r")
term.expect(b">>> ")
term.type(b"while True: time.sleep(0.1)\r")
time.sleep(3)
term.type(b"\x03")
term.expect(b"interrupting")
term.expect(b"ended: cancelled")
term.expect(b">>> ")
term.type(b"print('alive', x)\r")
term.expect(b"alive 41")
term.expect(b">>> ")
# Ctrl-C at the prompt drops the line typed; Ctrl-D closes the session.
term.type(b"x = 'never run'")
term.expect(b"never run")
term.type(b"\x03")
term.expect(b"KeyboardInterrupt")
term.expect(b">>> ")
term.type(b"x\r")
term.expect(b"41")
term.expect(b">>> ")
term.type(b"\x04")
term.expect(b"closed")
term.drain()
_, status = os.waitpid(term.pid, 0)
if os.waitstatus_to_exitcode(status) != 0:
    fail(f"sandgate repl exited with {os.waitstatus_to_exitcode(status)}")
print(term.seen.decode(errors="replace"))

//! Sessions: one sandbox, one resident runner, many jobs ("turns").
//!
//! The init is started as `session python|bash` ([`SESSION_MODE`]). The first line on its
//! stdin is an ordinary [`crate::Job`] that opens the session: its `env`, `cwd`, `proxy` and
//! `files` are the session's, its `argv` is ignored (the runner is chosen by the mode), and its
//! `exit_nonce` authenticates the init's exit trailer when the session ends. stdin then stays
//! open: every further line is a **turn**, again a [`crate::Job`], whose `argv` is exactly one
//! path (the cell: the code to run, written by the same line's `files`) and whose `exit_nonce`
//! is the turn's own secret. The **init** answers each turn by writing [`end_marker`] for that
//! nonce on **both** stdout and stderr once the runner reported the cell's end and the init
//! relayed everything the runner had written before (the runner's stdout and stderr are pipes
//! the init drains): each stream is in order, so once the gateway saw the marker on both,
//! everything the turn printed has arrived.
//!
//! # The runner's channel
//!
//! The runner never sees a turn's nonce. The init and the runner speak over one socket pair,
//! the runner's fd 0 (the init's end is its own):
//!
//! - init → runner: python: first the session's report key ([`REPORT_KEY_LEN`] hex digits,
//!   made by the init, one line), then one [`python_cell`] line per cell (`<seq> <path>`);
//!   bash: [`BASH_PRELUDE`], then one [`bash_turn`] command per cell (it carries the key);
//! - runner → init: one [`runner_report`] line per cell:
//!   `\n<key>:<seq>:<code>:<result_b64>[:<results_b64>]\n` (`results_b64`: the cell's rich
//!   results, [`RichResults`] as JSON in base64; python only). The init takes a report only with the session's
//!   key and the sequence number of the turn it is waiting for ([`parse_report`]); anything
//!   else on the socket is dropped.
//!
//! - python ([`PYTHON_SESSION_RUNNER`]): one interpreter; each cell is executed in one globals
//!   dict; a final expression's `repr` is the report's `result`; its MIME bundle (`text/plain`,
//!   and what its `_repr_html_`, `_repr_json_`, `_repr_png_`, ... give) and the figures the
//!   cell displayed through matplotlib (`plt.show()`, and those left open at its end, as PNG)
//!   are its rich results, at most [`MAX_RESULTS_BYTES`]; an exception prints its
//!   traceback and ends the turn with code 1; SIGINT (timeout, cancel) raises
//!   `KeyboardInterrupt` in the cell (code 130). The loop that reads cells and reports holds
//!   every function it uses from before the first cell ran, and keeps the key in its own frame:
//!   a cell that replaces `json.loads`, `repr` or `os.write`, or writes to the socket, cannot
//!   change what is reported for a later cell.
//! - bash: one `bash` reading [`bash_turn`] commands: the cell is sourced in the shell itself,
//!   so cwd, variables and functions persist; the code is the cell's last status.
//!
//! What the runner reports (status, result) is the interpreter's, and the program shares that
//! interpreter: code that deliberately reads the runner's own frame (Python) or redefines the
//! shell's builtins (bash) can change what is reported for a later cell of the same session.
//! Such code can even report for the next turn before that turn's code is done, ending it early
//! in the record (SECURITY.md). It cannot write an end marker itself, read a nonce, or reach
//! another session.

use serde::{Deserialize, Serialize};

/// A line whose `argv` is exactly this (and which writes no file) is not a turn but a report
/// request: the init answers at once on stderr with an exit trailer for the line's nonce
/// (code 0) carrying its [`crate::InitReport`] (what is in `/output` that the host cannot
/// see). The gateway asks after each turn, before it collects `/output`. It can never be a
/// cell: a cell is an absolute path.
pub const REPORT_REQUEST: &str = "sandgate:report";

/// First argument of a session sandbox's init.
pub const SESSION_MODE: &str = "session";
/// The runner names after [`SESSION_MODE`].
pub const SESSION_PYTHON: &str = "python";
pub const SESSION_BASH: &str = "bash";
/// Optional last argument of a session init started beside a running session's PID 1 (an
/// extra code context, `docker exec` as root: `session python|bash context`). It settles into
/// the init's identity as PID 1 does (see sandbox-init's `identity`), so the context's runner
/// can neither signal it nor read its nonces; it never quiesces the sandbox (only PID 1 does),
/// and it serves no proxy bridge (PID 1's serves the sandbox).
pub const SESSION_CONTEXT: &str = "context";

/// Starts a turn's end marker: `\0sandgate-end:<nonce>:<code>:<result>[:<results>]\n`, where
/// `result` is the base64 of the UTF-8 `repr` (empty: none) and `results` the base64 of the
/// [`RichResults`] JSON (absent or empty: none).
pub const END_MARKER_PREFIX: &[u8] = b"\0sandgate-end:";
/// Longest `repr` a marker carries, in bytes (the runner cuts it).
pub const MAX_RESULT_BYTES: usize = 64 * 1024;
/// Longest rich results a marker carries, in bytes of JSON (the runner leaves out whole MIME
/// values that would not fit, and says so with `truncated`).
pub const MAX_RESULTS_BYTES: usize = 4 * 1024 * 1024;
/// Base64 lengths of both.
const RESULT_B64: usize = MAX_RESULT_BYTES.div_ceil(3) * 4;
const RESULTS_B64: usize = MAX_RESULTS_BYTES.div_ceil(3) * 4;
/// Longest marker payload after the nonce: code, colon, the result, colon, the results,
/// newline.
const MAX_PAYLOAD: usize = 4 + 1 + RESULT_B64 + 1 + RESULTS_B64 + 1;

/// Length of the session's report key, in hex digits.
pub const REPORT_KEY_LEN: usize = 32;
/// Longest report line the init reads (key, sequence number, code, result, results,
/// separators).
pub const MAX_REPORT_LINE: usize = REPORT_KEY_LEN + 20 + 4 + RESULT_B64 + RESULTS_B64 + 8;

/// A cell's rich results, as the Python runner reports them (base64 JSON in the report's last
/// field): what Jupyter would display, in order: figures shown while the cell ran, the final
/// expression's MIME bundle (`main`), figures still open at its end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RichResults {
    pub results: Vec<RichResult>,
    /// The runner left out MIME values that did not fit [`MAX_RESULTS_BYTES`].
    #[serde(default)]
    pub truncated: bool,
}

/// One displayed value: MIME type → the base64 of the UTF-8 value as E2B's code interpreter
/// carries it (`image/png`: the PNG's base64 text; `application/json`: JSON text).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RichResult {
    pub main: bool,
    pub data: std::collections::BTreeMap<String, String>,
}

/// What the init hands the Python session runner per cell: `<seq> <program>\n`. The program is
/// a validated path (no control character).
pub fn python_cell(seq: u64, program: &str) -> Vec<u8> {
    format!("{seq} {program}\n").into_bytes()
}

/// A runner's report of a cell's end, as the init takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerReport {
    pub seq: u64,
    pub end: TurnEnd,
}

/// The line a runner writes on its channel when a cell ended (the leading newline ends
/// whatever a cell may have left unfinished on the socket).
pub fn runner_report(key: &str, seq: u64, code: u8, result_b64: &str) -> Vec<u8> {
    format!("\n{key}:{seq}:{code}:{result_b64}\n").into_bytes()
}

fn fits_b64(field: &str, most: usize) -> bool {
    field.len() <= most && field.bytes().all(is_b64)
}

/// Parses one report line (without its newlines); `None` unless it carries `key`.
pub fn parse_report(key: &str, line: &[u8]) -> Option<RunnerReport> {
    let text = std::str::from_utf8(line).ok()?;
    let mut fields = text.splitn(5, ':');
    let (given, seq, code, result_b64, results_b64) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next().unwrap_or(""),
    );
    let digits = |field: &str, most: usize| {
        !field.is_empty() && field.len() <= most && field.bytes().all(|b| b.is_ascii_digit())
    };
    if !constant_time_eq(given.as_bytes(), key.as_bytes())
        || !digits(seq, 20)
        || !digits(code, 3)
        || !fits_b64(result_b64, RESULT_B64)
        || !fits_b64(results_b64, RESULTS_B64)
    {
        return None;
    }
    Some(RunnerReport {
        seq: seq.parse().ok()?,
        end: TurnEnd {
            code: code.parse().ok()?,
            result_b64: result_b64.to_owned(),
            results_b64: results_b64.to_owned(),
        },
    })
}

/// Compares without stopping at the first difference (the key is a secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// The end marker of a turn without rich results (what the init writes; [`EndMarker`] takes
/// it out).
pub fn end_marker(nonce: &str, code: u8, result_b64: &str) -> Vec<u8> {
    turn_end_marker(
        nonce,
        &TurnEnd {
            code,
            result_b64: result_b64.to_owned(),
            results_b64: String::new(),
        },
    )
}

/// The end marker of a turn, with its rich results when it has some.
pub fn turn_end_marker(nonce: &str, end: &TurnEnd) -> Vec<u8> {
    let mut marker = END_MARKER_PREFIX.to_vec();
    marker.extend_from_slice(format!("{nonce}:{}:{}", end.code, end.result_b64).as_bytes());
    if !end.results_b64.is_empty() {
        marker.push(b':');
        marker.extend_from_slice(end.results_b64.as_bytes());
    }
    marker.push(b'\n');
    marker
}

/// The command the init writes to the session's bash for one turn. The cell is sourced in the
/// shell itself (so `cd`, `export` and functions persist) with stdin from `/dev/null`; then
/// the shell reports the cell's status on its fd 0 (the channel). `key` is hex, `program` a
/// validated path without a quote.
pub fn bash_turn(program: &str, key: &str, seq: u64) -> String {
    format!(
        "{{ . '{program}'; }} </dev/null; \
         builtin printf '\\n%s:%s:%d:\\n' {key} {seq} \"$?\" >&0\n"
    )
}

/// The first command of the session's bash: an interrupt (timeout, cancel) stops the running
/// command, not the shell.
pub const BASH_PRELUDE: &str = "trap 'printf \"sandgate: interrupted\\n\" >&2' INT\n";

/// The resident Python session runner, run as `python3 -c PYTHON_SESSION_RUNNER`.
pub const PYTHON_SESSION_RUNNER: &str = include_str!("session.py");

/// A turn's end, as the marker said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnEnd {
    pub code: u8,
    /// The base64 of the final expression's `repr`; empty: none.
    pub result_b64: String,
    /// The base64 of the cell's [`RichResults`] JSON; empty: none.
    pub results_b64: String,
}

/// Takes one turn's end marker out of a stream (stdout or stderr). Bytes that might begin the
/// marker (from a NUL on) are held back until they cannot; ordinary output passes at once.
/// Once the marker came, later bytes are dropped (output between turns belongs to none).
#[derive(Debug)]
pub struct EndMarker {
    prefix: Vec<u8>,
    held: Vec<u8>,
    end: Option<TurnEnd>,
}

impl EndMarker {
    pub fn new(nonce: &str) -> EndMarker {
        let mut prefix = END_MARKER_PREFIX.to_vec();
        prefix.extend_from_slice(nonce.as_bytes());
        prefix.push(b':');
        EndMarker {
            prefix,
            held: Vec::new(),
            end: None,
        }
    }

    /// The end, once the marker came.
    pub fn end(&self) -> Option<&TurnEnd> {
        self.end.as_ref()
    }

    /// Feeds a chunk; returns what may be passed on.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.end.is_some() {
            return Vec::new();
        }
        self.held.extend_from_slice(chunk);
        let mut from = 0;
        while let Some(offset) = self.held[from..].iter().position(|byte| *byte == 0) {
            let start = from + offset;
            let rest = &self.held[start..];
            if let Some(end) = complete(&self.prefix, rest) {
                self.end = Some(end);
                let released = self.held[..start].to_vec();
                self.held.clear();
                return released;
            }
            if could_begin(&self.prefix, rest) {
                let tail = self.held.split_off(start);
                return std::mem::replace(&mut self.held, tail);
            }
            from = start + 1;
        }
        std::mem::take(&mut self.held)
    }

    /// What is still held back (the stream ended without the marker).
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

fn complete(prefix: &[u8], bytes: &[u8]) -> Option<TurnEnd> {
    let rest = bytes.strip_prefix(prefix)?;
    let line = &rest[..rest.iter().position(|byte| *byte == b'\n')?];
    let text = std::str::from_utf8(line).ok()?;
    let mut fields = text.splitn(3, ':');
    let (code, result_b64, results_b64) = (fields.next()?, fields.next()?, fields.next());
    let results_b64 = results_b64.unwrap_or("");
    if code.is_empty()
        || code.len() > 3
        || !fits_b64(result_b64, RESULT_B64)
        || !fits_b64(results_b64, RESULTS_B64)
    {
        return None;
    }
    Some(TurnEnd {
        code: code.parse().ok()?,
        result_b64: result_b64.to_owned(),
        results_b64: results_b64.to_owned(),
    })
}

fn is_b64(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'+' | b'/' | b'=')
}

fn could_begin(prefix: &[u8], bytes: &[u8]) -> bool {
    if bytes.len() <= prefix.len() {
        return prefix.starts_with(bytes);
    }
    bytes.strip_prefix(prefix).is_some_and(|payload| {
        payload.len() <= MAX_PAYLOAD
            && payload
                .iter()
                .all(|byte| byte.is_ascii_digit() || *byte == b':' || is_b64(*byte))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(chunks: &[&[u8]]) -> (Vec<u8>, Option<TurnEnd>) {
        let mut marker = EndMarker::new("n0nce");
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend(marker.feed(chunk));
        }
        out.extend(marker.finish());
        (out, marker.end().cloned())
    }

    #[test]
    fn the_marker_is_taken_out_wherever_the_chunks_split() {
        let mut stream = b"42\n".to_vec();
        stream.extend(end_marker("n0nce", 0, "NDI="));
        stream.extend(b"late");
        let want = TurnEnd {
            code: 0,
            result_b64: "NDI=".into(),
            results_b64: String::new(),
        };
        for split in 0..stream.len() {
            let (before, after) = stream.split_at(split);
            assert_eq!(
                through(&[before, after]),
                (b"42\n".to_vec(), Some(want.clone())),
                "{split}"
            );
        }
    }

    #[test]
    fn forged_or_broken_markers_are_output() {
        let forged: &[u8] = b"\0sandgate-end:guess:0:\n\0x";
        assert_eq!(through(&[forged]), (forged.to_vec(), None));
        assert_eq!(through(&[b"a\0b"]), (b"a\0b".to_vec(), None));
        let bad: &[u8] = b"\0sandgate-end:n0nce:1234:\n";
        assert_eq!(through(&[bad]), (bad.to_vec(), None));
    }

    #[test]
    fn bash_turns_source_the_cell_and_report_on_the_channel() {
        let line = bash_turn("/tmp/sandgate/cell-1.sh", "abc", 7);
        assert!(line.starts_with("{ . '/tmp/sandgate/cell-1.sh'; } </dev/null;"));
        assert!(
            line.ends_with("'\\n%s:%s:%d:\\n' abc 7 \"$?\" >&0\n"),
            "{line}"
        );
    }

    #[test]
    fn reports_need_the_key_and_a_sane_form() {
        let key = "k".repeat(REPORT_KEY_LEN);
        let line = runner_report(&key, 3, 1, "NDI=");
        let want = RunnerReport {
            seq: 3,
            end: TurnEnd {
                code: 1,
                result_b64: "NDI=".into(),
                results_b64: String::new(),
            },
        };
        assert_eq!(parse_report(&key, line.trim_ascii()), Some(want.clone()));
        let rich = format!("{key}:3:1:NDI=:e30=");
        let mut with = want;
        with.end.results_b64 = "e30=".into();
        assert_eq!(parse_report(&key, rich.as_bytes()), Some(with.clone()));
        // What the init writes for it, the gateway takes out whole.
        let mut marker = EndMarker::new("n0nce");
        let mut stream = b"out".to_vec();
        stream.extend(turn_end_marker("n0nce", &with.end));
        assert_eq!(marker.feed(&stream), b"out");
        assert_eq!(marker.end(), Some(&with.end));
        let other = "j".repeat(REPORT_KEY_LEN);
        for bad in [
            runner_report(&other, 3, 1, "NDI="),
            format!("{key}:3:1234:").into_bytes(),
            format!("{key}:x:1:").into_bytes(),
            format!("{key}:3:1:a b").into_bytes(),
            format!("{key}:3:1::a:b").into_bytes(),
            format!("{key}:3:1").into_bytes(),
            b"".to_vec(),
        ] {
            assert_eq!(parse_report(&key, bad.trim_ascii()), None, "{bad:?}");
        }
    }

    #[test]
    fn the_python_runner_reads_the_turn_fields() {
        for name in ["def serve", "read(channel", "\\n%s:%s:%d:%s:%s\\n"] {
            assert!(
                PYTHON_SESSION_RUNNER.contains(name),
                "session.py lost {name}"
            );
        }
    }
}

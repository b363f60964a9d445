//! `sandbox-protocol`: the one definition of what the gateway and `sandbox-init` say to each
//! other. Both sides depend on it; neither writes these formats by hand.
//!
//! - [`Job`]: the one JSON line the gateway writes on the sandbox's stdin. A cold sandbox gets it
//!   right after the start; a pooled one (started ahead with [`POOL_MODE`]) when it is claimed.
//! - [`POOL_MODE`] and its arguments: a pooled sandbox's init waits for its job as a resident
//!   runner, first printing [`READY_LINE`] on stdout (python: once its interpreter has
//!   imported the preload, see [`PYTHON_RUNNER`]).
//! - [`RunnerJob`]: what the init hands the waiting Python interpreter once the job arrived.
//! - The exit trailer `\0sandgate-exit:<nonce>:<code>[:<report>]\n` ([`exit_trailer`],
//!   [`ExitTrailer`]): the init's last stderr bytes, the gateway's proof that the init saw the
//!   end, with what the init saw that the host cannot ([`InitReport`]: special files in
//!   `/output`). When the init also made sure nothing of the program is left, the trailer is
//!   preceded on stdout by the [`end_marker`] for the same nonce (with no result): each stream
//!   is in order, so a gateway that saw both has all of the program's output and knows it no
//!   longer runs ([`EndMarker`] takes it out of stdout).
//! - Sessions ([`SESSION_MODE`], turns, [`end_marker`], a python cell's [`RichResults`]): see
//!   the `session` module; a session's file operations ([`FileLine`], [`FileAnswer`]): the
//!   `files` module.
//! - A session's processes (E2B's `process.Process`): [`ATTACH_MODE`] and [`SIGNAL_MODE`], see
//!   the `procs` module (with PTY mode: [`PtySize`], [`PtyFrame`]).
//! - A session's directory watchers (E2B's `filesystem.Filesystem` watch calls): [`WATCH_MODE`],
//!   see the `watch` module.
//!
//! It is **not** a validator: `sandbox-init` validates every field before acting (`spec.rs`);
//! this crate only names the fields. Serde only: no I/O, no processes.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod files;
mod procs;
mod session;
mod trailer;
mod watch;

pub use files::{
    content_answer, file_answer, locate, FileAnswer, FileAnswerTaker, FileEntry, FileFailure,
    FileKind, FileLine, FileRequest, InPlace, FILE_ANSWER_PREFIX, FILE_PLACES, MAX_ANSWER_BYTES,
    MAX_FILE_BYTES, MAX_LIST_DEPTH, MAX_LIST_ENTRIES, MAX_NAME_BYTES, MAX_PATH_BYTES,
};

pub use procs::{
    attach_argv, signal_argv, signaled_status, valid_tag, ProcessSignal, PtyFrame, PtySize,
    ATTACH_MODE, INIT_PATH, MAX_PTY_FRAME, MAX_TAG, PROGRAM_USER, PTY_ARG_PREFIX, SIGNAL_MODE,
};
pub use session::{
    bash_turn, end_marker, parse_report, python_cell, runner_report, turn_end_marker, EndMarker,
    RichResult, RichResults, RunnerReport, TurnEnd, BASH_PRELUDE, END_MARKER_PREFIX,
    MAX_REPORT_LINE, MAX_RESULTS_BYTES, MAX_RESULT_BYTES, PYTHON_SESSION_RUNNER, REPORT_KEY_LEN,
    REPORT_REQUEST, SESSION_BASH, SESSION_CONTEXT, SESSION_MODE, SESSION_PYTHON,
};
pub use trailer::{
    exit_trailer, ExitTrailer, InitReport, EXIT_TRAILER_PREFIX, MAX_REPORT_BYTES, MAX_SPECIAL_FILES,
};
pub use watch::{
    watch_argv, WatchKind, WatchLine, FLUSH_REQUEST, MAX_WATCH_DIRS, MAX_WATCH_LINE, RECURSIVE_ARG,
    WATCH_MODE,
};

/// The job line. File contents borrow from the line when deserialised (base64 needs no JSON
/// escape), so a large job is not held twice by the init.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job<'a> {
    /// Program and arguments; never empty.
    pub argv: Vec<String>,
    /// Working directory; absent: `/workspace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The program's whole environment; absent: the container's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Files to create before the program starts, in order, never replacing anything.
    #[serde(default, borrow)]
    pub files: Vec<JobFile<'a>>,
    /// The in-sandbox bridge to the egress socket; absent without a network grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<JobProxy>,
    /// Set by the gateway per run: the secret that authenticates the exit trailer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_nonce: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile<'a> {
    pub path: String,
    #[serde(borrow)]
    pub content_b64: Cow<'a, str>,
    /// Permission bits; absent: `0o644`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

/// Where the bridge listens inside the sandbox, and the Unix socket it relays to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobProxy {
    pub listen: String,
    pub socket: String,
}

/// First argument of a pooled sandbox's init: `pool` (wait for the job), or
/// `pool python [MODULE...]` (wait with a Python interpreter that has imported the modules and
/// runs the program itself once the job arrives).
pub const POOL_MODE: &str = "pool";
/// The runner name after [`POOL_MODE`] for Python.
pub const PYTHON_RUNNER_NAME: &str = "python";
/// Printed on stdout, alone on its line, by a pooled sandbox once it waits for its job. The
/// gateway reads and drops everything up to it; nothing untrusted runs before the job, so
/// nothing can forge it.
pub const READY_LINE: &str = "sandgate-pool-ready";

/// What the init writes to the waiting interpreter's stdin once the job arrived and its files
/// are written: one JSON line. The interpreter runs `argv[1]` as `__main__` with `sys.argv =
/// argv[1:]`, in `cwd`, with exactly `env`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerJob {
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: BTreeMap<String, String>,
}

/// The resident Python runner, run as `python3 -c PYTHON_RUNNER READY_LINE MODULE...` by the
/// init of a pooled sandbox (see `runner.py` for what it guarantees).
pub const PYTHON_RUNNER: &str = include_str!("runner.py");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_round_trips_and_borrows_file_contents() {
        let line = r#"{"argv":["python3","/workspace/main.py"],"files":[{"path":"/workspace/a","content_b64":"YQ=="}],"exit_nonce":"abcdefabcdefabcd"}"#;
        let job: Job = serde_json::from_str(line).unwrap();
        assert!(matches!(job.files[0].content_b64, Cow::Borrowed("YQ==")));
        assert_eq!(serde_json::to_string(&job).unwrap(), line);
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(serde_json::from_str::<Job>(r#"{"argv":["x"],"user":"root"}"#).is_err());
        assert!(
            serde_json::from_str::<RunnerJob>(r#"{"argv":[],"cwd":"/","env":{},"x":1}"#).is_err()
        );
    }

    #[test]
    fn the_runner_is_told_the_ready_line_and_reads_the_runner_job_fields() {
        // The Python side is text: make sure it still speaks this crate's names.
        for name in ["\"argv\"", "\"cwd\"", "\"env\"", "sys.argv[1]"] {
            assert!(PYTHON_RUNNER.contains(name), "runner.py lost {name}");
        }
    }
}

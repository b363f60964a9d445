//! A session sandbox's init (`session python|bash`): one resident runner serving many turns
//! (the protocol is `sandbox_protocol`'s session module).
//!
//! The first stdin line opens the session (files, cwd, environment, the proxy bridge), then the
//! runner starts with that environment and stdin stays open: a thread reads every further
//! line (a turn) and wakes the init's signal loop, which writes the turn's files and hands the
//! cell to the runner, while it goes on forwarding signals (SIGINT is how the gateway
//! interrupts a cell) and reaping. The session ends when stdin closes (the runner's process
//! group is killed, exit 0) or when the runner dies (its status is the init's). A turn whose
//! files cannot be written is answered here: one `sandgate-init:` line and the end markers
//! with code 125; the session goes on.
//!
//! The init writes files as the program's user (its effective uid, see [`crate::identity`]),
//! and the program's leftovers may run while a turn's files are written: writing never follows
//! a symlink as the file itself, and a parent swapped for a symlink could only make the init
//! write where the program itself may write anyway. A line whose `argv` is exactly
//! [`REPORT_REQUEST`] is answered with the special files in `/output` ([`crate::leftovers`]).

use std::ffi::OsString;
use std::io::Write;
use std::process::ChildStdin;
use std::sync::mpsc;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use sandbox_protocol::{
    bash_turn, end_marker, exit_trailer, InitReport, RunnerTurn, BASH_PRELUDE,
    PYTHON_SESSION_RUNNER, REPORT_REQUEST, SESSION_BASH, SESSION_PYTHON,
};
use thiserror::Error;

use crate::process::{SuperviseError, Supervisor, WAKE_SIGNAL};
use crate::spec::{self, SpecError};
use crate::{bridge, files, leftovers, InitError};

/// What runs the session's cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    Python,
    Bash,
}

#[derive(Debug, Error)]
pub enum SessionError {
    #[error("a turn must name exactly one cell file and carry an exit_nonce")]
    Turn,
    #[error("turn: {0}")]
    Spec(SpecError),
    #[error("starting the session runner: {0}")]
    Start(SuperviseError),
}

impl Runner {
    /// Parses the arguments after `session`.
    pub fn parse(mut args: impl Iterator<Item = OsString>) -> Result<Runner, InitError> {
        let runner = match args.next() {
            Some(name) if name == SESSION_PYTHON => Runner::Python,
            Some(name) if name == SESSION_BASH => Runner::Bash,
            _ => return Err(InitError::Args),
        };
        match args.next() {
            None => Ok(runner),
            Some(_) => Err(InitError::Args),
        }
    }

    fn argv(self) -> Vec<String> {
        let argv: &[&str] = match self {
            Runner::Python => &["python3", "-c", PYTHON_SESSION_RUNNER],
            Runner::Bash => &["bash", "--norc", "--noprofile"],
        };
        argv.iter().map(|arg| (*arg).to_owned()).collect()
    }
}

/// Serves the session; returns the init's exit code.
pub fn run(
    supervisor: &Supervisor,
    runner: Runner,
    exit_nonce: &mut Option<String>,
) -> Result<u8, InitError> {
    let open = crate::read_job(std::io::stdin().lock())?;
    exit_nonce.clone_from(&open.exit_nonce);
    files::write_files(&open.files).map_err(InitError::Files)?;
    std::env::set_current_dir(&open.cwd).map_err(|err| InitError::Cwd {
        cwd: open.cwd.clone(),
        err,
    })?;
    let bridge = open
        .proxy
        .as_ref()
        .map(bridge::bind)
        .transpose()
        .map_err(InitError::Bridge)?;
    let mut child = supervisor
        .spawn_piped_with(&runner.argv(), open.env.as_ref())
        .map_err(|err| InitError::Session(SessionError::Start(err)))?;
    // After the spawn, as for a cold run (see `crate::run`).
    if let Some(bridge) = bridge {
        bridge.serve().map_err(InitError::Bridge)?;
    }
    let mut input = child.stdin.take();
    if runner == Runner::Bash {
        give(&mut input, BASH_PRELUDE.as_bytes());
    }
    let turns = read_turns();
    loop {
        let mut lines = Vec::new();
        let ended = supervisor
            .until(&mut child, || {
                lines.extend(turns.try_iter());
                !lines.is_empty()
            })
            .map_err(InitError::Supervise)?;
        if let Some(outcome) = ended {
            return Ok(outcome.exit_code());
        }
        for line in lines {
            let Ok(line) = line else {
                // stdin closed: the gateway ended the session.
                drop(input.take());
                if let Ok(pid) = i32::try_from(child.id()) {
                    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                }
                supervisor.run(child).map_err(InitError::Supervise)?;
                return Ok(0);
            };
            turn(runner, &line, &mut input)?;
        }
    }
}

/// Reads turn lines on a thread; each one (and the end of stdin) wakes the init's loop.
fn read_turns() -> mpsc::Receiver<Result<Vec<u8>, SpecError>> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        loop {
            let line = spec::read_spec_line(&mut stdin, spec::MAX_SPEC_LINE);
            let last = line.is_err();
            if sender.send(line).is_err() {
                return;
            }
            let _ = kill(Pid::this(), WAKE_SIGNAL);
            if last {
                return;
            }
        }
    });
    receiver
}

/// Writes a turn's files and hands its cell to the runner.
fn turn(runner: Runner, line: &[u8], input: &mut Option<ChildStdin>) -> Result<(), InitError> {
    let job = spec::parse_job(line).map_err(|err| InitError::Session(SessionError::Spec(err)))?;
    let (Some(nonce), [program]) = (&job.exit_nonce, job.argv.as_slice()) else {
        return Err(InitError::Session(SessionError::Turn));
    };
    if program == REPORT_REQUEST && job.files.is_empty() {
        report(nonce);
        return Ok(());
    }
    let program_path = spec::validate_file_path(program).map_err(|reason| {
        InitError::Session(SessionError::Spec(SpecError::FilePath {
            path: spec::shown(program),
            reason,
        }))
    })?;
    if program.contains('\'') {
        return Err(InitError::Session(SessionError::Turn));
    }
    if let Err(err) = files::write_files(&job.files) {
        refuse(nonce, &err.to_string());
        return Ok(());
    }
    let program = program_path.to_string_lossy().into_owned();
    let handed = match runner {
        Runner::Python => {
            let turn = RunnerTurn {
                program,
                nonce: nonce.clone(),
            };
            let mut line = serde_json::to_vec(&turn).unwrap_or_default();
            line.push(b'\n');
            line
        }
        Runner::Bash => bash_turn(&program, nonce).into_bytes(),
    };
    give(input, &handed);
    Ok(())
}

/// Answers a report request: the exit trailer's form, with the request's nonce, on stderr.
fn report(nonce: &str) {
    let report = InitReport {
        special_files: leftovers::special_files(std::path::Path::new(leftovers::OUTPUT_DIR)),
    };
    let mut stderr = std::io::stderr().lock();
    let _ = stderr
        .write_all(&exit_trailer(nonce, 0, &report))
        .and_then(|()| stderr.flush());
}

/// Answers a turn the init could not hand over.
fn refuse(nonce: &str, message: &str) {
    let marker = end_marker(nonce, crate::EXIT_INIT_ERROR, "");
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(&marker).and_then(|()| stdout.flush());
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "sandgate-init: {message}")
        .and_then(|()| stderr.write_all(&marker))
        .and_then(|()| stderr.flush());
}

/// Writes to the runner; a runner that is gone shows up as its exit in the loop.
fn give(input: &mut Option<ChildStdin>, bytes: &[u8]) {
    if let Some(stdin) = input {
        if stdin.write_all(bytes).and_then(|()| stdin.flush()).is_err() {
            *input = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &[&str]) -> Result<Runner, InitError> {
        Runner::parse(list.iter().map(OsString::from))
    }

    #[test]
    fn runners() {
        assert_eq!(parse(&["python"]).unwrap(), Runner::Python);
        assert_eq!(parse(&["bash"]).unwrap(), Runner::Bash);
        for bad in [&[][..], &["ruby"], &["python", "x"]] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}

//! A session sandbox's init (`session python|bash`): one resident runner serving many turns
//! (the protocol is `sandbox_protocol`'s session module).
//!
//! The first stdin line opens the session (files, cwd, environment, the proxy bridge), then the
//! runner starts with that environment and stdin stays open: a thread reads every further
//! line (a turn) and wakes the init's signal loop, which writes the turn's files and hands the
//! cell to the runner, while it goes on forwarding signals (SIGINT is how the gateway
//! interrupts a cell) and reaping. The session ends when stdin closes (everything of the
//! program is killed, exit 0) or when the runner dies (its status is the init's). A turn whose
//! files cannot be written is answered here: one `sandgate-init:` line and the end markers
//! with code 125; the session goes on.
//!
//! # Who says a turn ended
//!
//! The init, never the program. The runner gets a socket as its fd 0 (the channel: cells in,
//! reports out) and pipes as its fds 1 and 2 ([`crate::streams`]); it never holds the init's
//! stdout or stderr, nor any turn's nonce. The relay thread that drains the pipes also reads
//! the channel ([`Channel`]): when a report with the session's key ([`new_key`], made here)
//! and the awaited turn's sequence number arrives, it relays what the pipes hold and writes
//! the turn's end markers itself, with the nonce only the init knows. The init is a process
//! the program cannot signal, ptrace or read ([`crate::identity`]); its end of the channel and
//! of the pipes is its own.
//!
//! The init writes files as the program's user (its effective uid, see [`crate::identity`]),
//! and the program's leftovers may run while a turn's files are written: writing never follows
//! a symlink as the file itself, and a parent swapped for a symlink could only make the init
//! write where the program itself may write anyway. A line whose `argv` is exactly
//! [`REPORT_REQUEST`] is answered with the special files in `/output` ([`crate::leftovers`]);
//! a file operation line (`sandbox_protocol::FileLine`) is performed by the init itself and
//! answered on stderr ([`crate::fileops`]).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Stdio};
use std::sync::{mpsc, Arc, Mutex, PoisonError};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use sandbox_protocol::{
    bash_turn, end_marker, exit_trailer, file_answer, parse_report, python_cell, turn_end_marker,
    FileLine, FileRequest, InitReport, BASH_PRELUDE, MAX_REPORT_LINE, PYTHON_SESSION_RUNNER,
    REPORT_KEY_LEN, REPORT_REQUEST, SESSION_BASH, SESSION_CONTEXT, SESSION_PYTHON,
};
use thiserror::Error;

use crate::process::{SuperviseError, Supervisor, WAKE_SIGNAL};
use crate::spec::{self, SpecError};
use crate::streams::{self, Extra, Host, Pipes, Relaying, StreamError};
use crate::{bridge, files, leftovers, InitError, QUIESCE_WITHIN};

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
    #[error("the runner's channel: {0}")]
    Channel(std::io::Error),
    #[error("making the session's report key: {0}")]
    Key(std::io::Error),
    #[error(transparent)]
    Streams(StreamError),
}

impl Runner {
    /// Parses the arguments after `session`: the runner, and whether this init serves an
    /// extra context beside PID 1 ([`SESSION_CONTEXT`]).
    pub fn parse(mut args: impl Iterator<Item = OsString>) -> Result<(Runner, bool), InitError> {
        let runner = match args.next() {
            Some(name) if name == SESSION_PYTHON => Runner::Python,
            Some(name) if name == SESSION_BASH => Runner::Bash,
            _ => return Err(InitError::Args),
        };
        let context = match args.next() {
            None => false,
            Some(flag) if flag == SESSION_CONTEXT => true,
            Some(_) => return Err(InitError::Args),
        };
        match args.next() {
            None => Ok((runner, context)),
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

    /// What the runner reads first on its channel.
    fn prelude(self, key: &str) -> Vec<u8> {
        match self {
            Runner::Python => format!("{key}\n").into_bytes(),
            Runner::Bash => BASH_PRELUDE.as_bytes().to_vec(),
        }
    }
}

fn session_err(err: SessionError) -> InitError {
    InitError::Session(err)
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
    let key = new_key().map_err(|err| session_err(SessionError::Key(err)))?;
    let (captured, ends) = streams::capture().map_err(InitError::Streams)?;
    let (ours, theirs) =
        UnixStream::pair().map_err(|err| session_err(SessionError::Channel(err)))?;
    let child = supervisor
        .spawn(
            &runner.argv(),
            open.env.as_ref(),
            Stdio::from(OwnedFd::from(theirs)),
            ends,
        )
        .map_err(|err| session_err(SessionError::Start(err)))?;
    let mut session = Session::new(runner, key, ours);
    // After the spawn, as for a cold run (see `crate::run`).
    let relaying = captured
        .relay(Some(Box::new(session.channel()?)))
        .map_err(InitError::Streams)?;
    if let Some(bridge) = bridge {
        bridge.serve().map_err(InitError::Bridge)?;
    }
    let prelude = runner.prelude(&session.key);
    session.give(&prelude);
    serve(supervisor, child, &mut session, relaying)
}

/// The turns, until stdin closes or the runner dies.
fn serve(
    supervisor: &Supervisor,
    mut child: Child,
    session: &mut Session,
    relaying: Relaying,
) -> Result<u8, InitError> {
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
            relaying.finish(false);
            return Ok(outcome.exit_code());
        }
        for line in lines {
            let Ok(line) = line else {
                // stdin closed: the gateway ended the session.
                drop(session.input.take());
                if let Ok(pid) = i32::try_from(child.id()) {
                    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                }
                supervisor.run(child).map_err(InitError::Supervise)?;
                let quiet = crate::process::quiesce(QUIESCE_WITHIN);
                relaying.finish(quiet);
                return Ok(0);
            };
            session.turn(line)?;
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

/// A key nobody else can guess: [`REPORT_KEY_LEN`] hex digits from the kernel's random source.
pub fn new_key() -> std::io::Result<String> {
    let mut bytes = [0u8; REPORT_KEY_LEN / 2];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// The turn the init waits for a report of.
#[derive(Debug)]
struct Awaited {
    seq: u64,
    nonce: String,
}

type Awaiting = Arc<Mutex<Option<Awaited>>>;

/// The main thread's side of the session: hands cells over.
#[derive(Debug)]
struct Session {
    runner: Runner,
    key: String,
    /// The channel, for writing; `None` once the runner stopped reading it.
    input: Option<UnixStream>,
    awaiting: Awaiting,
    seq: u64,
}

impl Session {
    fn new(runner: Runner, key: String, ours: UnixStream) -> Session {
        Session {
            runner,
            key,
            input: Some(ours),
            awaiting: Arc::new(Mutex::new(None)),
            seq: 0,
        }
    }

    /// The relay thread's side: reads the channel.
    fn channel(&self) -> Result<Channel, InitError> {
        let stream = match &self.input {
            Some(input) => input.try_clone(),
            None => Err(std::io::Error::other("closed")),
        }
        .map_err(|err| session_err(SessionError::Channel(err)))?;
        Ok(Channel {
            stream,
            key: self.key.clone(),
            awaiting: Arc::clone(&self.awaiting),
            buffer: Vec::new(),
        })
    }

    /// Writes a turn's files and hands its cell to the runner; a file operation line is
    /// answered here ([`crate::fileops`]).
    fn turn(&mut self, line: Vec<u8>) -> Result<(), InitError> {
        if let Ok(file) = serde_json::from_slice::<FileLine>(&line) {
            // A write's line is up to 22 MB: not held while the operation runs.
            drop(line);
            return file_operation(file);
        }
        let job = spec::parse_job(&line).map_err(|err| session_err(SessionError::Spec(err)))?;
        let (Some(nonce), [program]) = (&job.exit_nonce, job.argv.as_slice()) else {
            return Err(session_err(SessionError::Turn));
        };
        if program == REPORT_REQUEST && job.files.is_empty() {
            report(nonce);
            return Ok(());
        }
        let program_path = spec::validate_file_path(program).map_err(|reason| {
            session_err(SessionError::Spec(SpecError::FilePath {
                path: spec::shown(program),
                reason,
            }))
        })?;
        if program.contains('\'') {
            return Err(session_err(SessionError::Turn));
        }
        if let Err(err) = files::write_files(&job.files) {
            refuse(nonce, &err.to_string());
            return Ok(());
        }
        let program = program_path.to_string_lossy().into_owned();
        self.seq += 1;
        let seq = self.seq;
        *self.awaiting.lock().unwrap_or_else(PoisonError::into_inner) = Some(Awaited {
            seq,
            nonce: nonce.clone(),
        });
        let handed = match self.runner {
            Runner::Python => python_cell(seq, &program),
            Runner::Bash => bash_turn(&program, &self.key, seq).into_bytes(),
        };
        self.give(&handed);
        Ok(())
    }

    /// Writes to the runner; a runner that is gone shows up as its exit in the loop.
    fn give(&mut self, bytes: &[u8]) {
        if let Some(input) = &mut self.input {
            if input.write_all(bytes).is_err() {
                self.input = None;
            }
        }
    }
}

/// The relay thread's side of the channel: takes the runner's reports and ends turns.
struct Channel {
    stream: UnixStream,
    key: String,
    awaiting: Awaiting,
    /// An unfinished line.
    buffer: Vec<u8>,
}

impl Extra for Channel {
    fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    fn ready(&mut self, pipes: &mut Pipes) -> bool {
        let mut chunk = [0u8; 4096];
        let read = match self.stream.read(&mut chunk) {
            Ok(0) => return false,
            Ok(read) => read,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => return true,
            Err(_) => return false,
        };
        self.buffer.extend_from_slice(&chunk[..read]);
        while let Some(newline) = self.buffer.iter().position(|byte| *byte == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=newline).collect();
            self.take(&line[..newline], pipes);
        }
        if self.buffer.len() > MAX_REPORT_LINE {
            // Not a report: whatever a cell wrote to the socket.
            self.buffer.clear();
        }
        true
    }
}

impl Channel {
    /// A line from the runner: the awaited turn's report ends it.
    fn take(&mut self, line: &[u8], pipes: &mut Pipes) {
        let Some(report) = parse_report(&self.key, line) else {
            return;
        };
        let awaited = {
            let mut awaiting = self.awaiting.lock().unwrap_or_else(PoisonError::into_inner);
            match awaiting.as_ref() {
                Some(turn) if turn.seq == report.seq => awaiting.take(),
                _ => None,
            }
        };
        let Some(turn) = awaited else {
            return;
        };
        // Everything the runner wrote before it reported is in the pipes now.
        pipes.drain();
        let marker = turn_end_marker(&turn.nonce, &report.end);
        let _ = streams::write_all(Host::Stdout, &marker);
        let _ = streams::write_all(Host::Stderr, &marker);
    }
}

/// Performs a file operation and answers it on stderr with the line's nonce.
fn file_operation(line: FileLine) -> Result<(), InitError> {
    let nonce = &line.exit_nonce;
    let plain = (spec::MIN_NONCE..=spec::MAX_NONCE).contains(&nonce.len())
        && nonce.bytes().all(|byte| byte.is_ascii_alphanumeric());
    if !plain {
        return Err(session_err(SessionError::Spec(SpecError::ExitNonce)));
    }
    let answer = match line.file {
        FileRequest::Read { path } => crate::fileops::read_answer(nonce, &path),
        FileRequest::Write {
            path,
            content_b64,
            mode,
        } => file_answer(
            nonce,
            &crate::fileops::write_owned(&path, content_b64, mode),
        ),
        request => file_answer(nonce, &crate::fileops::perform(&request)),
    };
    let _ = streams::write_all(Host::Stderr, &answer);
    Ok(())
}

/// Answers a report request: the exit trailer's form, with the request's nonce, on stderr.
fn report(nonce: &str) {
    let report = InitReport {
        special_files: leftovers::special_files(std::path::Path::new(leftovers::OUTPUT_DIR)),
    };
    let _ = streams::write_all(Host::Stderr, &exit_trailer(nonce, 0, &report));
}

/// Answers a turn the init could not hand over.
fn refuse(nonce: &str, message: &str) {
    let marker = end_marker(nonce, crate::EXIT_INIT_ERROR, "");
    let _ = streams::write_all(Host::Stdout, &marker);
    let mut text = format!("sandgate-init: {message}\n").into_bytes();
    text.extend_from_slice(&marker);
    let _ = streams::write_all(Host::Stderr, &text);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &[&str]) -> Result<(Runner, bool), InitError> {
        Runner::parse(list.iter().map(OsString::from))
    }

    #[test]
    fn runners() {
        assert_eq!(parse(&["python"]).unwrap(), (Runner::Python, false));
        assert_eq!(parse(&["bash"]).unwrap(), (Runner::Bash, false));
        assert_eq!(parse(&["bash", "context"]).unwrap(), (Runner::Bash, true));
        for bad in [
            &[][..],
            &["ruby"],
            &["python", "x"],
            &["python", "context", "x"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}

//! `sandbox-init`: PID 1 inside every sandgate sandbox.
//!
//! The gateway bind-mounts this static binary read-only at `/sandgate/init` and makes it the
//! container's entrypoint, with no arguments. It:
//!
//! 1. reads **one line** from stdin (at most [`spec::MAX_SPEC_LINE`] bytes before the newline;
//!    the newline may be omitted at end of input): a JSON job spec,
//!    ```json
//!    {"argv":["python3","/tmp/sandgate/main.py"],
//!     "cwd":"/workspace",
//!     "files":[{"path":"/tmp/sandgate/main.py","content_b64":"...","mode":420}]}
//!    ```
//!    Unknown fields are refused at both levels. `argv` is required and non-empty; `cwd`
//!    defaults to `/workspace`; `files` defaults to none; `mode` defaults to `0o644` and may
//!    not exceed `0o777`; `content_b64` is standard base64 with padding. An optional
//!    `"env": {"NAME": "value", ...}` becomes the program's *whole* environment (absent: the
//!    container's, which the init inherits); names non-empty without `=` or NUL. An optional
//!    `"proxy": {"listen": "127.0.0.1:3128", "socket": "/run/sandgate/egress.sock"}` (both
//!    fields required) starts the proxy bridge ([`bridge`]); absent or `null`: no bridge;
//! 2. validates all of it before acting: file paths must be canonical absolute paths strictly
//!    under `/workspace/`, `/tmp/` or `/output/` ([`spec::validate_file_path`]); `cwd` any
//!    canonical absolute path; `proxy.listen` an IP address and non-zero port on loopback
//!    (`127.0.0.0/8`, `[::1]`; [`spec::validate_listen`]); `proxy.socket` a canonical absolute
//!    path that fits a Unix socket address ([`spec::validate_socket_path`]);
//! 3. creates the files in order, parents as `0755`, never following a symlink and never
//!    replacing anything ([`files`]), then changes into `cwd`;
//! 4. with `proxy`, binds `listen` (failing that is an init error) and, once the program is
//!    spawned, relays every connection to it to a new connection to `socket`, from background
//!    threads that never print to stdout and never delay the init's exit ([`bridge`]);
//! 5. spawns `argv` (`PATH` lookup from the environment the gateway set) with stdin
//!    `/dev/null` and stdout/stderr the write ends of two pipes that one relay thread drains
//!    onto the init's own stdout and stderr (which the gateway reads through `docker attach`)
//!    with full writes ([`streams`]: gVisor lets a write to those return a short count that a
//!    program may not retry), in its own process group, with a clean signal mask (through a re-exec of itself in
//!    [`exec`] mode, see [`process`] for why), as uid and gid 65534 while the init keeps a
//!    real uid of its own, so the program cannot signal it ([`identity`]: as PID 1 started as
//!    root, the init takes that identity before anything else and holds no capability after);
//! 6. forwards SIGTERM, SIGINT, SIGHUP and SIGQUIT to that process group, reaps every process
//!    that exits (orphans included) and, once the program exits, SIGKILLs what is left of its
//!    process group and exits with the program's status, or 128 + signal number if a signal
//!    killed it. As a settled PID 1 ([`identity`]) it then kills and reaps every other process
//!    of the sandbox (those that left the group too: [`process::quiesce`], bounded by
//!    [`QUIESCE_WITHIN`]); when none is left, and the relay has written all the pipes held,
//!    it says so with the end marker on stdout (below).
//!    Processes it could not account for die with the container when PID 1 exits.
//!    Before it exits it lists the FIFOs, sockets and devices left in `/output` ([`leftovers`])
//!    for the exit trailer's report.
//!
//! # Exit codes of the init itself
//!
//! On failure it writes one line `sandgate-init: <error>` to stderr and exits with:
//!
//! | code | meaning |
//! |------|---------|
//! | [`EXIT_NOT_FOUND`] (127) | `argv[0]` not found (`ENOENT`, also a missing `#!` interpreter) |
//! | [`EXIT_NOT_EXECUTABLE`] (126) | `argv[0]` found but not executable (`EACCES`, `ENOEXEC`) |
//! | [`EXIT_INIT_ERROR`] (125) | any other init error: no or bad spec, bad file, bad `cwd`, proxy `listen` not bindable, spawn failure, lost status, unexpected arguments |
//!
//! These collide with the codes a program may itself exit with; the stderr line is what tells
//! them apart. Anything the init prints starts with `sandgate-init: `; on stdout it prints
//! only the end marker (below). Once the program runs, the only other lines it may print are the bridge's,
//! at most one per kind of failure (`sandgate-init: proxy bridge: ...`), which do not change
//! the exit status.
//!
//! # Command line
//!
//! No arguments: the init, as above. When the spec carries `"exit_nonce"` (16 to 64 letters or
//! digits), whatever the outcome after the spec was read (the program's status or the init's
//! own failure) the last bytes written to stderr are
//! `\0sandgate-exit:<nonce>:<code>[:<report>]\n` ([`exit_trailer`], the report an
//! [`InitReport`]); the gateway strips it. When, besides, nothing of the program is left
//! ([`process::quiesce`]), the trailer is preceded on **stdout** by the end marker
//! `\0sandgate-end:<nonce>:<code>:\n` ([`sandbox_protocol::end_marker`]): each stream is in
//! order, so a gateway that saw both has everything the program printed, and knows that
//! nothing of it runs any more (it may collect `/output` before the sandbox has stopped).
//! `exec [--apart] -- PROGRAM [ARG...]`: the internal
//! exec trampoline ([`exec`]; `--apart` from a settled init, see [`identity`]).
//! `attach <tag> -- PROGRAM [ARG...]` and `signal <tag> KILL|TERM|...`: a session's later
//! processes, started by `docker exec` as the program's user, never by the init ([`attach`]).
//! Anything else: exit 125.
//!
//! # What it is not
//!
//! Not a security boundary: gVisor, the read-only root, the dropped capabilities and the
//! gateway's limits are. It trusts the gateway's spec only as far as validated here, and it
//! never reads stdin again after the first line. No tokio, no `unsafe`, no allocation-heavy
//! work once the program runs (the spec and file contents are freed before the spawn; the
//! bridge allocates a bounded buffer per connection). Not a filter either: the bridge relays
//! bytes it does not read, and every decision about them is the egress proxy's. The bridge's
//! listener is bound before the spawn (so it is up before the program can dial it; early
//! connections wait in its backlog) and its threads are started right after the spawn (the
//! spawn changes the init's uids, which must happen while it is single-threaded, see
//! [`identity`]), and after [`process::Supervisor::new`] (so they inherit the blocked signal
//! mask and the signals still reach the init's loop).

pub mod attach;
pub mod bridge;
pub mod exec;
pub mod fileops;
pub mod files;
pub mod identity;
pub mod leftovers;
pub mod pool;
pub mod process;
pub mod pty;
pub mod session;
pub mod spec;
pub mod streams;
pub mod watch;

use std::ffi::OsString;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::Stdio;

use thiserror::Error;

use crate::bridge::BridgeError;
use crate::exec::ExecError;
use crate::files::FileError;
use crate::process::{SuperviseError, Supervisor};
use crate::spec::SpecError;

/// `argv[0]` was not found.
pub const EXIT_NOT_FOUND: u8 = 127;
/// `argv[0]` was found but could not be executed.
pub const EXIT_NOT_EXECUTABLE: u8 = 126;
/// Any other failure of the init (bad spec, bad file, ...).
pub const EXIT_INIT_ERROR: u8 = 125;
/// First argument that selects the exec trampoline.
pub const EXEC_MODE: &str = "exec";
/// After [`EXEC_MODE`]: the trampoline of a settled init ([`identity`]).
pub const APART_FLAG: &str = "--apart";
/// After [`EXEC_MODE`]: be the session keeper of a terminal on stdin ([`pty::keep`]).
pub const TTY_FLAG: &str = "--tty";
pub use sandbox_protocol::{end_marker, exit_trailer, InitReport, EXIT_TRAILER_PREFIX};

/// What the init's exit trailer says besides the code: the job's nonce (the trailer is
/// written only with one) and the report ([`leftovers`]).
#[derive(Debug, Default)]
pub struct End {
    pub nonce: Option<String>,
    pub report: InitReport,
    /// Nothing of the program is left ([`process::quiesce`]): the end marker goes out.
    pub quiet: bool,
}

/// How long the init spends making sure nothing of the program is left (see
/// [`process::quiesce`]) before it gives up and lets the container's end do it.
pub const QUIESCE_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Mode {
    /// No arguments: be PID 1 for the job on stdin.
    Init,
    /// `pool [python [MODULE...]]`: be PID 1 of a pooled sandbox, waiting for its job
    /// ([`pool`]).
    Pool(pool::Runner),
    /// `session python|bash [context]`: be PID 1 of a session sandbox, serving many turns (with
    /// `context`: an extra code context's init beside PID 1, started by `docker exec` as root)
    /// ([`session`], `sandbox_protocol::SESSION_CONTEXT`).
    Session {
        runner: session::Runner,
        context: bool,
    },
    /// `exec [--apart] -- PROGRAM [ARG...]`: the trampoline (`--apart`: started by a settled
    /// init, see [`identity`]).
    Exec {
        apart: bool,
        tty: bool,
        argv: Vec<OsString>,
    },
    /// `attach <tag> [pty=<cols>x<rows>] -- PROGRAM [ARG...]`: a session's later process,
    /// started by `docker exec` ([`attach`]; with a terminal: [`pty`]).
    Attach {
        pty: Option<sandbox_protocol::PtySize>,
        argv: Vec<OsString>,
    },
    /// `watch <tag> [recursive] -- PATH`: a session's directory watcher ([`watch`]).
    Watch { recursive: bool, path: String },
    /// `signal <tag> <SIGNAL>`: signals the attach supervisor of `<tag>` ([`attach`]).
    Signal {
        tag: String,
        signal: sandbox_protocol::ProcessSignal,
    },
}

/// Parses the arguments after `argv[0]`.
pub fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Mode, InitError> {
    let mut args = args.into_iter();
    match args.next() {
        None => Ok(Mode::Init),
        Some(mode) if mode == sandbox_protocol::POOL_MODE => {
            pool::Runner::parse(args).map(Mode::Pool)
        }
        Some(mode) if mode == sandbox_protocol::SESSION_MODE => {
            session::Runner::parse(args).map(|(runner, context)| Mode::Session { runner, context })
        }
        Some(mode) if mode == EXEC_MODE => parse_exec(args),
        Some(mode) if mode == sandbox_protocol::ATTACH_MODE => attach::parse_attach(args)
            .map(|(_, pty, argv)| Mode::Attach { pty, argv })
            .map_err(InitError::Attach),
        Some(mode) if mode == sandbox_protocol::WATCH_MODE => watch::parse_watch(args)
            .map(|(_, recursive, path)| Mode::Watch { recursive, path })
            .map_err(InitError::Watch),
        Some(mode) if mode == sandbox_protocol::SIGNAL_MODE => attach::parse_signal(args)
            .map(|(tag, signal)| Mode::Signal { tag, signal })
            .map_err(InitError::Attach),
        Some(_) => Err(InitError::Args),
    }
}

/// `exec [--apart] [--tty] -- PROGRAM [ARG...]`.
fn parse_exec(mut args: impl Iterator<Item = OsString>) -> Result<Mode, InitError> {
    let (mut apart, mut tty) = (false, false);
    loop {
        match args.next() {
            Some(flag) if flag == APART_FLAG && !apart && !tty => apart = true,
            Some(flag) if flag == TTY_FLAG && !tty => tty = true,
            Some(dashes) if dashes == "--" => break,
            _ => return Err(InitError::Args),
        }
    }
    Ok(Mode::Exec {
        apart,
        tty,
        argv: args.collect(),
    })
}

/// Everything that makes the init fail instead of reporting the program's own status.
#[derive(Debug, Error)]
pub enum InitError {
    #[error(transparent)]
    Spec(SpecError),
    #[error(transparent)]
    Files(FileError),
    #[error("changing to cwd {}: {err}", .cwd.display())]
    Cwd { cwd: PathBuf, err: std::io::Error },
    #[error(transparent)]
    Bridge(BridgeError),
    #[error(transparent)]
    Supervise(SuperviseError),
    #[error(transparent)]
    Exec(ExecError),
    #[error("unexpected arguments: run with none, `pool [python [MODULE...]]`, `session python|bash [context]` or `exec -- PROGRAM [ARG...]`")]
    Args,
    #[error(transparent)]
    Pool(pool::PoolError),
    #[error(transparent)]
    Session(session::SessionError),
    #[error(transparent)]
    Attach(attach::AttachError),
    #[error(transparent)]
    Watch(watch::WatchError),
    #[error("making the init non-dumpable: {0}")]
    Dumpable(std::io::Error),
    #[error(transparent)]
    Identity(identity::IdentityError),
    #[error(transparent)]
    Streams(streams::StreamError),
}

impl InitError {
    /// The documented exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            InitError::Exec(err) => err.exit_code(),
            _ => EXIT_INIT_ERROR,
        }
    }
}

/// Does everything described in the crate docs; returns the exit code for the init (the
/// program's) or the error to report. `end` receives the job's nonce as soon as the job is
/// parsed, and the report once the program ended.
pub fn run(mode: Option<pool::Runner>, end: &mut End) -> Result<u8, InitError> {
    let supervisor = guarded()?;
    let (job, runner) = match mode {
        None => (read_job(std::io::stdin().lock())?, None),
        Some(runner) => {
            let waiting = pool::Waiting::start(&supervisor, runner).map_err(InitError::Pool)?;
            waiting.job(&supervisor).map_err(InitError::Pool)?
        }
    };
    end.nonce.clone_from(&job.exit_nonce);
    let spec::Job {
        argv,
        cwd,
        env,
        files,
        proxy,
        exit_nonce: _,
    } = job;
    files::write_files(&files).map_err(InitError::Files)?;
    drop(files);
    // The init itself moves into cwd and the trampoline inherits it: a missing cwd is an init
    // error (125), not a 127 from the exec, and a relative argv[0] ("./run.sh") is from cwd.
    std::env::set_current_dir(&cwd).map_err(|err| InitError::Cwd {
        cwd: cwd.clone(),
        err,
    })?;
    let bridge = proxy
        .as_ref()
        .map(bridge::bind)
        .transpose()
        .map_err(InitError::Bridge)?;
    let (child, relaying) = match runner {
        Some(runner) => runner
            .hand_over(&argv, &cwd, env)
            .map_err(InitError::Pool)?,
        None => {
            let (captured, ends) = streams::capture().map_err(InitError::Streams)?;
            let child = supervisor
                .spawn(&argv, env.as_ref(), Stdio::null(), ends)
                .map_err(InitError::Supervise)?;
            (child, captured.relay(None).map_err(InitError::Streams)?)
        }
    };
    // Served only now: the spawn changes the init's uids, which must not happen while other
    // threads run (see `identity`); the program's first connections wait in the backlog.
    if let Some(bridge) = bridge {
        bridge.serve().map_err(InitError::Bridge)?;
    }
    let outcome = supervisor.run(child).map_err(InitError::Supervise)?;
    let quiet = process::quiesce(QUIESCE_WITHIN);
    // The end marker may only follow everything the program wrote.
    end.quiet = relaying.finish(quiet) && quiet;
    end.report.special_files =
        leftovers::special_files(std::path::Path::new(leftovers::OUTPUT_DIR));
    Ok(outcome.exit_code())
}

/// Serves a session (`session python|bash`, see [`session`]).
pub fn run_session(runner: session::Runner, context: bool, end: &mut End) -> Result<u8, InitError> {
    let supervisor = guarded_as(context)?;
    session::run(&supervisor, runner, &mut end.nonce)
}

/// The first steps of every init mode.
fn guarded() -> Result<Supervisor, InitError> {
    guarded_as(false)
}

/// [`guarded`], for PID 1 or (`context`) an extra context's init beside it.
fn guarded_as(context: bool) -> Result<Supervisor, InitError> {
    // First of all: the init's own uid, which the program will not have (see `identity`).
    // Changing ids resets dumpability, so this comes before the next step.
    identity::settle(context).map_err(InitError::Identity)?;
    // Before anything secret is read: the program must not read this process's memory or file
    // descriptors through /proc or ptrace (its uid differs from the init's real uid already;
    // this also holds where the init keeps the program's uid, outside a sandbox).
    nix::sys::prctl::set_dumpable(false).map_err(|err| InitError::Dumpable(err.into()))?;
    // First, so that a SIGTERM arriving while the job is read stays pending (PID 1 would
    // otherwise drop it) and reaches the program as soon as it runs.
    Supervisor::new().map_err(InitError::Supervise)
}

/// Reads and validates the one job line.
pub fn read_job(stdin: impl BufRead) -> Result<spec::Job, InitError> {
    let line = spec::read_spec_line(stdin, spec::MAX_SPEC_LINE).map_err(InitError::Spec)?;
    spec::parse_job(&line).map_err(InitError::Spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn no_arguments_is_the_init() {
        assert_eq!(parse_args(args(&[])).unwrap(), Mode::Init);
    }

    #[test]
    fn exec_mode_takes_everything_after_the_dashes() {
        assert_eq!(
            parse_args(args(&["exec", "--", "sh", "-c", "--"])).unwrap(),
            Mode::Exec {
                apart: false,
                tty: false,
                argv: args(&["sh", "-c", "--"])
            }
        );
        assert_eq!(
            parse_args(args(&["exec", "--"])).unwrap(),
            Mode::Exec {
                apart: false,
                tty: false,
                argv: Vec::new()
            }
        );
        assert_eq!(
            parse_args(args(&["exec", "--apart", "--", "--apart"])).unwrap(),
            Mode::Exec {
                apart: true,
                tty: false,
                argv: args(&["--apart"])
            }
        );
        assert_eq!(
            parse_args(args(&["exec", "--tty", "--", "bash"])).unwrap(),
            Mode::Exec {
                apart: false,
                tty: true,
                argv: args(&["bash"])
            }
        );
    }

    #[test]
    fn anything_else_is_refused() {
        for list in [
            &["exec"][..],
            &["exec", "sh"],
            &["exec", "--apart", "sh"],
            &["exec", "--tty", "--apart", "--", "sh"],
            &["--help"],
            &["-", "--"],
        ] {
            let err = parse_args(args(list)).unwrap_err();
            assert_eq!(err.exit_code(), EXIT_INIT_ERROR, "{list:?}");
        }
    }
}

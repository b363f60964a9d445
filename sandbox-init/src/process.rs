//! Running the job's program and doing what PID 1 owes it: signal forwarding and reaping.
//!
//! # Signals, without `unsafe` and without losing any
//!
//! PID 1 gets no default signal actions on Linux: a signal it has no handler for is dropped
//! (under runc, `docker stop` would then wait for its SIGKILL). gVisor differs (the runsc here
//! lets an unhandled SIGTERM kill PID 1, which would orphan the program's status). Installing
//! handlers needs `unsafe` (forbidden here), so the init instead *blocks*
//! [`FORWARDED_SIGNALS`] and `SIGCHLD` and takes them synchronously with `sigwait` in one loop
//! ([`Supervisor::run`]). A blocked signal is never dropped, even for PID 1: it stays pending
//! until `sigwait` takes it, so nothing is lost between the spawn and the first wait (a fast
//! child's `SIGCHLD` included). The mask is set first thing, on the only thread; threads
//! started later (the proxy bridge's, [`crate::bridge`]) inherit it, so such signals still
//! reach the loop.
//!
//! The catch: a blocked mask is inherited through `fork` and `exec`, and std's `Command` does
//! not reset it (checked: std 1.95 only resets `SIGPIPE`), while resetting it in the child
//! needs `pre_exec`, which is `unsafe`. Spawning before blocking would leave a window in which
//! a signal to PID 1 is dropped. So the init spawns *itself* (`/proc/self/exe exec [--apart]
//! -- argv…`, see [`crate::exec`]; each spawn under [`crate::identity::lend`]) in the program's
//! new process group; that trampoline clears its mask
//! with a safe `sigprocmask` and `exec`s the program in place (same pid, same process group).
//! A signal forwarded before the trampoline has exec'd stays pending on it and acts as soon as
//! the mask is cleared, as it would on the program. The cost is one extra `execve` of this
//! static binary per job: about 4 ms on the host, lost in the noise of a gVisor fork + exec
//! (about 16 ms each here).
//!
//! One inherited quirk: std spawns through glibc's `posix_spawn`, which leaves glibc's two
//! internal signals (32 and 33) ignored in the child, and `exec` keeps that. Every program
//! spawned that way by any glibc process starts so; glibc and Go install their own handlers.
//!
//! # Process group
//!
//! The program runs in its own process group (`setpgid(0, 0)` via `process_group(0)`), so the
//! init can signal it and everything it started at once, and kill the leftovers when it exits.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use thiserror::Error;

use crate::streams::ProgramEnds;
use crate::EXIT_INIT_ERROR;

/// Signals the init passes on to the program's process group.
pub const FORWARDED_SIGNALS: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// The init itself failed while the program was (or was about to be) running.
#[derive(Debug, Error)]
pub enum SuperviseError {
    #[error("blocking signals: {0}")]
    Block(Errno),
    #[error("starting the exec trampoline ({TRAMPOLINE}): {0}")]
    Spawn(io::Error),
    #[error("waiting for signals: {0}")]
    Wait(Errno),
    #[error("reaping processes: {0}")]
    Reap(Errno),
    #[error("lost the exit status of the program: {0}")]
    MainStatus(io::Error),
    #[error("program got a process id out of range: {0}")]
    BadPid(u32),
    #[error(transparent)]
    Identity(crate::identity::IdentityError),
}

/// How the program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It exited with this status (0..=255).
    Exited(i32),
    /// It was killed by this signal number.
    Signaled(i32),
}

impl Outcome {
    fn from_status(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => Outcome::Exited(code),
            (None, Some(signal)) => Outcome::Signaled(signal),
            // Neither exited nor killed cannot come out of a wait without WUNTRACED.
            (None, None) => Outcome::Exited(i32::from(EXIT_INIT_ERROR)),
        }
    }

    /// The init's own exit status: the program's, or 128 + signal number, as a shell reports.
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Exited(code) => u8::try_from(code).unwrap_or(EXIT_INIT_ERROR),
            Outcome::Signaled(signal) => u8::try_from(128 + signal).unwrap_or(u8::MAX),
        }
    }
}

/// Holds the blocked signal set; its existence proves the mask is in place.
#[derive(Debug)]
pub struct Supervisor {
    signals: SigSet,
}

impl Supervisor {
    /// Blocks [`FORWARDED_SIGNALS`] and `SIGCHLD` on the calling thread. Call it on the main
    /// thread before starting any other thread and before [`Supervisor::spawn`].
    pub fn new() -> Result<Self, SuperviseError> {
        let mut signals = SigSet::empty();
        for signal in FORWARDED_SIGNALS {
            signals.add(signal);
        }
        signals.add(Signal::SIGCHLD);
        signals.add(WAKE_SIGNAL);
        signals.thread_block().map_err(SuperviseError::Block)?;
        // As PID 1 this changes nothing; when something else is PID 1 (tests, `docker --init`)
        // it makes orphans re-parent to us, so the reaping below stays the same. Failing to
        // set it only loses that, so the error is deliberately ignored.
        let _ = nix::sys::prctl::set_child_subreaper(true);
        Ok(Supervisor { signals })
    }

    /// Starts `argv` through the exec trampoline, in the current directory, in a new process
    /// group, with `stdin` and the write ends of the output pipes as its fds 0, 1 and 2 (see
    /// [`crate::streams`]: it never holds the init's own stdout or stderr), with exactly `env`
    /// as its environment if given (the trampoline's `PATH` lookup then uses that `PATH`), else
    /// the init's. Failing to find or execute `argv[0]` is reported by the trampoline itself,
    /// as the program's exit status. The ends given are closed in the init once it returns.
    pub fn spawn(
        &self,
        argv: &[String],
        env: Option<&BTreeMap<String, String>>,
        stdin: Stdio,
        ends: ProgramEnds,
    ) -> Result<Child, SuperviseError> {
        let mut command = trampoline(argv, stdin, ends);
        if let Some(env) = env {
            command.env_clear().envs(env);
        }
        start(&mut command)
    }

    /// Forwards signals and reaps until `arrived()` says yes after a [`WAKE_SIGNAL`] (`None`),
    /// or the child exits first (its outcome).
    pub fn until(
        &self,
        child: &mut Child,
        mut arrived: impl FnMut() -> bool,
    ) -> Result<Option<Outcome>, SuperviseError> {
        let pid = pid_of(child)?;
        loop {
            match self.signals.wait().map_err(SuperviseError::Wait)? {
                WAKE_SIGNAL => {
                    if arrived() {
                        return Ok(None);
                    }
                }
                Signal::SIGCHLD => {
                    if let Some(outcome) = reap(child, pid)? {
                        return Ok(Some(outcome));
                    }
                }
                signal => forward(pid, signal),
            }
        }
    }

    /// Forwards signals and reaps every child until the program exits, then SIGKILLs the
    /// program's process group (its leftover background processes) and returns how it ended.
    pub fn run(&self, mut child: Child) -> Result<Outcome, SuperviseError> {
        let pid = pid_of(&child)?;
        loop {
            match self.signals.wait().map_err(SuperviseError::Wait)? {
                Signal::SIGCHLD => {
                    if let Some(outcome) = reap(&mut child, pid)? {
                        let _ = killpg(pid, Signal::SIGKILL); // ESRCH: nothing left
                        return Ok(outcome);
                    }
                }
                signal => forward(pid, signal),
            }
        }
    }
}

/// Kills every process the init may signal (all of the program's: they share its uid, see
/// [`crate::identity`]) and reaps until none is left or `within` has passed; says whether none
/// is left. `kill(-1)` reaches every process of the sandbox but the init itself, including
/// those that left the program's group or session; it fails with `ESRCH` only once there is
/// nothing left to signal (a zombie still counts until reaped, and orphans are the init's to
/// reap). Nothing of the program can then write to `/output` or its streams any more.
///
/// Only a settled PID 1 does it (returning `false` otherwise): there every process it may
/// signal is the sandbox's program (its effective uid is [`crate::identity::PROGRAM_UID`]),
/// while an init run as an ordinary process (the host tests) would signal its neighbours.
pub fn quiesce(within: Duration) -> bool {
    if std::process::id() != 1 || !crate::identity::settled() {
        return false;
    }
    let deadline = Instant::now() + within;
    loop {
        if kill(Pid::from_raw(-1), Signal::SIGKILL) == Err(Errno::ESRCH) {
            return true;
        }
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Ok(_) | Err(Errno::EINVAL | Errno::EINTR) => {}
                Err(_) => return false,
            }
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(QUIESCE_STEP);
    }
}

/// How long [`quiesce`] sleeps between rounds.
const QUIESCE_STEP: Duration = Duration::from_millis(1);

/// Sent by the init to itself when something it waits for has arrived (see [`Supervisor::until`]);
/// blocked with the rest, so it only ever wakes the loop.
pub const WAKE_SIGNAL: Signal = Signal::SIGUSR1;

fn pid_of(child: &Child) -> Result<Pid, SuperviseError> {
    let raw_pid = child.id();
    Ok(Pid::from_raw(
        i32::try_from(raw_pid).map_err(|_| SuperviseError::BadPid(raw_pid))?,
    ))
}

/// The init binary itself, by a path that works even if its mount point name changes.
pub const TRAMPOLINE: &str = "/proc/self/exe";

fn trampoline(argv: &[String], stdin: Stdio, ends: ProgramEnds) -> Command {
    let mut command = Command::new(TRAMPOLINE);
    command.arg0("sandgate-init").arg(crate::EXEC_MODE);
    if crate::identity::settled() {
        command.arg(crate::APART_FLAG);
    }
    command
        .arg("--")
        .args(argv)
        .stdin(stdin)
        .stdout(Stdio::from(ends.stdout))
        .stderr(Stdio::from(ends.stderr))
        .process_group(0);
    command
}

/// Spawns with the program's uid lent to the init (see [`crate::identity`]).
fn start(command: &mut Command) -> Result<Child, SuperviseError> {
    crate::identity::lend(|| command.spawn())
        .map_err(SuperviseError::Identity)?
        .map_err(SuperviseError::Spawn)
}

/// Sends `signal` to the program's process group, or to the program alone if it has left it.
fn forward(pid: Pid, signal: Signal) {
    if killpg(pid, signal) == Err(Errno::ESRCH) {
        let _ = kill(pid, signal);
    }
}

/// Reaps every child that has exited (orphans re-parented to PID 1 included); returns the
/// program's outcome once it is among them.
///
/// The program is waited for through std first, which decodes every status; `waitpid(-1)` then
/// collects the others. nix cannot decode a death by a real-time signal (`EINVAL`, the process
/// is reaped all the same): harmless for other processes, and for the program only if it died
/// that way between the two calls, which the next `try_wait` reports as a lost status.
fn reap(child: &mut Child, pid: Pid) -> Result<Option<Outcome>, SuperviseError> {
    loop {
        if let Some(status) = child.try_wait().map_err(SuperviseError::MainStatus)? {
            return Ok(Some(Outcome::from_status(status)));
        }
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return Ok(None),
            Ok(WaitStatus::Exited(reaped, code)) if reaped == pid => {
                return Ok(Some(Outcome::Exited(code)))
            }
            Ok(WaitStatus::Signaled(reaped, signal, _)) if reaped == pid => {
                return Ok(Some(Outcome::Signaled(signal as i32)))
            }
            Ok(_) | Err(Errno::EINVAL | Errno::EINTR) => {}
            Err(err) => return Err(SuperviseError::Reap(err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(Outcome::Exited(0).exit_code(), 0);
        assert_eq!(Outcome::Exited(3).exit_code(), 3);
        assert_eq!(Outcome::Exited(255).exit_code(), 255);
        assert_eq!(Outcome::Signaled(9).exit_code(), 137);
        assert_eq!(Outcome::Signaled(15).exit_code(), 143);
        assert_eq!(Outcome::Signaled(64).exit_code(), 192);
    }
}

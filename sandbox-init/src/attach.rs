//! A session sandbox's later processes (`sandbox_protocol`'s `procs` module): the attach
//! supervisor (`attach <tag> -- PROGRAM [ARG...]`) and the signal request
//! (`signal <tag> <SIGNAL>`), both started by `docker exec` as the program's user, never by the
//! init (which must not spawn once it is multi-threaded, see [`crate::identity`]).
//!
//! The supervisor blocks the signals it passes on and `SIGCHLD` before it spawns (so none is
//! lost, as in [`crate::process`]), starts the program through the exec trampoline (clean
//! signal mask) in a new process group with its own stdin, stdout and stderr (the exec's), and
//! waits: a forwarded signal goes to the program's group (`SIGUSR2` as `SIGKILL`); once the
//! program ended, what is left of its group is killed and the supervisor exits with the
//! program's status, or 128 + the signal that killed it.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, SigSet, Signal};
use nix::unistd::Pid;
use sandbox_protocol::{
    signaled_status, valid_tag, ProcessSignal, PtySize, ATTACH_MODE, PTY_ARG_PREFIX,
};
use thiserror::Error;

use crate::process::TRAMPOLINE;
use crate::{EXEC_MODE, EXIT_INIT_ERROR};

/// Signals the supervisor passes on; `SIGUSR2` stands for `SIGKILL`.
pub(crate) const PASSED: [Signal; 5] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR2,
];
/// A signal request's status when no supervisor of that tag runs.
pub const EXIT_NO_PROCESS: u8 = 1;

#[derive(Debug, Error)]
pub enum AttachError {
    #[error("{0:?} is not a process tag (letters, digits, _)")]
    Tag(String),
    #[error("{0:?} is not a signal a process may be sent")]
    Signal(String),
    #[error("{0:?} is not a terminal size (pty=<cols>x<rows>)")]
    Size(String),
    #[error("opening the terminal: {0}")]
    Terminal(std::io::Error),
    #[error("attach needs a program after `--`")]
    NoProgram,
    #[error("blocking signals: {0}")]
    Block(Errno),
    #[error("starting the program: {0}")]
    Spawn(std::io::Error),
    #[error("waiting: {0}")]
    Wait(Errno),
    #[error("lost the program's status: {0}")]
    Status(std::io::Error),
    #[error("reading /proc: {0}")]
    Proc(std::io::Error),
}

/// The arguments after [`ATTACH_MODE`]: the tag, the terminal's size in PTY mode, `--`, the
/// program.
pub fn parse_attach(
    mut args: impl Iterator<Item = OsString>,
) -> Result<(String, Option<PtySize>, Vec<OsString>), AttachError> {
    let tag = args.next().map(|tag| tag.to_string_lossy().into_owned());
    let tag = tag.unwrap_or_default();
    if !valid_tag(&tag) {
        return Err(AttachError::Tag(tag));
    }
    let mut pty = None;
    let mut next = args.next();
    if let Some(arg) = next.as_ref().and_then(|arg| arg.to_str()) {
        if arg.starts_with(PTY_ARG_PREFIX) {
            pty = Some(PtySize::parse_arg(arg).ok_or_else(|| AttachError::Size(arg.to_owned()))?);
            next = args.next();
        }
    }
    if next.is_none_or(|dashes| dashes != "--") {
        return Err(AttachError::NoProgram);
    }
    let argv: Vec<OsString> = args.collect();
    if argv.is_empty() {
        return Err(AttachError::NoProgram);
    }
    Ok((tag, pty, argv))
}

/// The arguments after `signal`: the tag and the signal's name.
pub fn parse_signal(
    mut args: impl Iterator<Item = OsString>,
) -> Result<(String, ProcessSignal), AttachError> {
    let tag = args
        .next()
        .map_or_else(String::new, |t| t.to_string_lossy().into_owned());
    if !valid_tag(&tag) {
        return Err(AttachError::Tag(tag));
    }
    let name = args
        .next()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let signal = ProcessSignal::parse(&name).ok_or(AttachError::Signal(name))?;
    if args.next().is_some() {
        return Err(AttachError::NoProgram);
    }
    Ok((tag, signal))
}

/// Runs the program to its end; returns the supervisor's exit status.
pub fn attach(argv: &[OsString]) -> Result<u8, AttachError> {
    let mut signals = SigSet::empty();
    for signal in PASSED {
        signals.add(signal);
    }
    signals.add(Signal::SIGCHLD);
    signals.thread_block().map_err(AttachError::Block)?;
    let mut child = Command::new(TRAMPOLINE)
        .arg0("sandgate-init")
        .arg(EXEC_MODE)
        .arg("--")
        .args(argv)
        .process_group(0)
        .spawn()
        .map_err(AttachError::Spawn)?;
    let group = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    loop {
        match signals.wait().map_err(AttachError::Wait)? {
            Signal::SIGCHLD => {
                if let Some(status) = child.try_wait().map_err(AttachError::Status)? {
                    // What the program left in its group ends with it.
                    let _ = killpg(group, Signal::SIGKILL);
                    return Ok(status_code(status));
                }
            }
            Signal::SIGUSR2 => pass(group, Signal::SIGKILL),
            signal => pass(group, signal),
        }
    }
}

pub(crate) fn pass(group: Pid, signal: Signal) {
    // ESRCH: the program is gone, its SIGCHLD is on the way.
    let _ = killpg(group, signal);
}

/// The program's status as a shell reports it.
pub(crate) fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(EXIT_INIT_ERROR),
        (None, Some(signal)) => u8::try_from(signaled_status(signal)).unwrap_or(u8::MAX),
        (None, None) => EXIT_INIT_ERROR,
    }
}

/// Sends `signal` (its carrier) to the attach supervisor of `tag`; [`EXIT_NO_PROCESS`] when
/// none runs.
pub fn signal(tag: &str, signal: ProcessSignal) -> Result<u8, AttachError> {
    let me = std::process::id();
    let mut found = false;
    for entry in std::fs::read_dir("/proc").map_err(AttachError::Proc)? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me || !supervises(pid, tag) {
            continue;
        }
        let pid = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
        if let Ok(carrier) = Signal::try_from(signal.carrier()) {
            found |= kill(pid, carrier).is_ok();
        }
    }
    Ok(if found { 0 } else { EXIT_NO_PROCESS })
}

/// Whether process `pid` is the attach supervisor of `tag`.
fn supervises(pid: u32, tag: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let mut args = cmdline.split(|byte| *byte == 0).skip(1);
    args.next() == Some(ATTACH_MODE.as_bytes()) && args.next() == Some(tag.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os<'a>(list: &'a [&'a str]) -> impl Iterator<Item = OsString> + 'a {
        list.iter().map(OsString::from)
    }

    #[test]
    fn arguments_are_checked() {
        let (tag, pty, argv) = parse_attach(os(&["ex_1", "--", "sleep", "1"])).unwrap();
        assert_eq!((tag.as_str(), pty, argv.len()), ("ex_1", None, 2));
        let (_, pty, _) = parse_attach(os(&["ex_1", "pty=80x24", "--", "bash"])).unwrap();
        assert_eq!(pty, PtySize::new(80, 24));
        for bad in [
            &["ex_1", "sleep"][..],
            &["a b", "--", "x"],
            &["ex_1", "--"],
            &["ex_1", "pty=0x1", "--", "x"],
            &["ex_1", "pty=80x24", "x"],
        ] {
            assert!(parse_attach(os(bad)).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_signal(os(&["ex_1", "KILL"])).unwrap().1,
            ProcessSignal::Kill
        );
        assert!(parse_signal(os(&["ex_1", "STOP"])).is_err());
    }

    #[test]
    fn statuses_follow_the_shell() {
        assert_eq!(status_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(status_code(ExitStatus::from_raw(9)), 137);
    }
}

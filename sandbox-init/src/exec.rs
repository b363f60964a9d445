//! The exec trampoline: `sandgate-init exec -- PROGRAM [ARG...]`.
//!
//! The init starts the program through this mode (see [`crate::process`] for why): it takes
//! the program's whole identity (the init's effective ids, see [`crate::identity`]), clears
//! the signal mask inherited from the init, then replaces itself with the program (`execvp`:
//! `PATH` lookup when the name has no `/`). Process group, stdio, working directory and
//! environment were set by the init and carry over. `SIGPIPE`, which the Rust runtime ignores
//! at start-up, is reset to its default by std's `exec`.
//!
//! It returns only if the exec failed, with an error that maps to 127 (not found) or 126 (not
//! executable) as a shell does. Running it by hand inside a sandbox grants nothing: it is a
//! plain exec under the caller's own identity.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::errno::Errno;
use nix::sys::signal::{sigprocmask, SigSet, SigmaskHow};
use thiserror::Error;

use crate::spec::shown;
use crate::{EXIT_INIT_ERROR, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND};

/// The program could not be started.
#[derive(Debug, Error)]
pub enum ExecError {
    #[error("exec mode needs a program after `--`")]
    NoProgram,
    #[error("clearing the signal mask: {0}")]
    Unblock(Errno),
    #[error("taking the program's identity: {0}")]
    Identity(crate::identity::IdentityError),
    #[error("cannot run \"{program}\": {err}")]
    Exec { program: String, err: io::Error },
}

impl ExecError {
    /// 127 when nothing by that name exists (`ENOENT`, also for a missing `#!` interpreter),
    /// 126 when it exists but cannot be executed (`EACCES`, `ENOEXEC`), 125 otherwise.
    pub fn exit_code(&self) -> u8 {
        let ExecError::Exec { err, .. } = self else {
            return EXIT_INIT_ERROR;
        };
        match err.raw_os_error().map(Errno::from_raw) {
            Some(Errno::ENOENT) => EXIT_NOT_FOUND,
            Some(Errno::EACCES | Errno::ENOEXEC) => EXIT_NOT_EXECUTABLE,
            _ => EXIT_INIT_ERROR,
        }
    }
}

/// Replaces the current process with `argv`; returns only on failure. `apart`: started by a
/// settled init, wait until PID 1 is out of reach first (see [`crate::identity`]).
pub fn exec(argv: &[OsString], apart: bool) -> ExecError {
    let Some((program, args)) = argv.split_first() else {
        return ExecError::NoProgram;
    };
    if apart {
        if let Err(err) = crate::identity::wait_until_apart() {
            return ExecError::Identity(err);
        }
    }
    if let Err(err) = crate::identity::become_effective() {
        return ExecError::Identity(err);
    }
    if let Err(errno) = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None) {
        return ExecError::Unblock(errno);
    }
    let err = Command::new(program).args(args).exec();
    ExecError::Exec {
        program: shown(&program.to_string_lossy()),
        err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(errno: Errno) -> ExecError {
        ExecError::Exec {
            program: "p".into(),
            err: io::Error::from_raw_os_error(errno as i32),
        }
    }

    #[test]
    fn exec_errors_map_to_126_and_127() {
        assert_eq!(failed(Errno::ENOENT).exit_code(), 127);
        assert_eq!(failed(Errno::EACCES).exit_code(), 126);
        assert_eq!(failed(Errno::ENOEXEC).exit_code(), 126);
        assert_eq!(failed(Errno::E2BIG).exit_code(), 125);
        assert_eq!(failed(Errno::ENOMEM).exit_code(), 125);
        assert_eq!(ExecError::NoProgram.exit_code(), 125);
    }

    #[test]
    fn an_empty_argv_is_refused_without_exec() {
        assert!(matches!(exec(&[], false), ExecError::NoProgram));
    }

    #[test]
    fn a_missing_program_is_reported_not_exec_d() {
        let err = exec(&["sandgate-no-such-program".into()], false);
        assert_eq!(err.exit_code(), 127, "{err}");
        assert!(err
            .to_string()
            .starts_with("cannot run \"sandgate-no-such-program\": "));
    }
}

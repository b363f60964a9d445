//! A session sandbox's processes (E2B's `process.Process`): several at once, each with its own
//! stdin, stdout and stderr, beside the session's runner and never through the init.
//!
//! The init must not spawn once it is multi-threaded (sandbox-init's `identity`), so a later
//! process is started by something that already runs as the program's user: the gateway runs
//! `docker exec --user 65534:65534 <sandbox> /sandgate/init attach <tag> -- PROGRAM [ARG...]`
//! ([`attach_argv`]). That **attach supervisor** (the init binary in [`ATTACH_MODE`], with
//! no capability, as a `docker exec` of a non-root user gets none) starts the program through
//! the exec trampoline in a new process group, with the exec's stdin, stdout and stderr as its
//! own (so its output reaches the gateway as it is written, and stdin is the exec's), forwards
//! signals to that group, kills what is left of the group when the program ends, and exits
//! with the program's status (or 128 + the signal that killed it). The exec's working
//! directory and environment are the process's.
//!
//! Signals: `docker exec ... /sandgate/init signal <tag> <SIGNAL>` ([`signal_argv`]) finds
//! the attach supervisor of `<tag>` by its command line and sends it the signal's
//! [`ProcessSignal::carrier`]; the supervisor passes [`ProcessSignal`] on to the program's
//! group (SIGKILL travels as SIGUSR2, which the supervisor can catch). The tag is the
//! execution's id, made by the gateway: letters, digits and `_` ([`valid_tag`]).
//!
//! Everything here runs as the program's user, so the program can signal these supervisors
//! and forge one's command line: it can end or confuse only its own processes, as it could
//! anyway (their records then say what the supervisor's exit said).

/// First argument of an attach supervisor.
pub const ATTACH_MODE: &str = "attach";
/// First argument of a signal request.
pub const SIGNAL_MODE: &str = "signal";
/// Where the gateway mounts the init in every sandbox.
pub const INIT_PATH: &str = "/sandgate/init";
/// The uid and gid of the program (and of everything `docker exec` starts for it).
pub const PROGRAM_USER: &str = "65534:65534";
/// Longest tag.
pub const MAX_TAG: usize = 64;

/// A signal E2B's `SendSignal` may ask for (its `Signal` enum), as sandgate passes it on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessSignal {
    Kill,
    Term,
    Int,
    Hup,
    Quit,
}

impl ProcessSignal {
    /// The name on the signal request's command line.
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessSignal::Kill => "KILL",
            ProcessSignal::Term => "TERM",
            ProcessSignal::Int => "INT",
            ProcessSignal::Hup => "HUP",
            ProcessSignal::Quit => "QUIT",
        }
    }

    pub fn parse(name: &str) -> Option<ProcessSignal> {
        [
            ProcessSignal::Kill,
            ProcessSignal::Term,
            ProcessSignal::Int,
            ProcessSignal::Hup,
            ProcessSignal::Quit,
        ]
        .into_iter()
        .find(|signal| signal.as_str() == name)
    }

    /// The signal number the program's group gets.
    pub fn number(self) -> i32 {
        match self {
            ProcessSignal::Kill => 9,
            ProcessSignal::Term => 15,
            ProcessSignal::Int => 2,
            ProcessSignal::Hup => 1,
            ProcessSignal::Quit => 3,
        }
    }

    /// The signal number the attach supervisor is sent to pass this one on (SIGKILL cannot
    /// be caught: it travels as SIGUSR2).
    pub fn carrier(self) -> i32 {
        match self {
            ProcessSignal::Kill => 12,
            other => other.number(),
        }
    }
}

/// Whether `tag` may name a process: 1 to [`MAX_TAG`] letters, digits or `_`.
pub fn valid_tag(tag: &str) -> bool {
    (1..=MAX_TAG).contains(&tag.len())
        && tag
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_')
}

/// The command line of an attach supervisor.
pub fn attach_argv(tag: &str, argv: &[String]) -> Vec<String> {
    let mut line = vec![
        INIT_PATH.to_owned(),
        ATTACH_MODE.to_owned(),
        tag.to_owned(),
        "--".to_owned(),
    ];
    line.extend(argv.iter().cloned());
    line
}

/// The command line of a signal request.
pub fn signal_argv(tag: &str, signal: ProcessSignal) -> Vec<String> {
    vec![
        INIT_PATH.to_owned(),
        SIGNAL_MODE.to_owned(),
        tag.to_owned(),
        signal.as_str().to_owned(),
    ]
}

/// An attach supervisor's status when the program was killed by signal `number`.
pub fn signaled_status(number: i32) -> i32 {
    128 + number
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_round_trip_and_kill_travels_as_usr2() {
        for name in ["KILL", "TERM", "INT", "HUP", "QUIT"] {
            assert_eq!(ProcessSignal::parse(name).unwrap().as_str(), name);
        }
        assert_eq!(ProcessSignal::parse("STOP"), None);
        assert_eq!(ProcessSignal::Kill.carrier(), 12);
        assert_eq!(ProcessSignal::Term.carrier(), 15);
    }

    #[test]
    fn tags_are_plain() {
        assert!(valid_tag("ex_01HZX"));
        for bad in ["", "a b", "a/b", "-x", &"a".repeat(65)] {
            assert!(!valid_tag(bad), "{bad}");
        }
        assert_eq!(
            attach_argv("ex_1", &["/bin/bash".into(), "-c".into(), "x".into()]),
            [
                "/sandgate/init",
                "attach",
                "ex_1",
                "--",
                "/bin/bash",
                "-c",
                "x"
            ]
        );
    }
}

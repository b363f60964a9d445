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
//! **PTY mode** ([`attach_argv`] with a [`PtySize`]: `attach <tag> pty=<cols>x<rows> -- ...`):
//! the supervisor opens a pseudo-terminal in the sandbox, keeps its master, and starts the
//! program in a new session with the terminal's other end as its controlling terminal and its
//! stdin, stdout and stderr. The exec's stdout carries what the terminal shows; the exec's stdin
//! is then the supervisor's control channel, a sequence of [`PtyFrame`]s (input for the
//! terminal, or a new size), never raw bytes.
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

/// The command line of an attach supervisor (with a terminal of `pty`'s size when given).
pub fn attach_argv(tag: &str, pty: Option<PtySize>, argv: &[String]) -> Vec<String> {
    let mut line = vec![INIT_PATH.to_owned(), ATTACH_MODE.to_owned(), tag.to_owned()];
    if let Some(size) = pty {
        line.push(size.arg());
    }
    line.push("--".to_owned());
    line.extend(argv.iter().cloned());
    line
}

/// Prefix of an attach supervisor's PTY argument (`pty=<cols>x<rows>`).
pub const PTY_ARG_PREFIX: &str = "pty=";
/// Largest input one [`PtyFrame`] carries (longer input is sent as several).
pub const MAX_PTY_FRAME: usize = 64 * 1024;
/// Frame kinds on a PTY supervisor's control channel.
const FRAME_INPUT: u8 = 0;
const FRAME_RESIZE: u8 = 1;

/// A terminal's size, in character cells (E2B's `PTY.Size`); both at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

impl PtySize {
    /// A size from E2B's 32-bit fields; `None` when one is 0 or past `u16`.
    pub fn new(cols: u32, rows: u32) -> Option<PtySize> {
        let cols = u16::try_from(cols).ok().filter(|c| *c > 0)?;
        let rows = u16::try_from(rows).ok().filter(|r| *r > 0)?;
        Some(PtySize { cols, rows })
    }

    /// The supervisor's argument for this size.
    pub fn arg(self) -> String {
        format!("{PTY_ARG_PREFIX}{}x{}", self.cols, self.rows)
    }

    /// The size of a supervisor's `pty=<cols>x<rows>` argument.
    pub fn parse_arg(arg: &str) -> Option<PtySize> {
        let (cols, rows) = arg.strip_prefix(PTY_ARG_PREFIX)?.split_once('x')?;
        PtySize::new(cols.parse().ok()?, rows.parse().ok()?)
    }
}

/// One message on a PTY supervisor's control channel (the exec's stdin): a kind byte, a
/// big-endian u32 length, the payload (input bytes, or cols and rows as big-endian u16s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtyFrame {
    /// Bytes typed into the terminal (at most [`MAX_PTY_FRAME`]).
    Input(Vec<u8>),
    /// The terminal's new size.
    Resize(PtySize),
}

impl PtyFrame {
    pub fn encode(&self) -> Vec<u8> {
        let (kind, payload) = match self {
            PtyFrame::Input(bytes) => (FRAME_INPUT, bytes.clone()),
            PtyFrame::Resize(size) => {
                let mut payload = size.cols.to_be_bytes().to_vec();
                payload.extend_from_slice(&size.rows.to_be_bytes());
                (FRAME_RESIZE, payload)
            }
        };
        let mut out = vec![kind];
        out.extend_from_slice(
            &u32::try_from(payload.len())
                .unwrap_or(u32::MAX)
                .to_be_bytes(),
        );
        out.extend_from_slice(&payload);
        out
    }

    /// Takes the first whole frame off `buffer`: `Ok(None)` until one is there, `Err` for
    /// a malformed one (the channel is then unusable).
    pub fn take(buffer: &mut Vec<u8>) -> Result<Option<PtyFrame>, String> {
        if buffer.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
        if len > MAX_PTY_FRAME {
            return Err(format!(
                "a PTY frame of {len} bytes is over {MAX_PTY_FRAME}"
            ));
        }
        if buffer.len() < 5 + len {
            return Ok(None);
        }
        let kind = buffer[0];
        let payload: Vec<u8> = buffer.drain(..5 + len).skip(5).collect();
        match (kind, payload.as_slice()) {
            (FRAME_INPUT, _) => Ok(Some(PtyFrame::Input(payload))),
            (FRAME_RESIZE, [c0, c1, r0, r1]) => PtySize::new(
                u32::from(u16::from_be_bytes([*c0, *c1])),
                u32::from(u16::from_be_bytes([*r0, *r1])),
            )
            .map(|size| Some(PtyFrame::Resize(size)))
            .ok_or_else(|| "a PTY resize to a zero size".to_owned()),
            _ => Err("an unknown PTY frame".to_owned()),
        }
    }
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
    fn pty_frames_round_trip_in_pieces() {
        let size = PtySize::new(120, 40).unwrap();
        assert_eq!(PtySize::parse_arg(&size.arg()), Some(size));
        for bad in ["pty=0x4", "pty=80", "pty=70000x2", "80x24"] {
            assert_eq!(PtySize::parse_arg(bad), None, "{bad}");
        }
        let mut wire = PtyFrame::Input(b"ls\r".to_vec()).encode();
        wire.extend(PtyFrame::Resize(size).encode());
        let mut buffer = Vec::new();
        let mut frames = Vec::new();
        for byte in wire {
            buffer.push(byte);
            while let Some(frame) = PtyFrame::take(&mut buffer).unwrap() {
                frames.push(frame);
            }
        }
        assert_eq!(
            frames,
            [PtyFrame::Input(b"ls\r".to_vec()), PtyFrame::Resize(size)]
        );
        let mut zero = vec![FRAME_RESIZE, 0, 0, 0, 4, 0, 0, 0, 1];
        assert!(PtyFrame::take(&mut zero).is_err());
        let mut huge = vec![FRAME_INPUT, 0xff, 0xff, 0xff, 0xff];
        assert!(PtyFrame::take(&mut huge).is_err());
    }

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
            attach_argv("ex_1", None, &["/bin/bash".into(), "-c".into(), "x".into()]),
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

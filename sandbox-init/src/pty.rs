//! The attach supervisor in PTY mode (`attach <tag> pty=<cols>x<rows> -- PROGRAM [ARG...]`,
//! `sandbox_protocol`'s `procs` module): E2B's `pty.create`.
//!
//! It opens a pseudo-terminal in the sandbox (`/dev/ptmx`, which gVisor provides), keeps the
//! master and gives the other end as stdin, stdout and stderr to a **session keeper** (the
//! init binary as `exec --tty`, [`keep`]): that one leads a new session whose controlling
//! terminal it is, starts the program in a process group of its own as the terminal's
//! foreground group, and stays, so the terminal's signal keys reach the foreground job. Like
//! the plain supervisor ([`crate::attach`]) the supervisor blocks the signals it passes on and
//! `SIGCHLD` before anything starts, and waits for them; two threads carry the bytes
//! meanwhile: the terminal's output to the exec's stdout, and the exec's stdin, read as
//! [`PtyFrame`]s, to the terminal (input) or to its size (`TIOCSWINSZ`, which sends the
//! program `SIGWINCH`). When the program ends, or on a forwarded kill, every process of the
//! session is killed (an interactive shell puts its jobs in process groups of their own),
//! what the terminal still holds is written out, and the supervisor exits with the program's
//! status.
//!
//! Signal keys: the gVisor this runs on (runsc 20221219 here) echoes `^C` but signals no one,
//! and answers `TIOCGPGRP` only to a process of the terminal's session. So while the
//! terminal's `ISIG` is on, the supervisor takes its signal keys (`^C`, `^\`, `^Z` as its
//! settings name them) out of the input and sends the keeper that signal, and the keeper,
//! in the session, passes it to the terminal's foreground group, as a kernel's line discipline
//! would. With `ISIG` off (a program in raw mode) they are input bytes like any other.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, SigSet, Signal};
use nix::unistd::Pid;
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;
use sandbox_protocol::{PtyFrame, PtySize};

use crate::attach::{pass, status_code, AttachError, PASSED};
use crate::process::TRAMPOLINE;
use crate::{EXEC_MODE, TTY_FLAG};

/// After the program ended: how long the terminal may stay quiet before the supervisor stops
/// waiting for more of its output, and the longest it waits in all.
const DRAIN_QUIET: Duration = Duration::from_millis(200);
const DRAIN_MOST: Duration = Duration::from_secs(2);
/// Bytes read from the terminal at once.
const READ_CHUNK: usize = 16 * 1024;

/// Runs the program on a terminal of `size` to its end; returns the supervisor's status.
pub fn attach(argv: &[OsString], size: PtySize) -> Result<u8, AttachError> {
    let mut signals = SigSet::empty();
    for signal in PASSED {
        signals.add(signal);
    }
    signals.add(Signal::SIGCHLD);
    // Blocked before the threads start, so they inherit the mask and only `wait` takes them.
    signals.thread_block().map_err(AttachError::Block)?;
    let (master, replica) = open_terminal(size).map_err(AttachError::Terminal)?;
    let mut child = spawn_on(&replica, argv)?;
    drop(replica);
    let leader = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let output = copy_output(&master).map_err(AttachError::Terminal)?;
    feed_control(master, leader);
    loop {
        match signals.wait().map_err(AttachError::Wait)? {
            Signal::SIGCHLD => {
                if let Some(status) = child.try_wait().map_err(AttachError::Status)? {
                    kill_session(leader);
                    drain(&output);
                    return Ok(status_code(status));
                }
            }
            Signal::SIGUSR2 => kill_session(leader),
            signal => pass(leader, signal),
        }
    }
}

/// A new terminal of `size`: its master and its other end, both close-on-exec.
fn open_terminal(size: PtySize) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    set_size(&master, size)?;
    let replica = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_NOCTTY.bits())
        .open(std::ffi::OsStr::from_bytes(name.as_bytes()))?;
    Ok((master, OwnedFd::from(replica)))
}

fn set_size(master: impl AsFd, size: PtySize) -> std::io::Result<()> {
    let winsize = Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    Ok(rustix::termios::tcsetwinsize(master, winsize)?)
}

/// Starts the program through the trampoline with the terminal as its stdio.
fn spawn_on(replica: &OwnedFd, argv: &[OsString]) -> Result<std::process::Child, AttachError> {
    let stdio = || -> Result<Stdio, AttachError> {
        Ok(Stdio::from(
            replica.try_clone().map_err(AttachError::Terminal)?,
        ))
    };
    Command::new(TRAMPOLINE)
        .arg0("sandgate-init")
        .arg(EXEC_MODE)
        .arg(TTY_FLAG)
        .arg("--")
        .args(argv)
        .stdin(stdio()?)
        .stdout(stdio()?)
        .stderr(stdio()?)
        .spawn()
        .map_err(AttachError::Spawn)
}

/// Copies what the terminal shows to stdout until it has no writer left (`EIO`); each copy
/// is told on the returned channel, which closes when the copying ends.
fn copy_output(master: &OwnedFd) -> std::io::Result<mpsc::Receiver<()>> {
    let mut terminal = File::from(master.try_clone()?);
    let (told, copied) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; READ_CHUNK];
        let mut stdout = std::io::stdout();
        loop {
            let read = match terminal.read(&mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            if stdout.write_all(&buffer[..read]).is_err() || stdout.flush().is_err() {
                return;
            }
            let _ = told.send(());
        }
    });
    Ok(copied)
}

/// Reads the control channel (stdin) and acts on its frames until it ends or is malformed.
fn feed_control(master: OwnedFd, keeper: Pid) {
    let terminal = File::from(master);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut held = Vec::new();
        let mut buffer = vec![0u8; READ_CHUNK];
        loop {
            let read = match stdin.read(&mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            held.extend_from_slice(&buffer[..read]);
            loop {
                let acted = match PtyFrame::take(&mut held) {
                    Ok(Some(PtyFrame::Input(bytes))) => {
                        type_into(&terminal, &bytes, keeper).is_ok()
                    }
                    Ok(Some(PtyFrame::Resize(size))) => set_size(&terminal, size).is_ok(),
                    Ok(None) => break,
                    Err(err) => {
                        eprintln!("sandgate-init: the PTY's control channel: {err}");
                        return;
                    }
                };
                if !acted {
                    return;
                }
            }
        }
    });
}

/// Writes typed bytes to the terminal; a signal key (while `ISIG` is on) is sent to the
/// keeper as its signal instead (see the module's docs).
fn type_into(terminal: &File, bytes: &[u8], keeper: Pid) -> std::io::Result<()> {
    let keys = signal_keys(terminal);
    let mut writer = terminal;
    let mut from = 0;
    for (at, byte) in bytes.iter().enumerate() {
        if let Some((_, signal)) = keys.iter().find(|(key, _)| key == byte) {
            writer.write_all(&bytes[from..at])?;
            let _ = kill(keeper, *signal);
            from = at + 1;
        }
    }
    writer.write_all(&bytes[from..])
}

/// The terminal's signal keys now, with their signals; none while its `ISIG` is off.
fn signal_keys(terminal: &File) -> Vec<(u8, Signal)> {
    use rustix::termios::{LocalModes, SpecialCodeIndex};
    let Ok(settings) = rustix::termios::tcgetattr(terminal) else {
        return Vec::new();
    };
    if !settings.local_modes.contains(LocalModes::ISIG) {
        return Vec::new();
    }
    [
        (SpecialCodeIndex::VINTR, Signal::SIGINT),
        (SpecialCodeIndex::VQUIT, Signal::SIGQUIT),
        (SpecialCodeIndex::VSUSP, Signal::SIGTSTP),
    ]
    .into_iter()
    .map(|(index, signal)| (settings.special_codes[index], signal))
    // 0 is `_POSIX_VDISABLE`: that key is off.
    .filter(|(key, _)| *key != 0)
    .collect()
}

/// The session keeper (`exec --tty -- PROGRAM...`, started by the PTY supervisor with the
/// terminal as stdin): leads a new session with the terminal as its controlling one, starts
/// the program through the trampoline in a process group of its own, makes that the
/// terminal's foreground group, and waits: `SIGINT`, `SIGQUIT`, `SIGTSTP` go to whatever group
/// is in the foreground then (the supervisor's signal keys), `SIGTERM` and `SIGHUP` to the
/// program's group; it exits with the program's status.
pub fn keep(argv: &[OsString]) -> Result<u8, AttachError> {
    let mut signals = SigSet::empty();
    for signal in KEPT {
        signals.add(signal);
    }
    signals.add(Signal::SIGCHLD);
    signals.thread_block().map_err(AttachError::Block)?;
    let terminal = std::io::stdin();
    rustix::process::setsid()
        .and_then(|_| rustix::process::ioctl_tiocsctty(&terminal))
        .map_err(|err| AttachError::Terminal(err.into()))?;
    let mut child = Command::new(TRAMPOLINE)
        .arg0("sandgate-init")
        .arg(EXEC_MODE)
        .arg("--")
        .args(argv)
        .process_group(0)
        .spawn()
        .map_err(AttachError::Spawn)?;
    let group = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    if let Some(foreground) = rustix::process::Pid::from_raw(group.as_raw()) {
        let _ = rustix::termios::tcsetpgrp(&terminal, foreground);
    }
    // A shell that found itself in the background before that stopped itself (SIGTTIN).
    let _ = killpg(group, Signal::SIGCONT);
    loop {
        match signals.wait().map_err(AttachError::Wait)? {
            Signal::SIGCHLD => {
                if let Some(status) = child.try_wait().map_err(AttachError::Status)? {
                    return Ok(status_code(status));
                }
            }
            signal @ (Signal::SIGINT | Signal::SIGQUIT | Signal::SIGTSTP) => {
                let foreground = rustix::termios::tcgetpgrp(&terminal)
                    .map_or(group, |pgrp| Pid::from_raw(pgrp.as_raw_pid()));
                let _ = killpg(foreground, signal);
            }
            signal => pass(group, signal),
        }
    }
}

/// What the keeper waits for besides `SIGCHLD`.
const KEPT: [Signal; 5] = [
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTSTP,
    Signal::SIGTERM,
    Signal::SIGHUP,
];

/// Waits for the terminal's last output: until it closed, is quiet, or [`DRAIN_MOST`] passed.
fn drain(copied: &mpsc::Receiver<()>) {
    let until = Instant::now() + DRAIN_MOST;
    while Instant::now() < until {
        match copied.recv_timeout(DRAIN_QUIET) {
            Ok(()) => {}
            Err(_) => return,
        }
    }
}

/// Kills every process of the session `leader` leads (read from `/proc/<pid>/stat`).
fn kill_session(leader: Pid) {
    let _ = killpg(leader, Signal::SIGKILL);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if session_of(&stat) == Some(leader.as_raw()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// The session id in a `/proc/<pid>/stat` line (the 6th field; the 2nd, the command's name,
/// may hold spaces and parentheses, so fields are counted after its last `)`).
fn session_of(stat: &str) -> Option<i32> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_is_read_after_the_name() {
        let stat = "412 (a) b (c)) S 1 412 400 34816 412 4194560 0";
        assert_eq!(session_of(stat), Some(400));
        assert_eq!(session_of("garbage"), None);
    }
}

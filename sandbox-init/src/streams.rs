//! The program's stdout and stderr: pipes of the sandbox that the init drains onto its own.
//!
//! The init's stdout and stderr are the container's (host descriptors that the gateway reads
//! through `docker attach`). gVisor lets a write to them return a short count when the host
//! side is full (seen: 65,536 of 300,000 bytes, never `EAGAIN`), and a program that does not
//! retry loses the rest without knowing: unbuffered CPython's `print` of 200,000 characters
//! kept 65,537. So the program never gets those descriptors. Its fds 1 and 2 are the write
//! ends of two pipes of the sandbox's own kernel, where a blocking write takes every byte
//! (Linux pipe semantics), and one relay thread of the init reads the other ends and writes
//! everything to the init's stdout and stderr, retrying short writes ([`write_all`]). The
//! program is slowed down by a slow reader as before (the pipe fills and its writes wait),
//! never cut short. The cost is one thread started per sandbox and one copy per chunk.
//!
//! Each stream stays in order, and the init writes its own lines (the end marker, the exit
//! trailer, `sandgate-init:` errors) to the same descriptors under the same lock, whole: so
//! the end marker follows everything the program wrote once [`Relaying::finish`] has seen both
//! pipes end, which happens when the last process holding a write end is gone.
//!
//! A session also relays its runner's reports (see [`crate::session`]): the thread that
//! drains the pipes is the one that writes a turn's end markers, after it has drained what the
//! pipes held when the report came.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use thiserror::Error;

/// Most bytes read from a pipe at once (gVisor commits the whole buffer a read is given).
const CHUNK: usize = 64 * 1024;
/// Stack of the relay thread: its buffer is on the heap.
const STACK_SIZE: usize = 256 * 1024;
/// How long the init waits for the pipes to end when something of the program may still hold
/// them (it could not make sure nothing is left, see [`crate::process::quiesce`]).
pub const UNSURE_WAIT: Duration = Duration::from_secs(1);
/// How long a write to the init's own stream waits for room before trying again, in ms.
const WRITE_RETRY_MS: u8 = 100;

#[derive(Debug, Error)]
pub enum StreamError {
    #[error("creating the program's output pipes: {0}")]
    Pipe(Errno),
    #[error("starting the output relay: {0}")]
    Spawn(io::Error),
}

/// One of the init's own streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    Stdout,
    Stderr,
}

/// Writes all of `bytes` to the init's stream, whatever short counts the host descriptor
/// returns, under the stream's lock (so whole, never interleaved with another writer's
/// bytes). `EAGAIN` and a zero count wait for room; other errors are returned.
pub fn write_all(host: Host, bytes: &[u8]) -> io::Result<()> {
    match host {
        Host::Stdout => {
            let mut lock = io::stdout().lock();
            lock.flush()?;
            write_fd(lock.as_fd(), bytes)
        }
        Host::Stderr => {
            let lock = io::stderr().lock();
            write_fd(lock.as_fd(), bytes)
        }
    }
}

fn write_fd(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match nix::unistd::write(fd, bytes) {
            Ok(0) | Err(Errno::EAGAIN) => {
                let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
                match poll(&mut fds, PollTimeout::from(WRITE_RETRY_MS)) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(errno) => return Err(errno.into()),
                }
            }
            Ok(written) => bytes = &bytes[written..],
            Err(Errno::EINTR) => {}
            Err(errno) => return Err(errno.into()),
        }
    }
    Ok(())
}

/// The program's ends: its fds 1 and 2.
#[derive(Debug)]
pub struct ProgramEnds {
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// The init's ends, not relayed yet: what the program writes waits in the pipes.
#[derive(Debug)]
pub struct Captured {
    stdout: OwnedFd,
    stderr: OwnedFd,
}

/// Creates both pipes, every end close-on-exec (the spawn makes the program's ends its fds 1
/// and 2; nothing else inherits them).
pub fn capture() -> Result<(Captured, ProgramEnds), StreamError> {
    let (out_read, out_write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(StreamError::Pipe)?;
    let (err_read, err_write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(StreamError::Pipe)?;
    Ok((
        Captured {
            stdout: out_read,
            stderr: err_read,
        },
        ProgramEnds {
            stdout: out_write,
            stderr: err_write,
        },
    ))
}

/// What the relay thread serves besides the two pipes (a session's runner channel).
pub trait Extra: Send + 'static {
    /// The descriptor to watch for reading.
    fn fd(&self) -> BorrowedFd<'_>;
    /// It is readable (or ended). `pipes` drains what the pipes hold now. Returns false once
    /// it is done and should no longer be watched.
    fn ready(&mut self, pipes: &mut Pipes) -> bool;
}

/// The pipes' read ends, as the relay thread holds them.
#[derive(Debug)]
pub struct Pipes {
    sources: Vec<Source>,
    buffer: Vec<u8>,
}

/// One pipe and where its bytes go.
#[derive(Debug)]
struct Source {
    fd: OwnedFd,
    host: Host,
    /// Cleared when the pipe ended (it is dropped at the top of the relay's next round, so
    /// that indices hold within a round).
    open: bool,
}

impl Pipes {
    /// Relays what each pipe holds now (at most its capacity, so a writer that never stops
    /// cannot hold the caller here), without waiting for more.
    pub fn drain(&mut self) {
        for index in 0..self.sources.len() {
            let source = &self.sources[index];
            let mut left = fcntl(source.fd.as_raw_fd(), FcntlArg::F_GETPIPE_SZ)
                .ok()
                .and_then(|size| usize::try_from(size).ok())
                .unwrap_or(CHUNK);
            while left > 0
                && self.sources[index].open
                && readable_now(self.sources[index].fd.as_fd())
            {
                left = left.saturating_sub(self.pump(index));
            }
        }
    }

    /// Reads one chunk from open source `index` and writes it on; returns how much. At the end
    /// of the source (EOF, an error, or the init's stream refusing it) it is marked closed.
    fn pump(&mut self, index: usize) -> usize {
        let source = &mut self.sources[index];
        if !source.open {
            return 0;
        }
        self.buffer.resize(CHUNK, 0);
        let read = loop {
            match nix::unistd::read(source.fd.as_raw_fd(), &mut self.buffer) {
                Err(Errno::EINTR) => {}
                Ok(0) | Err(_) => {
                    source.open = false;
                    return 0;
                }
                Ok(read) => break read,
            }
        };
        // A stream the init can no longer write: the pipe is closed, and the program's writes
        // fail as they would have on that stream.
        if write_all(source.host, &self.buffer[..read]).is_err() {
            source.open = false;
        }
        read
    }
}

fn readable_now(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

impl Captured {
    /// Starts the relay thread (after the spawn: see [`crate::identity`] on threads).
    pub fn relay(self, extra: Option<Box<dyn Extra>>) -> Result<Relaying, StreamError> {
        let pipes = Pipes {
            sources: vec![
                Source {
                    fd: self.stdout,
                    host: Host::Stdout,
                    open: true,
                },
                Source {
                    fd: self.stderr,
                    host: Host::Stderr,
                    open: true,
                },
            ],
            buffer: Vec::new(),
        };
        let (done, finished) = mpsc::channel();
        thread::Builder::new()
            .name("output-relay".to_owned())
            .stack_size(STACK_SIZE)
            .spawn(move || {
                serve(pipes, extra);
                let _ = done.send(());
            })
            .map_err(StreamError::Spawn)?;
        Ok(Relaying { finished })
    }
}

/// The relay thread's loop: until both pipes ended.
fn serve(mut pipes: Pipes, mut extra: Option<Box<dyn Extra>>) {
    loop {
        pipes.sources.retain(|source| source.open);
        if pipes.sources.is_empty() {
            return;
        }
        let mut fds: Vec<PollFd> = pipes
            .sources
            .iter()
            .map(|source| PollFd::new(source.fd.as_fd(), PollFlags::POLLIN))
            .collect();
        if let Some(extra) = &extra {
            fds.push(PollFd::new(extra.fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            // Cannot wait: nothing sensible is left but to stop relaying.
            Err(_) => return,
        }
        let ready: Vec<bool> = fds.iter().map(is_ready).collect();
        drop(fds);
        let served = extra.is_some() && ready.last().copied().unwrap_or(false);
        if served {
            if let Some(mut serving) = extra.take() {
                if serving.ready(&mut pipes) {
                    extra = Some(serving);
                }
            }
        }
        // Each round pumps every ready pipe once, so a busy channel cannot starve them; after
        // the channel's drain a pipe may be empty again, and a read must not wait.
        for (index, _) in ready.iter().enumerate().filter(|(_, ready)| **ready) {
            let Some(source) = pipes.sources.get(index) else {
                continue;
            };
            if !served || readable_now(source.fd.as_fd()) {
                pipes.pump(index);
            }
        }
    }
}

fn is_ready(fd: &PollFd<'_>) -> bool {
    fd.revents().is_some_and(|events| !events.is_empty())
}

/// The relay thread, running.
#[derive(Debug)]
pub struct Relaying {
    finished: mpsc::Receiver<()>,
}

impl Relaying {
    /// Waits until both pipes ended and all they held is written: for as long as it takes
    /// when nothing of the program is left (`quiet`: the ends will come), at most
    /// [`UNSURE_WAIT`] otherwise. Says whether they ended.
    pub fn finish(self, quiet: bool) -> bool {
        if quiet {
            self.finished.recv().is_ok()
        } else {
            self.finished.recv_timeout(UNSURE_WAIT).is_ok()
        }
    }
}

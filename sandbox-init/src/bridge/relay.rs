//! The relay thread: every bridged connection, both directions, with non-blocking sockets and
//! one edge-triggered epoll.
//!
//! Each direction of a connection is a [`Pipe`]. Bytes are read into the thread's one scratch
//! buffer and written on at once; only what the destination does not take now is kept, in the
//! pipe, and nothing more is read from that source until it has been written. So a slow reader
//! slows its writer down (each side's socket buffers are all the slack there is), never the
//! other direction or another connection, and memory is held only by congested pipes, each
//! for less than one read.
//!
//! Both sockets of a connection are registered once, edge-triggered, for reading and writing.
//! Edge-triggered readiness is only announced again after an operation would have blocked, so
//! a pipe stops only when a read or write would block, when its source ends, or after
//! [`ROUNDS`] reads, in which case the connection is queued to be pumped again without
//! waiting. Any event on either socket pumps both directions. Not `poll`: under gVisor each
//! `poll` registers every host socket it is given anew (the Unix sides are host sockets), so
//! the round trip through the bridge grew with the number of open connections (0.8 ms with
//! none, 1.8 ms with 200 idle ones); epoll's registrations stay.
//!
//! Hang-ups and errors are edges like the others: after a hang-up a read returns what is left
//! then EOF and a write fails, and a pending error comes out of the next read or write, which
//! is what closes the connection. (gVisor reports `POLLHUP | POLLERR` on a TCP socket whose
//! peer's FIN came after ours, with bytes still to read before it: taking the flags for an
//! error would lose those bytes.)

use std::io::{self, Read, Write};
use std::mem;
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::thread;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use super::{RelayError, Reporter, Slot, RETRY_PAUSE};

/// Most bytes read at once. Large because every system call is expensive under gVisor: bulk
/// data went through at about 480 MiB/s with 256 KiB, 120 MiB/s with 32 KiB. It is one buffer
/// for all connections: gVisor commits the whole buffer a `read` is given, so a buffer per
/// connection cost 128 MiB of the sandbox's memory for 256 idle connections.
const SCRATCH_SIZE: usize = 256 * 1024;
/// Most reads per direction before the loop turns to the other connections.
const ROUNDS: usize = 4;
/// Most events taken per `epoll_wait`.
const EVENTS: usize = 64;
/// The epoll token of the wake-up socket; connections use their index.
const WAKE: u64 = u64::MAX;

/// One bridged connection: the program's TCP side and the egress proxy's Unix side.
#[derive(Debug)]
pub(super) struct Connection {
    tcp: TcpStream,
    unix: UnixStream,
    /// Program to proxy.
    up: Pipe,
    /// Proxy to program.
    down: Pipe,
    /// In the relay's queue of connections to pump.
    queued: bool,
    _slot: Slot,
}

impl Connection {
    pub(super) fn new(tcp: TcpStream, unix: UnixStream, slot: Slot) -> io::Result<Self> {
        tcp.set_nonblocking(true)?;
        unix.set_nonblocking(true)?;
        // Relayed writes mirror the proxy's; holding them back (Nagle) only adds latency.
        tcp.set_nodelay(true)?;
        Ok(Connection {
            tcp,
            unix,
            up: Pipe::default(),
            down: Pipe::default(),
            queued: false,
            _slot: slot,
        })
    }

    /// Moves what can be moved now, both ways. An error means the connection is over.
    fn pump(&mut self, scratch: &mut [u8]) -> io::Result<Progress> {
        let up = self.up.pump(scratch, &self.tcp, &self.unix)?;
        let down = self.down.pump(scratch, &self.unix, &self.tcp)?;
        Ok(if up == Progress::More || down == Progress::More {
            Progress::More
        } else {
            Progress::Waiting
        })
    }

    fn finished(&self) -> bool {
        self.up.ended && self.down.ended
    }
}

/// Where a pump stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// On an operation that would block, or for good: the next edge brings it back.
    Waiting,
    /// After [`ROUNDS`] reads: there may be more to move at once.
    More,
}

/// One direction of a connection.
#[derive(Debug, Default)]
struct Pipe {
    /// Read, not yet taken by the destination; empty (and unallocated) most of the time.
    held: Vec<u8>,
    /// The source reached EOF, all was written and the destination's write half shut down.
    ended: bool,
}

impl Pipe {
    /// Writes out what is held back, then reads and writes on until either socket would
    /// block, the source ends (then shuts down the destination's write half) or [`ROUNDS`]
    /// reads went through.
    fn pump(
        &mut self,
        scratch: &mut [u8],
        mut from: impl Read,
        mut to: impl Write + HalfClose,
    ) -> io::Result<Progress> {
        if !self.held.is_empty() {
            let written = write_some(&mut to, &self.held)?;
            if written < self.held.len() {
                self.held.drain(..written);
                return Ok(Progress::Waiting);
            }
            self.held = Vec::new();
        }
        if self.ended {
            return Ok(Progress::Waiting);
        }
        for _ in 0..ROUNDS {
            let read = match from.read(scratch) {
                Ok(0) => {
                    // ENOTCONN if the peer is gone already: nothing left to tell it.
                    let _ = to.half_close();
                    self.ended = true;
                    return Ok(Progress::Waiting);
                }
                Ok(read) => read,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    return Ok(Progress::Waiting)
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(err),
            };
            let bytes = scratch.get(..read).unwrap_or_default();
            let written = write_some(&mut to, bytes)?;
            if let Some(rest) = bytes.get(written..).filter(|rest| !rest.is_empty()) {
                self.held.extend_from_slice(rest);
                return Ok(Progress::Waiting);
            }
        }
        Ok(Progress::More)
    }
}

/// Writes as much of `bytes` as `to` takes now; returns how much that was.
fn write_some(mut to: impl Write, bytes: &[u8]) -> io::Result<usize> {
    let mut written = 0;
    while let Some(rest) = bytes.get(written..).filter(|rest| !rest.is_empty()) {
        match to.write(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(count) => written += count,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(written)
}

/// Shutting down the write half of a socket, through a shared reference as std allows.
trait HalfClose {
    fn half_close(&self) -> io::Result<()>;
}

impl HalfClose for &TcpStream {
    fn half_close(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

impl HalfClose for &UnixStream {
    fn half_close(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

/// The relay thread's state.
pub(super) struct Relay {
    epoll: Epoll,
    /// Readable when the acceptor has handed over connections.
    woken: UnixStream,
    incoming: Receiver<Connection>,
    /// Indexed by epoll token; `None`: a free place.
    connections: Vec<Option<Connection>>,
    /// Connections to pump before waiting again.
    queue: Vec<usize>,
    /// Every read goes here first; see [`SCRATCH_SIZE`].
    scratch: Box<[u8]>,
    reporter: Arc<Reporter>,
}

impl Relay {
    /// Creates the epoll instance and registers `woken` with it.
    pub(super) fn new(
        woken: UnixStream,
        incoming: Receiver<Connection>,
        reporter: Arc<Reporter>,
    ) -> Result<Self, Errno> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(&woken, EpollEvent::new(EpollFlags::EPOLLIN, WAKE))?;
        Ok(Relay {
            epoll,
            woken,
            incoming,
            connections: Vec::new(),
            queue: Vec::new(),
            scratch: vec![0; SCRATCH_SIZE].into_boxed_slice(),
            reporter,
        })
    }

    pub(super) fn run(mut self) {
        let mut events = vec![EpollEvent::empty(); EVENTS];
        loop {
            let timeout = match self.queue.is_empty() {
                true => EpollTimeout::NONE,
                false => EpollTimeout::ZERO,
            };
            match self.epoll.wait(&mut events, timeout) {
                Ok(count) => {
                    for event in events.iter().take(count) {
                        match event.data() {
                            WAKE => self.take_incoming(),
                            token => self.enqueue(usize::try_from(token).unwrap_or(usize::MAX)),
                        }
                    }
                    self.pump_queued();
                }
                Err(Errno::EINTR) => {}
                Err(errno) => {
                    self.reporter.report(&RelayError::Wait(errno));
                    thread::sleep(RETRY_PAUSE);
                }
            }
        }
    }

    fn take_incoming(&mut self) {
        let mut drain = [0; 64];
        loop {
            match (&self.woken).read(&mut drain) {
                Ok(0) => {
                    // The acceptor is gone (it never returns): stop listening to its end,
                    // which would otherwise be readable, at EOF, on every wait.
                    let _ = self.epoll.delete(&self.woken);
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        while let Ok(connection) = self.incoming.try_recv() {
            self.admit(connection);
        }
    }

    /// Registers `connection` under a free index and queues it: bytes may be waiting already.
    fn admit(&mut self, connection: Connection) {
        let index = self
            .connections
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.connections.len());
        let token = u64::try_from(index).unwrap_or(WAKE);
        let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT | EpollFlags::EPOLLET;
        let registered = self
            .epoll
            .add(&connection.tcp, EpollEvent::new(flags, token))
            .and_then(|()| {
                self.epoll
                    .add(&connection.unix, EpollEvent::new(flags, token))
            });
        if let Err(errno) = registered {
            // Dropping the connection closes both sockets, which unregisters them.
            return self.reporter.report(&RelayError::Setup(errno.into()));
        }
        match self.connections.get_mut(index) {
            Some(place) => *place = Some(connection),
            None => self.connections.push(Some(connection)),
        }
        self.enqueue(index);
    }

    fn enqueue(&mut self, index: usize) {
        if let Some(Some(connection)) = self.connections.get_mut(index) {
            if !connection.queued {
                connection.queued = true;
                self.queue.push(index);
            }
        }
    }

    /// Pumps each queued connection once; closes those finished or failed, queues again
    /// those that stopped with more to move.
    fn pump_queued(&mut self) {
        for index in mem::take(&mut self.queue) {
            let Some(place) = self.connections.get_mut(index) else {
                continue;
            };
            let Some(connection) = place else {
                continue;
            };
            connection.queued = false;
            match connection.pump(&mut self.scratch) {
                Ok(_) if connection.finished() => {}
                Ok(Progress::Waiting) => continue,
                Ok(Progress::More) => {
                    connection.queued = true;
                    self.queue.push(index);
                    continue;
                }
                Err(_) => {}
            }
            if let Some(connection) = place.take() {
                // Explicitly, in case the runtime keeps a closed socket registered.
                let _ = self.epoll.delete(&connection.tcp);
                let _ = self.epoll.delete(&connection.unix);
            }
        }
    }
}

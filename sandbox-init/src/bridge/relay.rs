//! The relay thread: every bridged connection, both directions, with non-blocking sockets and
//! one `poll`.
//!
//! Each direction of a connection is a [`Pipe`]: a buffer that is filled from one socket only
//! once it has been written out in full to the other, so a slow reader slows its writer down
//! (each side's own socket buffers are all the slack there is) and never the other direction
//! or another connection. A socket is polled for reading when its direction's buffer is empty
//! and for writing when the other direction's buffer holds bytes.
//!
//! `poll` reports a hang-up or an error even when nothing was asked for, on every call, so a
//! socket that has reported one is left out of the poll set while nothing is wanted from it
//! (else the loop would spin). Nothing is lost: after a hang-up a read returns what is left
//! then EOF and a write fails, and a pending error comes out of the next read or write, so it
//! is enough to try them when there is something to read or write. Neither closes the
//! connection by itself: gVisor reports `POLLHUP | POLLERR` on a TCP socket whose peer has
//! sent its FIN after ours (checked), with bytes still to read before that FIN; a real error
//! closes the connection when a read or write returns it. Linux reports a hang-up on a Unix
//! socket whose peer has closed; gVisor, for the host's socket behind `--host-uds`, does not.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::thread;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::{RelayError, Reporter, Slot, RETRY_PAUSE};

/// Bytes read at once, per direction of a connection.
const BUFFER_SIZE: usize = 32 * 1024;
/// Most buffers moved per direction before the loop turns to the other connections.
const ROUNDS: usize = 8;

/// One bridged connection: the program's TCP side and the egress proxy's Unix side.
#[derive(Debug)]
pub(super) struct Connection {
    tcp: TcpStream,
    unix: UnixStream,
    /// Program to proxy.
    up: Pipe,
    /// Proxy to program.
    down: Pipe,
    /// `poll` reported a hang-up or an error on the socket (it will, on every call).
    tcp_hung_up: bool,
    unix_hung_up: bool,
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
            up: Pipe::new(),
            down: Pipe::new(),
            tcp_hung_up: false,
            unix_hung_up: false,
            _slot: slot,
        })
    }

    /// What to poll each socket for: `(tcp, unix)`.
    fn interest(&self) -> (PollFlags, PollFlags) {
        let wanted = |read: bool, write: bool| {
            let mut flags = PollFlags::empty();
            flags.set(PollFlags::POLLIN, read);
            flags.set(PollFlags::POLLOUT, write);
            flags
        };
        (
            wanted(self.up.wants_read(), self.down.pending()),
            wanted(self.down.wants_read(), self.up.pending()),
        )
    }

    /// Moves what can be moved now, both ways. An error means the connection is over.
    fn pump(&mut self) -> io::Result<()> {
        self.up.pump(&self.tcp, &self.unix)?;
        self.down.pump(&self.unix, &self.tcp)
    }

    fn finished(&self) -> bool {
        self.up.ended && self.down.ended
    }
}

/// One direction of a connection.
#[derive(Debug)]
struct Pipe {
    buffer: Box<[u8]>,
    /// Bytes `buffer[start..end]` are read and not written yet.
    start: usize,
    end: usize,
    /// The source reached EOF, all was written and the destination's write half shut down.
    ended: bool,
}

impl Pipe {
    fn new() -> Self {
        Pipe {
            buffer: vec![0; BUFFER_SIZE].into_boxed_slice(),
            start: 0,
            end: 0,
            ended: false,
        }
    }

    fn pending(&self) -> bool {
        self.start < self.end
    }

    fn wants_read(&self) -> bool {
        !self.ended && !self.pending()
    }

    /// Writes out what is buffered, then reads and writes on until either socket would block,
    /// the source ends (then shuts down the destination's write half) or [`ROUNDS`] buffers
    /// went through. Interest ([`Connection::interest`]) then says what to wait for.
    fn pump(&mut self, mut from: impl Read, mut to: impl Write + HalfClose) -> io::Result<()> {
        for _ in 0..ROUNDS {
            while let Some(bytes) = self
                .buffer
                .get(self.start..self.end)
                .filter(|b| !b.is_empty())
            {
                match to.write(bytes) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(written) => self.start += written,
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    Err(err) => return Err(err),
                }
            }
            if self.ended {
                return Ok(());
            }
            match from.read(&mut self.buffer) {
                Ok(0) => {
                    // ENOTCONN if the peer is gone already: nothing left to tell it.
                    let _ = to.half_close();
                    self.ended = true;
                    return Ok(());
                }
                Ok(read) => (self.start, self.end) = (0, read),
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }
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
    /// Readable when the acceptor has handed over connections.
    woken: UnixStream,
    incoming: Receiver<Connection>,
    connections: Vec<Connection>,
    reporter: Arc<Reporter>,
}

/// What `poll` said about one connection: `(tcp, unix)`.
type Events = (PollFlags, PollFlags);

impl Relay {
    pub(super) fn new(
        woken: UnixStream,
        incoming: Receiver<Connection>,
        reporter: Arc<Reporter>,
    ) -> Self {
        Relay {
            woken,
            incoming,
            connections: Vec::new(),
            reporter,
        }
    }

    pub(super) fn run(mut self) {
        loop {
            match self.wait() {
                Ok((woken, events)) => {
                    if woken {
                        self.take_incoming();
                    }
                    self.serve(&events);
                }
                Err(Errno::EINTR) => {}
                Err(errno) => {
                    self.reporter.report(&RelayError::Poll(errno));
                    thread::sleep(RETRY_PAUSE);
                }
            }
        }
    }

    /// Polls the wake-up socket and every connection's sockets (those hung up and wanted
    /// for nothing left out); returns whether there was a wake-up, and the events of each
    /// connection, in order.
    fn wait(&self) -> Result<(bool, Vec<Events>), Errno> {
        let mut fds = vec![PollFd::new(self.woken.as_fd(), PollFlags::POLLIN)];
        // Where each connection's sockets are in `fds`, if they are.
        let mut places = Vec::with_capacity(self.connections.len());
        for connection in &self.connections {
            let (tcp, unix) = connection.interest();
            let mut add = |fd, flags: PollFlags, hung_up| {
                (!(hung_up && flags.is_empty())).then(|| {
                    fds.push(PollFd::new(fd, flags));
                    fds.len() - 1
                })
            };
            let tcp_place = add(connection.tcp.as_fd(), tcp, connection.tcp_hung_up);
            let unix_place = add(connection.unix.as_fd(), unix, connection.unix_hung_up);
            places.push((tcp_place, unix_place));
        }
        poll(&mut fds, PollTimeout::NONE)?;
        let revents = |place: Option<usize>| {
            place
                .and_then(|index| fds.get(index))
                .and_then(|fd| fd.revents())
                .unwrap_or(PollFlags::empty())
        };
        let woken = !revents(Some(0)).is_empty();
        let events = places
            .into_iter()
            .map(|(tcp, unix)| (revents(tcp), revents(unix)))
            .collect();
        Ok((woken, events))
    }

    fn take_incoming(&mut self) {
        let mut drain = [0; 64];
        while matches!((&self.woken).read(&mut drain), Ok(read) if read > 0) {}
        self.connections.extend(self.incoming.try_iter());
    }

    /// Pumps the connections `poll` reported on; closes those finished or failed.
    fn serve(&mut self, events: &[Events]) {
        let hung_up = PollFlags::POLLHUP | PollFlags::POLLERR;
        let mut index = 0;
        self.connections.retain_mut(|connection| {
            // Connections taken in after the poll have no events yet: kept as they are.
            let none = (PollFlags::empty(), PollFlags::empty());
            let (tcp, unix) = events.get(index).copied().unwrap_or(none);
            index += 1;
            if tcp.is_empty() && unix.is_empty() {
                return true;
            }
            // POLLNVAL cannot happen on sockets we own; were it to, polling again would spin.
            let invalid = (tcp | unix).contains(PollFlags::POLLNVAL);
            if invalid || connection.pump().is_err() {
                return false;
            }
            connection.tcp_hung_up |= tcp.intersects(hung_up);
            connection.unix_hung_up |= unix.intersects(hung_up);
            !connection.finished()
        });
    }
}

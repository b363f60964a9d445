//! The proxy bridge: relays `127.0.0.1:3128` inside the sandbox to the egress Unix socket.
//!
//! The sandbox has no network interface but loopback. Its only way out is sandgate's egress
//! proxy, reached through a Unix socket that the gateway bind-mounts in
//! ([`Proxy::socket`](crate::spec::Proxy)). Programs and their libraries only know proxies on
//! TCP (`HTTP_PROXY=http://127.0.0.1:3128`), so the init listens on [`Proxy::listen`] and relays
//! each accepted connection, byte for byte in both directions, to a new connection to the
//! socket. It reads nothing and changes nothing: the proxy on the other end decides, and the
//! socket a connection arrives on is the identity of the execution there.
//!
//! # Two threads, whatever the number of connections
//!
//! One thread accepts, takes a place among [`MAX_CONNECTIONS`] and connects to the socket
//! (blocking: a connect waits only while the proxy's accept queue is full); it hands each pair
//! of sockets to the relay thread (`bridge/relay.rs`), which moves the bytes of every
//! connection with non-blocking sockets and one epoll. A thread per connection would be
//! simpler, but under gVisor the sandbox's runnable threads cost the sentry host threads,
//! which the container's pids limit counts: 256 connections relayed by 512 threads crashed the
//! sandbox (exit status 2, the sentry failing to create a thread) under `--pids-limit 256` in
//! most runs, and 100 connections did sometimes. With two threads the container's pids peaked
//! at 75 for 256 connections: the bridge does not compete with the program for its pids.
//!
//! # Behaviour at the edges
//!
//! - The listener is bound by [`bind`], on the init's main thread, before the program is
//!   spawned: a program that connects at once finds it (its connection waits in the backlog
//!   until [`Bound::serve`] starts the threads, right after the spawn). Failing to bind is an
//!   init error.
//! - At most [`MAX_CONNECTIONS`] relays at once; a connection beyond that is accepted and
//!   closed at once. Each takes two descriptors, well within the gateway's limit of 1024.
//! - When one side ends its sending (EOF), the other side's write half is shut down once what
//!   was read before has been written, so the half-close crosses the bridge; once both
//!   directions have ended, both sockets are closed. An error on either side (a reset, a write
//!   to a closed peer) closes both at once.
//! - If the Unix socket cannot be connected (missing, refused, no permission), the TCP
//!   connection is closed: the program sees EOF or a reset, as from a proxy that went away.
//! - Nothing here prints to stdout. Each kind of failure ([`RelayError`]) is reported once, as
//!   one `sandgate-init: proxy bridge: ...` line on stderr; later ones are silent.
//! - No bridge thread is ever joined: when the program exits, the init exits with its status,
//!   and the threads and their connections end with the process, however stuck.
//!
//! No timeouts: a relay lives as long as its peers keep it open. Idle and byte limits are the
//! egress proxy's (per execution, from the decision); the bridge only bounds what it holds.

mod relay;

use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use nix::errno::Errno;
use thiserror::Error;

use crate::spec::Proxy;
use relay::{Connection, Relay};

/// Most connections relayed at once; more are closed as soon as they are accepted.
pub const MAX_CONNECTIONS: usize = 256;
/// Stack of both bridge threads: they copy between sockets, with the buffers on the heap.
const STACK_SIZE: usize = 256 * 1024;
/// Pause after a failed `accept` or `epoll_wait` (say, out of descriptors), so that neither
/// can spin.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// The bridge could not start: an init error.
#[derive(Debug, Error)]
pub enum BridgeError {
    #[error("proxy bridge: listening on {listen}: {err}")]
    Listen { listen: SocketAddr, err: io::Error },
    #[error("proxy bridge: creating its wake-up socket pair: {0}")]
    Waker(io::Error),
    #[error("proxy bridge: creating its epoll instance: {0}")]
    Epoll(Errno),
    #[error("proxy bridge: starting its threads: {0}")]
    Spawn(io::Error),
}

/// What can go wrong once the bridge runs. The connection concerned is closed; the program
/// goes on. Each kind is reported once.
#[derive(Debug, Error)]
pub enum RelayError {
    #[error("accepting a connection: {0}")]
    Accept(io::Error),
    #[error("{MAX_CONNECTIONS} connections open already; closing new ones until some end")]
    Full,
    #[error("connecting to {}: {err}; closing the connection", .socket.display())]
    Connect { socket: PathBuf, err: io::Error },
    #[error("setting up a connection: {0}; closing it")]
    Setup(io::Error),
    #[error("waiting for sockets: {0}")]
    Wait(Errno),
    #[error("the relay thread has stopped; closing new connections")]
    Stopped,
}

impl RelayError {
    fn kind(&self) -> usize {
        match self {
            RelayError::Accept(_) => 0,
            RelayError::Full => 1,
            RelayError::Connect { .. } => 2,
            RelayError::Setup(_) => 3,
            RelayError::Wait(_) => 4,
            RelayError::Stopped => 5,
        }
    }
}

/// Prints each kind of [`RelayError`] once.
#[derive(Debug, Default)]
struct Reporter {
    reported: [AtomicBool; 6],
}

impl Reporter {
    fn report(&self, err: &RelayError) {
        if !self.reported[err.kind()].swap(true, Ordering::Relaxed) {
            eprintln!("sandgate-init: proxy bridge: {err}");
        }
    }
}

/// Binds `proxy.listen` and serves it from two background threads that are never joined.
/// Returns the bound address.
pub fn start(proxy: &Proxy) -> Result<SocketAddr, BridgeError> {
    bind(proxy)?.serve()
}

/// A bound listener, not served yet: connections wait in its backlog.
#[derive(Debug)]
pub struct Bound {
    listener: TcpListener,
    address: SocketAddr,
    socket: std::path::PathBuf,
}

/// Binds `proxy.listen` on the calling thread and starts no thread: the init binds before it
/// spawns the program (which then finds the listener) and serves after (the spawn changes the
/// init's uids, which must not happen while other threads run: see `identity`).
pub fn bind(proxy: &Proxy) -> Result<Bound, BridgeError> {
    let listen_err = |err| BridgeError::Listen {
        listen: proxy.listen,
        err,
    };
    let listener = TcpListener::bind(proxy.listen).map_err(listen_err)?;
    let address = listener.local_addr().map_err(listen_err)?;
    Ok(Bound {
        listener,
        address,
        socket: proxy.socket.clone(),
    })
}

impl Bound {
    /// Serves the listener from two background threads that are never joined. Returns the
    /// bound address.
    pub fn serve(self) -> Result<SocketAddr, BridgeError> {
        let Bound {
            listener,
            address,
            socket,
        } = self;
        let (wake, woken) = UnixStream::pair().map_err(BridgeError::Waker)?;
        for end in [&wake, &woken] {
            end.set_nonblocking(true).map_err(BridgeError::Waker)?;
        }
        let reporter = Arc::new(Reporter::default());
        let (handoff, incoming) = mpsc::channel();
        let relay =
            Relay::new(woken, incoming, Arc::clone(&reporter)).map_err(BridgeError::Epoll)?;
        let acceptor = Acceptor {
            socket,
            open: Arc::new(AtomicUsize::new(0)),
            handoff,
            wake,
            reporter,
        };
        bridge_thread("bridge-relay")
            .spawn(move || relay.run())
            .map_err(BridgeError::Spawn)?;
        bridge_thread("bridge-accept")
            .spawn(move || acceptor.run(&listener))
            .map_err(BridgeError::Spawn)?;
        Ok(address)
    }
}

fn bridge_thread(name: &str) -> thread::Builder {
    thread::Builder::new()
        .name(name.to_owned())
        .stack_size(STACK_SIZE)
}

/// The accepting thread's state.
struct Acceptor {
    socket: PathBuf,
    /// Connections being connected or relayed.
    open: Arc<AtomicUsize>,
    handoff: Sender<Connection>,
    /// Written after each handoff so that the relay thread's `epoll_wait` returns.
    wake: UnixStream,
    reporter: Arc<Reporter>,
}

impl Acceptor {
    fn run(self, listener: &TcpListener) {
        loop {
            match listener.accept() {
                Ok((tcp, _)) => self.admit(tcp),
                // The client gave up before it was accepted, or a signal: nothing to report.
                Err(err)
                    if matches!(
                        err.kind(),
                        io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted
                    ) => {}
                Err(err) => {
                    self.reporter.report(&RelayError::Accept(err));
                    thread::sleep(RETRY_PAUSE);
                }
            }
        }
    }

    /// Connects `tcp` to the socket and hands it to the relay thread, if there is room;
    /// closes it otherwise (by dropping it).
    fn admit(&self, tcp: TcpStream) {
        let Some(slot) = Slot::take(&self.open) else {
            return self.reporter.report(&RelayError::Full);
        };
        let unix = match UnixStream::connect(&self.socket) {
            Ok(unix) => unix,
            Err(err) => {
                let socket = self.socket.clone();
                return self.reporter.report(&RelayError::Connect { socket, err });
            }
        };
        let connection = match Connection::new(tcp, unix, slot) {
            Ok(connection) => connection,
            Err(err) => return self.reporter.report(&RelayError::Setup(err)),
        };
        if self.handoff.send(connection).is_err() {
            return self.reporter.report(&RelayError::Stopped);
        }
        // WouldBlock: the pair is full of wake-ups the relay has yet to read; one is enough.
        let _ = (&self.wake).write(&[1]);
    }
}

/// A place among the [`MAX_CONNECTIONS`]; given back when dropped (with its connection).
#[derive(Debug)]
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(open: &Arc<AtomicUsize>) -> Option<Slot> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| {
            (count < MAX_CONNECTIONS).then_some(count + 1)
        })
        .ok()
        .map(|_| Slot(Arc::clone(open)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{Ipv4Addr, Shutdown};
    use std::os::unix::net::UnixListener;
    use std::time::Instant;

    fn sock_dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("sandgate-bridge-")
            .tempdir_in("/tmp")
            .unwrap()
    }

    fn start_on_any_port(socket: PathBuf) -> SocketAddr {
        let proxy = Proxy {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            socket,
        };
        start(&proxy).unwrap()
    }

    /// Serves one connection: reads everything until EOF, then answers with it reversed and
    /// closes. Only a relayed half-close lets it answer at all.
    fn reverse_server(listener: UnixListener) -> thread::JoinHandle<()> {
        thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut data = Vec::new();
            conn.read_to_end(&mut data).unwrap();
            data.reverse();
            conn.write_all(&data).unwrap();
        })
    }

    fn read_all(client: &mut TcpStream) -> Vec<u8> {
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut received = Vec::new();
        client.read_to_end(&mut received).unwrap();
        received
    }

    #[test]
    fn relays_both_ways_and_carries_the_half_close() {
        let dir = sock_dir();
        let path = dir.path().join("egress.sock");
        let server = reverse_server(UnixListener::bind(&path).unwrap());
        let addr = start_on_any_port(path);
        let mut client = TcpStream::connect(addr).unwrap();
        // Several buffers' worth, so that writes would block and the loop must come back.
        let sent: Vec<u8> = (0..5_000_000).map(|i: u32| (i % 251) as u8).collect();
        let writer = {
            let mut client = client.try_clone().unwrap();
            let sent = sent.clone();
            thread::spawn(move || {
                client.write_all(&sent).unwrap();
                client.shutdown(Shutdown::Write).unwrap();
            })
        };
        let mut received = read_all(&mut client);
        writer.join().unwrap();
        received.reverse();
        assert!(received == sent, "{} bytes back", received.len());
        server.join().unwrap();
    }

    #[test]
    fn many_connections_at_once_each_get_their_own_bytes() {
        let dir = sock_dir();
        let path = dir.path().join("egress.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = thread::spawn(move || {
            for _ in 0..50 {
                reverse_server(listener.try_clone().unwrap())
                    .join()
                    .unwrap();
            }
        });
        let addr = start_on_any_port(path);
        let clients: Vec<_> = (0..50u8)
            .map(|i| {
                thread::spawn(move || {
                    let mut client = TcpStream::connect(addr).unwrap();
                    client.write_all(&[i, i + 1]).unwrap();
                    client.shutdown(Shutdown::Write).unwrap();
                    assert_eq!(read_all(&mut client), [i + 1, i]);
                })
            })
            .collect();
        for client in clients {
            client.join().unwrap();
        }
        server.join().unwrap();
    }

    #[test]
    fn an_upstream_that_closes_first_is_seen_as_eof() {
        let dir = sock_dir();
        let path = dir.path().join("egress.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            conn.write_all(b"bye").unwrap();
        });
        let addr = start_on_any_port(path);
        let mut client = TcpStream::connect(addr).unwrap();
        server.join().unwrap();
        assert_eq!(read_all(&mut client), b"bye");
        // Writing on afterwards fails sooner or later; it must not hang or be accepted forever.
        let started = Instant::now();
        let failed = (0..1000).any(|_| {
            thread::sleep(Duration::from_millis(5));
            client.write_all(b"more").is_err()
        });
        assert!(
            failed,
            "writes still accepted after {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_missing_socket_closes_the_connection() {
        let dir = sock_dir();
        let addr = start_on_any_port(dir.path().join("absent.sock"));
        for _ in 0..3 {
            let mut client = TcpStream::connect(addr).unwrap();
            client
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut buf = [0; 16];
            // EOF, or a reset if the close found unread bytes: never a hang.
            match client.read(&mut buf) {
                Ok(read) => assert_eq!(read, 0),
                Err(err) => assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}"),
            }
        }
    }

    #[test]
    fn a_busy_port_is_an_error() {
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let proxy = Proxy {
            listen: taken.local_addr().unwrap(),
            socket: PathBuf::from("/nowhere"),
        };
        let err = start(&proxy).unwrap_err();
        assert!(matches!(err, BridgeError::Listen { .. }), "{err}");
        assert!(err
            .to_string()
            .starts_with("proxy bridge: listening on 127.0.0.1:"));
    }

    #[test]
    fn slots_are_bounded_and_given_back() {
        let open = Arc::new(AtomicUsize::new(0));
        let slots: Vec<Slot> = (0..MAX_CONNECTIONS)
            .map(|_| Slot::take(&open).unwrap())
            .collect();
        assert!(Slot::take(&open).is_none());
        drop(slots);
        assert_eq!(open.load(Ordering::Acquire), 0);
        assert!(Slot::take(&open).is_some());
    }

    #[test]
    fn every_kind_has_its_own_flag() {
        let io = || io::Error::from(io::ErrorKind::Other);
        let kinds = [
            RelayError::Accept(io()).kind(),
            RelayError::Full.kind(),
            RelayError::Connect {
                socket: PathBuf::new(),
                err: io(),
            }
            .kind(),
            RelayError::Setup(io()).kind(),
            RelayError::Wait(Errno::ENOMEM).kind(),
            RelayError::Stopped.kind(),
        ];
        assert_eq!(kinds, [0, 1, 2, 3, 4, 5]);
        assert_eq!(Reporter::default().reported.len(), kinds.len());
    }
}

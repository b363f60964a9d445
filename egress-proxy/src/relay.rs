//! Moving bytes once a connection is allowed: both directions at once, counted against the
//! execution's byte budget, ended by the idle timeout or the listener's shutdown.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::body::BodyFramer;
use crate::body_guard::BodyGuard;
use crate::reason::ReasonCode;

/// Relay buffer per direction: downloads dominate, so the downward one is larger (fewer
/// syscalls per byte; measured with `benches/throughput.rs`).
const UP_BUFFER: usize = 64 * 1024;
const DOWN_BUFFER: usize = 256 * 1024;

/// An execution's byte budget: up plus down, across all its connections.
#[derive(Debug)]
pub(crate) struct Budget {
    max: u64,
    used: AtomicU64,
}

impl Budget {
    pub(crate) fn new(max: u64) -> Budget {
        Budget {
            max,
            used: AtomicU64::new(0),
        }
    }

    /// Takes up to `n` bytes of the budget; returns how many were granted.
    pub(crate) fn take(&self, n: usize) -> usize {
        let n = n as u64;
        let mut granted = 0;
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                granted = n.min(self.max.saturating_sub(used));
                Some(used + granted)
            });
        usize::try_from(granted).unwrap_or(0)
    }

    pub(crate) fn exhausted(&self) -> bool {
        self.used() >= self.max
    }

    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

/// Why a relay stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ended {
    pub reason: ReasonCode,
    pub error: Option<String>,
}

impl Ended {
    pub(crate) fn new(reason: ReasonCode, error: impl Into<Option<String>>) -> Ended {
        Ended {
            reason,
            error: error.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Up,
    Down,
}

/// One connection's counters.
#[derive(Debug)]
pub(crate) struct Meter<'a> {
    budget: &'a Budget,
    up: AtomicU64,
    down: AtomicU64,
    start: Instant,
    /// Milliseconds since `start` of the last byte in either direction.
    last: AtomicU64,
}

impl<'a> Meter<'a> {
    pub(crate) fn new(budget: &'a Budget) -> Meter<'a> {
        Meter {
            budget,
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    pub(crate) fn bytes_up(&self) -> u64 {
        self.up.load(Ordering::Relaxed)
    }

    pub(crate) fn bytes_down(&self) -> u64 {
        self.down.load(Ordering::Relaxed)
    }

    fn touch(&self) {
        let now = self.start.elapsed().as_millis();
        self.last
            .store(u64::try_from(now).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Writes what the budget allows of `bytes`, counting it; `ByteLimit` if not all of it.
    async fn send<W: AsyncWrite + Unpin>(
        &self,
        to: &mut W,
        bytes: &[u8],
        direction: Direction,
    ) -> Result<(), Ended> {
        self.touch();
        let granted = self.budget.take(bytes.len());
        to.write_all(&bytes[..granted])
            .await
            .map_err(|err| write_failed(direction, &err))?;
        let counter = match direction {
            Direction::Up => &self.up,
            Direction::Down => &self.down,
        };
        counter.fetch_add(granted as u64, Ordering::Relaxed);
        if granted < bytes.len() {
            return Err(Ended::new(
                ReasonCode::ByteLimit,
                format!("byte budget of {} bytes spent", self.budget.max),
            ));
        }
        Ok(())
    }

    /// Sends bytes upstream before the relay starts (a request head, a ClientHello).
    pub(crate) async fn send_up<W: AsyncWrite + Unpin>(
        &self,
        to: &mut W,
        bytes: &[u8],
    ) -> Result<(), Ended> {
        self.send(to, bytes, Direction::Up).await
    }

    /// Resolves once nothing has moved for `idle`.
    async fn idle(&self, idle: Duration) {
        loop {
            let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
            let deadline = self.start + last + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline.into()).await;
        }
    }
}

fn read_failed(direction: Direction, err: &std::io::Error) -> Ended {
    match direction {
        Direction::Up => Ended::new(
            ReasonCode::ClientFailed,
            format!("reading from the sandbox: {err}"),
        ),
        Direction::Down => Ended::new(
            ReasonCode::UpstreamFailed,
            format!("reading from the upstream: {err}"),
        ),
    }
}

fn write_failed(direction: Direction, err: &std::io::Error) -> Ended {
    match direction {
        Direction::Up => Ended::new(
            ReasonCode::UpstreamFailed,
            format!("writing to the upstream: {err}"),
        ),
        Direction::Down => Ended::new(
            ReasonCode::ClientFailed,
            format!("writing to the sandbox: {err}"),
        ),
    }
}

/// How the upward direction ends.
pub(crate) enum Upward {
    /// A tunnel: until the sandbox closes its side, which is then closed upstream too.
    Tunnel,
    /// One plain HTTP request: until its body ends; later bytes are never sent. With a guard,
    /// the body is searched for placeholders as it passes.
    Body(BodyFramer, Option<BodyGuard>),
}

/// Sends body bytes, through the guard when there is one (a placeholder ends the request with
/// `credential.misdirected` before any of it is sent).
pub(crate) async fn send_body<W: AsyncWrite + Unpin>(
    meter: &Meter<'_>,
    to: &mut W,
    guard: Option<&mut BodyGuard>,
    bytes: &[u8],
) -> Result<(), Ended> {
    let Some(guard) = guard else {
        return meter.send(to, bytes, Direction::Up).await;
    };
    let passed = guard.pass(bytes).map_err(|names| {
        Ended::new(
            ReasonCode::CredentialMisdirected,
            format!(
                "the request body carries the placeholder of credential {}, which is only ever \
                 attached inside an inspected tunnel",
                names.join(", ")
            ),
        )
    })?;
    meter.send(to, &passed, Direction::Up).await
}

/// Copies one direction until end of stream (or end of body), then half-closes tunnels.
async fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    meter: &Meter<'_>,
    direction: Direction,
    mut framer: Option<BodyFramer>,
    mut guard: Option<BodyGuard>,
) -> Result<(), Ended>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if framer.as_ref().is_some_and(BodyFramer::is_done) {
        return Ok(());
    }
    let size = match direction {
        Direction::Up => UP_BUFFER,
        Direction::Down => DOWN_BUFFER,
    };
    let mut buf = vec![0u8; size];
    loop {
        let n = from
            .read(&mut buf)
            .await
            .map_err(|err| read_failed(direction, &err))?;
        if n == 0 {
            if framer.is_none() {
                // Half-close: the other side learns this side is done; errors mean it is gone.
                let _ = to.shutdown().await;
            }
            return Ok(());
        }
        let n = match framer.as_mut() {
            Some(framer) => framer
                .advance(&buf[..n])
                .map_err(|err| Ended::new(ReasonCode::Smuggling, err.to_string()))?,
            None => n,
        };
        match direction {
            Direction::Up => send_body(meter, to, guard.as_mut(), &buf[..n]).await?,
            Direction::Down => meter.send(to, &buf[..n], direction).await?,
        }
        if framer.as_ref().is_some_and(BodyFramer::is_done) {
            if let Some(guard) = guard.as_mut() {
                meter.send(to, &guard.finish(), direction).await?;
            }
            return Ok(());
        }
    }
}

/// Relays between the sandbox and the upstream until both are done (tunnels) or the response
/// has ended (plain HTTP), the idle timeout passes, the budget is spent or `cancel` fires.
pub(crate) async fn relay<CR, CW, UR, UW>(
    client: (&mut CR, &mut CW),
    upstream: (&mut UR, &mut UW),
    meter: &Meter<'_>,
    upward: Upward,
    idle: Duration,
    cancel: &CancellationToken,
) -> Result<(), Ended>
where
    CR: AsyncRead + Unpin,
    CW: AsyncWrite + Unpin,
    UR: AsyncRead + Unpin,
    UW: AsyncWrite + Unpin,
{
    let (client_read, client_write) = client;
    let (upstream_read, upstream_write) = upstream;
    let (framer, wait_for_up) = match upward {
        Upward::Tunnel => ((None, None), true),
        Upward::Body(framer, guard) => ((Some(framer), guard), false),
    };
    let (framer, guard) = framer;
    let up = pump(
        client_read,
        upstream_write,
        meter,
        Direction::Up,
        framer,
        guard,
    );
    let down = pump(
        upstream_read,
        client_write,
        meter,
        Direction::Down,
        None,
        None,
    );
    let both = async {
        tokio::pin!(up, down);
        let (mut up_done, mut down_done) = (false, false);
        loop {
            tokio::select! {
                result = &mut up, if !up_done => { result?; up_done = true; }
                result = &mut down, if !down_done => { result?; down_done = true; }
                // A tunnel the sandbox had already closed when its execution ended completed:
                // only the upstream's own close was still on its way (a program that closes
                // its socket and exits at once races the end of its execution here).
                () = cancel.cancelled() => {
                    return if up_done && wait_for_up {
                        Ok(())
                    } else {
                        Err(Ended::new(ReasonCode::Shutdown, None))
                    };
                }
            }
            if down_done && (up_done || !wait_for_up) {
                return Ok(());
            }
        }
    };
    tokio::select! {
        result = both => result,
        () = meter.idle(idle) => Err(Ended::new(
            ReasonCode::IdleTimeout,
            format!("no byte in either direction for {} s", idle.as_secs()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_shared_and_never_overdrawn() {
        let budget = Budget::new(10);
        assert_eq!(budget.take(4), 4);
        assert_eq!(budget.take(4), 4);
        assert_eq!(budget.take(4), 2);
        assert_eq!(budget.take(1), 0);
        assert!(budget.exhausted());
        assert_eq!(budget.used(), 10);
    }

    #[tokio::test]
    async fn tunnel_relays_both_ways_and_counts() {
        let budget = Budget::new(1 << 20);
        let meter = Meter::new(&budget);
        let (mut sandbox, proxy_client) = tokio::io::duplex(1024);
        let (proxy_upstream, mut server) = tokio::io::duplex(1024);
        let (mut cr, mut cw) = tokio::io::split(proxy_client);
        let (mut ur, mut uw) = tokio::io::split(proxy_upstream);
        let cancel = CancellationToken::new();
        let relay = relay(
            (&mut cr, &mut cw),
            (&mut ur, &mut uw),
            &meter,
            Upward::Tunnel,
            Duration::from_secs(5),
            &cancel,
        );
        let peers = async {
            sandbox.write_all(b"ping").await.unwrap();
            sandbox.shutdown().await.unwrap();
            let mut got = [0u8; 4];
            server.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"ping");
            server.write_all(b"pong!").await.unwrap();
            server.shutdown().await.unwrap();
            let mut back = Vec::new();
            sandbox.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, b"pong!");
        };
        let (result, ()) = tokio::join!(relay, peers);
        assert_eq!(result, Ok(()));
        assert_eq!((meter.bytes_up(), meter.bytes_down()), (4, 5));
    }

    /// The execution ends: a tunnel the sandbox already closed completed, one it still holds
    /// open was cut by the shutdown.
    #[tokio::test]
    async fn an_ended_execution_cuts_only_tunnels_the_sandbox_still_holds() {
        for sandbox_closed in [true, false] {
            let budget = Budget::new(1 << 20);
            let meter = Meter::new(&budget);
            let (mut sandbox, proxy_client) = tokio::io::duplex(1024);
            let (proxy_upstream, mut server) = tokio::io::duplex(1024);
            let (mut cr, mut cw) = tokio::io::split(proxy_client);
            let (mut ur, mut uw) = tokio::io::split(proxy_upstream);
            let cancel = CancellationToken::new();
            let relay = relay(
                (&mut cr, &mut cw),
                (&mut ur, &mut uw),
                &meter,
                Upward::Tunnel,
                Duration::from_secs(5),
                &cancel,
            );
            let peers = async {
                sandbox.write_all(b"ping").await.unwrap();
                if sandbox_closed {
                    sandbox.shutdown().await.unwrap();
                }
                let mut got = Vec::new();
                if sandbox_closed {
                    // The sandbox's close reached the upstream, whose own close is still to come.
                    server.read_to_end(&mut got).await.unwrap();
                } else {
                    got.resize(4, 0);
                    server.read_exact(&mut got).await.unwrap();
                }
                assert_eq!(got, b"ping");
                cancel.cancel();
            };
            let (result, ()) = tokio::join!(relay, peers);
            if sandbox_closed {
                assert_eq!(result, Ok(()));
            } else {
                assert_eq!(result.unwrap_err().reason, ReasonCode::Shutdown);
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn idle_tunnels_are_closed() {
        let budget = Budget::new(100);
        let meter = Meter::new(&budget);
        let (_sandbox, proxy_client) = tokio::io::duplex(64);
        let (proxy_upstream, _server) = tokio::io::duplex(64);
        let (mut cr, mut cw) = tokio::io::split(proxy_client);
        let (mut ur, mut uw) = tokio::io::split(proxy_upstream);
        let result = relay(
            (&mut cr, &mut cw),
            (&mut ur, &mut uw),
            &meter,
            Upward::Tunnel,
            Duration::from_secs(3),
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(result.unwrap_err().reason, ReasonCode::IdleTimeout);
    }
}

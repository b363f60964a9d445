//! One connection from a sandbox, from its first byte to its audit close.
//!
//! The life of an attempt:
//! 1. read the request head (bounded size and time), read its target, canonicalise the host;
//! 2. refuse at once what is malformed, over the connection limit or over the byte budget;
//! 3. ask the egress policy about the canonical host and port; a denied name is never resolved;
//! 4. resolve once (or take the literal), check every address, pick the first;
//! 5. TLS ports only: answer `200`, read the ClientHello, require its SNI to name the host;
//! 6. `ConnectionRecorder::open`: until it returns `Ok`, nothing is dialled;
//! 7. dial exactly the checked address, send the head or the ClientHello, relay;
//! 8. `ConnectionRecorder::close` with bytes, duration and the reason it ended.
//!
//! A denial at any step is recorded (`open` then `close` at once) before it is answered, with
//! the reason's status and the uniform body; after a TLS tunnel's `200` it can only close the
//! tunnel (with a TLS alert when the hello was read).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tracing::{field, info, info_span, warn, Instrument};

use crate::body::BodyFramer;
use crate::body_guard::BodyGuard;
use crate::execution::{Execution, Shared};
use crate::head::Forward;
use crate::host::Host;
use crate::reason::{denial_response, one_line, shown_code, ReasonCode};
use crate::relay::{relay, send_body, Ended, Meter, Upward};
use crate::seams::{Attempt, Closed, ConnectionId, Scheme};

/// Answer to a CONNECT once the tunnel may start.
pub(crate) const CONNECT_OK: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";
/// Bytes read from the sandbox at a time before the relay starts.
const READ_CHUNK: usize = 8 * 1024;

/// Why an attempt was refused, or a connection ended, before the relay.
#[derive(Debug, Clone)]
pub(crate) struct Denial {
    pub reason: ReasonCode,
    pub message: String,
    /// The policy's own reason code, when the policy denied: what the sandbox is shown.
    pub policy_code: Option<String>,
}

impl Denial {
    pub(crate) fn new(reason: ReasonCode, message: impl Into<String>) -> Denial {
        Denial {
            reason,
            message: message.into(),
            policy_code: None,
        }
    }

    /// The denial of a policy decision: the first of its reasons, or a generic one.
    pub(crate) fn of_policy(reasons: &[policy_engine::Reason]) -> Denial {
        match reasons.first() {
            Some(reason) => Denial {
                reason: ReasonCode::from_policy(&reason.code),
                message: reason.message.clone(),
                policy_code: Some(reason.code.clone()),
            },
            None => Denial::new(ReasonCode::PolicyDenied, "denied by the egress policy"),
        }
    }

    /// The code the sandbox is shown (`sandgate-egress: <code>: <message>`).
    pub(crate) fn shown_code(&self) -> String {
        shown_code(self.reason, self.policy_code.as_deref())
    }
}

/// What an allowed attempt will do once recorded.
pub(crate) struct Plan {
    pub host: Host,
    pub address: SocketAddr,
    pub kind: PlanKind,
}

pub(crate) enum PlanKind {
    /// CONNECT to a TLS port: SNI check first.
    Tls,
    /// CONNECT to another port.
    Tunnel,
    /// One plain HTTP request.
    Http(Forward),
}

/// The state of one connection.
pub(crate) struct Conn<'a> {
    pub shared: Arc<Shared>,
    pub execution: Arc<Execution>,
    pub client: UnixStream,
    pub cancel: &'a CancellationToken,
    pub attempt: Attempt,
    pub started: Instant,
    /// Bytes from the sandbox past what has been consumed (tunnel data, body start, hello).
    pub buffered: Vec<u8>,
    /// A TLS tunnel's `200` was sent: a denial can no longer be an HTTP answer.
    pub tunnel_open: bool,
}

/// Whether an accepted connection fits the execution's connection limit. The permit is held
/// until the connection ends.
pub(crate) enum Admission {
    /// Within the limit.
    Slot { _permit: OwnedSemaphorePermit },
    /// Over the limit: its head is read (for the record), then it is refused.
    OverLimit { _permit: OwnedSemaphorePermit },
    /// Over the limit while many others are too: refused without reading anything.
    Flood,
}

/// Serves one accepted connection.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    execution: Arc<Execution>,
    client: UnixStream,
    admission: Admission,
    cancel: CancellationToken,
) {
    let span = info_span!("conn", execution_id = %execution.id, host = field::Empty);
    let mut conn = Conn {
        shared: Arc::clone(&shared),
        execution: Arc::clone(&execution),
        client,
        cancel: &cancel,
        attempt: new_attempt(&execution),
        started: Instant::now(),
        buffered: Vec::new(),
        tunnel_open: false,
    };
    async {
        let admitted = match admission {
            Admission::Slot { .. } => conn.admit(true).await,
            Admission::OverLimit { .. } => conn.admit(false).await,
            Admission::Flood => Err(conn.over_limit()),
        };
        match admitted {
            Ok(plan) => conn.proceed(plan).await,
            Err(denial) => conn.deny(denial).await,
        }
    }
    .instrument(span)
    .await;
    drop(admission);
}

fn new_attempt(execution: &Execution) -> Attempt {
    Attempt {
        execution_id: execution.id.clone(),
        tenant: execution.tenant.clone(),
        host: String::new(),
        port: 0,
        scheme: None,
        sni: None,
        method: None,
        path: None,
        address: None,
        allow: false,
        reason: ReasonCode::BadRequest,
        message: String::new(),
        policy_reasons: Vec::new(),
        started_at: SystemTime::now(),
    }
}

impl Conn<'_> {
    /// Records a refused attempt, then answers it.
    pub(crate) async fn deny(&mut self, denial: Denial) {
        self.attempt.allow = false;
        self.attempt.reason = denial.reason;
        if !self.execution.denials.admit(denial.reason) {
            // Past the execution's denial bounds: refused and counted, without a row.
            self.summarise_denials().await;
            let message = "too many denied attempts: this one is counted, not recorded";
            return self
                .answer(&Denial::new(ReasonCode::TooManyDenials, message))
                .await;
        }
        self.attempt.message = one_line(&denial.message);
        warn!(
            reason = denial.reason.code(),
            message = %self.attempt.message,
            "egress denied"
        );
        match self.open_record().await {
            Ok(id) => {
                let closed = self.closed(0, 0, denial.reason, None);
                self.close_record(id, closed).await;
                let shown = Denial {
                    message: self.attempt.message.clone(),
                    ..denial
                };
                self.answer(&shown).await;
            }
            Err(unavailable) => self.answer(&unavailable).await,
        }
    }

    /// Runs an allowed attempt: SNI check on TLS ports, record, dial, relay, record the close.
    async fn proceed(&mut self, plan: Plan) {
        let mut inspection = None;
        if matches!(plan.kind, PlanKind::Tls) {
            if let Err(denial) = self.check_sni(&plan.host).await {
                return self.deny(denial).await;
            }
            inspection = self.inspection_for(&plan.host, plan.address.port());
        }
        self.attempt.allow = true;
        self.attempt.reason = ReasonCode::Allowed;
        self.attempt.message = match inspection {
            Some(_) => format!("allowed to {}, inspected", plan.address),
            None => format!("allowed to {}", plan.address),
        };
        let id = match self.open_record().await {
            Ok(id) => id,
            Err(unavailable) => return self.answer(&unavailable).await,
        };
        info!(address = %plan.address, scheme = self.scheme_str(), "egress allowed");
        let (up, down, ended) = match inspection {
            Some(inspection) => {
                let served = self.run_inspected(&plan, inspection, id.clone()).await;
                let _ = self.client.shutdown().await;
                served
            }
            None => self.dial_and_relay(plan).await,
        };
        let (reason, error) = match ended {
            Ok(()) => (ReasonCode::Completed, None),
            Err(ended) => (ended.reason, ended.error),
        };
        info!(
            bytes_up = up,
            bytes_down = down,
            reason = reason.code(),
            "egress closed"
        );
        let closed = self.closed(up, down, reason, error);
        self.close_record(id, closed).await;
    }

    /// Dials the checked address and relays; returns bytes up, bytes down and how it ended.
    async fn dial_and_relay(&mut self, plan: Plan) -> (u64, u64, Result<(), Ended>) {
        let mut upstream = match self.dial(plan.address).await {
            Ok(stream) => stream,
            Err(denial) => {
                self.answer(&denial).await;
                return (0, 0, Err(Ended::new(denial.reason, denial.message)));
            }
        };
        let execution = Arc::clone(&self.execution);
        let meter = Meter::new(&execution.budget);
        let result = self.start(&plan.kind, &mut upstream, &meter).await;
        let result = match result {
            Ok(upward) => self.run_relay(&mut upstream, &meter, upward).await,
            Err(ended) => Err(ended),
        };
        if let Err(ended) = &result {
            // Nothing of a response reached the sandbox yet: it still gets an answer.
            let answerable = ended.reason != ReasonCode::ClientFailed;
            if answerable && meter.bytes_down() == 0 && !self.tunnel_open {
                let message = ended.error.clone().unwrap_or_default();
                self.answer_quietly(&Denial::new(ended.reason, message))
                    .await;
            }
        }
        let _ = self.client.shutdown().await;
        (meter.bytes_up(), meter.bytes_down(), result)
    }

    /// Sends what must precede the relay: the tunnel's `200`, the request head, the hello.
    async fn start(
        &mut self,
        kind: &PlanKind,
        upstream: &mut TcpStream,
        meter: &Meter<'_>,
    ) -> Result<Upward, Ended> {
        let pending = std::mem::take(&mut self.buffered);
        match kind {
            PlanKind::Tls => {
                meter.send_up(upstream, &pending).await?;
                Ok(Upward::Tunnel)
            }
            PlanKind::Tunnel => {
                self.client.write_all(CONNECT_OK).await.map_err(|err| {
                    Ended::new(
                        ReasonCode::ClientFailed,
                        format!("writing to the sandbox: {err}"),
                    )
                })?;
                self.tunnel_open = true;
                meter.send_up(upstream, &pending).await?;
                Ok(Upward::Tunnel)
            }
            PlanKind::Http(forward) => {
                meter.send_up(upstream, &forward.head).await?;
                let mut framer = BodyFramer::new(forward.body);
                let used = framer
                    .advance(&pending)
                    .map_err(|err| Ended::new(ReasonCode::Smuggling, err.to_string()))?;
                let mut guard = BodyGuard::for_execution(self.execution.inspection.as_ref());
                send_body(meter, upstream, guard.as_mut(), &pending[..used]).await?;
                if framer.is_done() {
                    if let Some(guard) = guard.as_mut() {
                        meter.send_up(upstream, &guard.finish()).await?;
                    }
                }
                Ok(Upward::Body(framer, guard))
            }
        }
    }

    async fn run_relay(
        &mut self,
        upstream: &mut TcpStream,
        meter: &Meter<'_>,
        upward: Upward,
    ) -> Result<(), Ended> {
        let (mut client_read, mut client_write) = self.client.split();
        let (mut upstream_read, mut upstream_write) = upstream.split();
        relay(
            (&mut client_read, &mut client_write),
            (&mut upstream_read, &mut upstream_write),
            meter,
            upward,
            self.execution.limits.idle_timeout,
            self.cancel,
        )
        .await
    }

    /// Dials exactly `address`, within the connect timeout.
    async fn dial(&self, address: SocketAddr) -> Result<TcpStream, Denial> {
        let timeout = self.execution.limits.connect_timeout;
        let dialled = tokio::select! {
            dialled = tokio::time::timeout(timeout, TcpStream::connect(address)) => dialled,
            () = self.cancel.cancelled() => return Err(Denial::new(ReasonCode::Shutdown, "the execution ended")),
        };
        match dialled {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                Ok(stream)
            }
            Ok(Err(err)) => Err(Denial::new(
                ReasonCode::UpstreamFailed,
                format!("connecting to {address} failed: {err}"),
            )),
            Err(_) => Err(Denial::new(
                ReasonCode::UpstreamTimeout,
                format!("{address} did not accept within {} s", timeout.as_secs()),
            )),
        }
    }

    /// `ConnectionRecorder::open`, bounded by the record timeout; a failure is the 503 denial.
    async fn open_record(&self) -> Result<ConnectionId, Denial> {
        let timeout = self.shared.config.record_timeout;
        let opened = tokio::time::timeout(timeout, self.shared.recorder.open(&self.attempt)).await;
        let err = match opened {
            Ok(Ok(id)) => return Ok(id),
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("recording took longer than {} s", timeout.as_secs()),
        };
        warn!(error = %err, "egress attempt could not be recorded; refused");
        Err(Denial::new(
            ReasonCode::AuditUnavailable,
            "the audit log is unavailable, so no connection can be made",
        ))
    }

    /// Hands the recorder the window's count of denials without a row, once it is due.
    async fn summarise_denials(&self) {
        let execution = &self.execution;
        let Some(summary) = execution
            .denials
            .take(&execution.id, &execution.tenant, false)
        else {
            return;
        };
        let timeout = self.shared.config.record_timeout;
        let record = self.shared.recorder.suppressed(&summary);
        if tokio::time::timeout(timeout, record).await.is_err() {
            warn!("recording a denial summary timed out");
        }
    }

    async fn close_record(&self, id: ConnectionId, closed: Closed) {
        let timeout = self.shared.config.record_timeout;
        let close = self.shared.recorder.close(id, &closed);
        if tokio::time::timeout(timeout, close).await.is_err() {
            warn!("recording an egress close timed out");
        }
    }

    fn closed(&self, up: u64, down: u64, reason: ReasonCode, error: Option<String>) -> Closed {
        Closed {
            bytes_up: up,
            bytes_down: down,
            duration: self.started.elapsed(),
            reason,
            error,
        }
    }

    fn scheme_str(&self) -> &'static str {
        self.attempt.scheme.map_or("", Scheme::as_str)
    }

    /// Answers a denial: the uniform HTTP response, or (inside a TLS tunnel) an alert.
    async fn answer(&mut self, denial: &Denial) {
        if self.tunnel_open {
            let _ = self.client.write_all(&tls_alert(denial.reason)).await;
        } else {
            self.answer_quietly(denial).await;
        }
        let _ = self.client.shutdown().await;
    }

    async fn answer_quietly(&mut self, denial: &Denial) {
        let response = denial_response(denial.reason, &denial.shown_code(), &denial.message);
        let write = self.client.write_all(&response);
        let _ = tokio::time::timeout(self.execution.limits.header_read_timeout, write).await;
    }

    /// Reads more bytes from the sandbox into `buffered`, until `deadline`; `Ok(0)` at its end.
    pub(crate) async fn read_more(&mut self, deadline: Instant) -> Result<usize, ReadFailure> {
        let mut chunk = [0u8; READ_CHUNK];
        let read = read_until(&mut self.client, &mut chunk, deadline, self.cancel).await?;
        self.buffered.extend_from_slice(&chunk[..read]);
        Ok(read)
    }
}

/// Why reading from the sandbox stopped.
#[derive(Debug)]
pub(crate) enum ReadFailure {
    Timeout,
    Cancelled,
    Io(std::io::Error),
}

async fn read_until<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut [u8],
    deadline: Instant,
    cancel: &CancellationToken,
) -> Result<usize, ReadFailure> {
    tokio::select! {
        read = tokio::time::timeout_at(deadline.into(), reader.read(buf)) => match read {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(err)) => Err(ReadFailure::Io(err)),
            Err(_) => Err(ReadFailure::Timeout),
        },
        () = cancel.cancelled() => Err(ReadFailure::Cancelled),
    }
}

/// A fatal TLS alert for a tunnel refused after its `200`: `unrecognized_name` for SNI
/// refusals, `internal_error` otherwise.
fn tls_alert(reason: ReasonCode) -> [u8; 7] {
    let description = match reason {
        ReasonCode::SniMismatch | ReasonCode::SniMissing => 112,
        _ => 80,
    };
    [21, 3, 3, 0, 2, 2, description]
}

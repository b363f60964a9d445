//! The checks an attempt passes before anything is recorded as allowed or dialled: the request
//! head, the host, the limits, the policy, the addresses, and (TLS ports) the SNI.

use std::net::{IpAddr, SocketAddr};

use policy_engine::{Connection, EgressExecution, EgressInput};
use tokio::io::AsyncWriteExt;
use tracing::{field, warn, Span};

use crate::conn::{Conn, Denial, Plan, PlanKind, ReadFailure, CONNECT_OK};
use crate::head::{
    check_connect, parse_head, parse_target, plain_request, HeadError, RequestHead, Target,
};
use crate::host::{canonical_host, Host};
use crate::path::normalise;
use crate::reason::ReasonCode;
use crate::seams::{ResolveError, Scheme};
use crate::tls::{parse_client_hello, record_len, ClientHello};

/// Longest copy of an invalid host kept in an attempt.
const MAX_INVALID_HOST: usize = 255;

impl Conn<'_> {
    /// Runs every check up to the address; the plan says what to do once recorded. A connection
    /// over the limit (`has_slot` false) is read only to record what it asked for.
    pub(crate) async fn admit(&mut self, has_slot: bool) -> Result<Plan, Denial> {
        let request = self.read_request().await;
        if !has_slot {
            return Err(self.over_limit());
        }
        let (host, port, kind) = request?;
        if self.execution.grant.allow.is_empty() {
            return Err(self.no_grant(&host, port));
        }
        if self.execution.budget.exhausted() {
            return Err(Denial::new(
                ReasonCode::ByteLimit,
                "the execution's byte budget is spent",
            ));
        }
        self.decide(&host, port)?;
        let address = self.resolve(&host, port).await?;
        Ok(Plan {
            host,
            address,
            kind,
        })
    }

    /// Reads the head and what it asks for: canonical host, port, and how to serve it.
    async fn read_request(&mut self) -> Result<(Host, u16, PlanKind), Denial> {
        let head = self.read_head().await?;
        let target = parse_target(&head.method, &head.target).map_err(head_denial)?;
        let (raw_host, port) = match &target {
            Target::Connect { host, port } => (host.clone(), *port),
            Target::Http { host, port, .. } => (host.clone(), *port),
        };
        self.attempt.port = port;
        let host = self.canonical(&raw_host)?;
        let kind = self.plan_kind(&head, &target, &host)?;
        if let PlanKind::Http(forward) = &kind {
            self.refuse_placeholders(&forward.head)?;
        }
        Ok((host, port, kind))
    }

    /// A plain HTTP request is never inspected, so no credential is ever granted on it: any
    /// placeholder in its head or in the body bytes already read is misdirected (refused before
    /// anything is dialled). The rest of the body is searched as it passes (`BodyGuard`).
    fn refuse_placeholders(&self, head: &[u8]) -> Result<(), Denial> {
        let Some(inspection) = &self.execution.inspection else {
            return Ok(());
        };
        let credentials = &inspection.credentials;
        let mut found = credentials.placeholders_in(head);
        found.extend(credentials.placeholders_in(&self.buffered));
        if found.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = found.into_iter().collect();
        Err(Denial::new(
            ReasonCode::CredentialMisdirected,
            format!(
                "the request carries the placeholder of credential {}, which is only ever \
                 attached inside an inspected tunnel",
                names.join(", ")
            ),
        ))
    }

    /// Plain HTTP is never inspected: to a destination whose grant says `inspect`, whose
    /// request rules must decide every request, it is refused rather than let through
    /// undecided (issue 21 item 3).
    fn refuse_plain_to_inspected(&self, host: &Host, port: u16) -> Result<(), Denial> {
        if self.inspection_for(host, port).is_none() {
            return Ok(());
        }
        Err(Denial::new(
            ReasonCode::InspectRequiresTls,
            format!(
                "{host} is inspected (each request decided by its rules), which needs TLS: \
                 use https://{host}:{port}/ through the proxy, not plain http://"
            ),
        ))
    }

    /// An execution whose decision granted no destination: says so, and how to ask.
    fn no_grant(&self, host: &Host, port: u16) -> Denial {
        Denial::new(
            ReasonCode::NoGrant,
            format!(
                "execution {} has no network grant: its policy decision allowed no destination. \
                 To reach {host}:{port}, ask for it in the request \
                 (\"network\": [{{\"host\": \"{host}\", \"port\": {port}}}]); the tenant's \
                 policy decides, or sends it to a reviewer",
                self.execution.id
            ),
        )
    }

    pub(crate) fn over_limit(&self) -> Denial {
        Denial::new(
            ReasonCode::TooManyConnections,
            format!(
                "the execution already has {} connections open",
                self.execution.limits.max_connections
            ),
        )
    }

    async fn read_head(&mut self) -> Result<RequestHead, Denial> {
        let limit = self.execution.limits.header_read_timeout;
        let deadline = std::time::Instant::now() + limit;
        let max = self.shared.config.max_head_bytes;
        loop {
            if let Some(head) = parse_head(&self.buffered, max).map_err(head_denial)? {
                self.buffered.drain(..head.len);
                return Ok(head);
            }
            match self.read_more(deadline).await {
                Ok(0) => {
                    return Err(Denial::new(
                        ReasonCode::BadRequest,
                        "the connection closed before a complete request head",
                    ))
                }
                Ok(_) => {}
                Err(failure) => {
                    return Err(read_denial(failure, || {
                        format!("no complete request head within {} s", limit.as_secs())
                    }))
                }
            }
        }
    }

    /// Canonicalises the host and names it in the attempt and the span.
    fn canonical(&mut self, raw: &str) -> Result<Host, Denial> {
        match canonical_host(raw) {
            Ok(host) => {
                self.attempt.host = host.to_string();
                Span::current().record("host", field::display(&host));
                Ok(host)
            }
            Err(err) => {
                self.attempt.host = raw.escape_default().take(MAX_INVALID_HOST).collect();
                Err(Denial::new(ReasonCode::HostInvalid, err.to_string()))
            }
        }
    }

    fn plan_kind(
        &mut self,
        head: &RequestHead,
        target: &Target,
        host: &Host,
    ) -> Result<PlanKind, Denial> {
        match target {
            Target::Connect { port, .. } => {
                // An inspected destination is TLS on every port its grant lists (issue 21
                // item 3): its tunnel must start with a ClientHello naming it, and is then
                // inspected, so its request rules decide every request whatever the port.
                let tls = self.shared.config.tls_ports.contains(port)
                    || self.inspection_for(host, *port).is_some();
                self.attempt.scheme = Some(if tls { Scheme::Https } else { Scheme::Connect });
                check_connect(head).map_err(head_denial)?;
                Ok(if tls { PlanKind::Tls } else { PlanKind::Tunnel })
            }
            Target::Http { port, path, .. } => {
                self.attempt.scheme = Some(Scheme::Http);
                self.attempt.method = Some(head.method.clone());
                let (raw_path, query) = match path.split_once('?') {
                    Some((raw_path, query)) => (raw_path, Some(query)),
                    None => (path.as_str(), None),
                };
                self.attempt.path = Some(raw_path.chars().take(crate::MAX_PATH).collect());
                let normal = normalise(raw_path)
                    .map_err(|err| Denial::new(ReasonCode::PathInvalid, err.to_string()))?;
                self.attempt.path = Some(normal.clone());
                self.refuse_plain_to_inspected(host, *port)?;
                let target = match query {
                    Some(query) => format!("{normal}?{query}"),
                    None => normal,
                };
                let forward = plain_request(head, host, *port, &target).map_err(head_denial)?;
                Ok(PlanKind::Http(forward))
            }
        }
    }

    /// Asks the egress policy about the canonical host and port.
    fn decide(&mut self, host: &Host, port: u16) -> Result<(), Denial> {
        let input = EgressInput {
            execution: EgressExecution {
                id: self.execution.id.clone(),
                tenant: self.execution.tenant.clone(),
                grant: self.execution.grant.clone(),
            },
            connection: Connection {
                host: host.to_string(),
                port,
                scheme: self.attempt.scheme.map_or("", Scheme::as_str).to_string(),
                method: self.attempt.method.clone(),
                path: self.attempt.path.clone(),
                query: None,
                headers: None,
                upgrade: None,
            },
        };
        let decision = self.shared.policy.decide(&input);
        self.attempt.policy_reasons.clone_from(&decision.reasons);
        if decision.allow {
            return Ok(());
        }
        Err(Denial::of_policy(&decision.reasons))
    }

    /// Resolves (names only), checks every address, and names the one to dial.
    async fn resolve(&mut self, host: &Host, port: u16) -> Result<SocketAddr, Denial> {
        let addresses = match host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => self.lookup(name).await?,
        };
        if let Err(denied) = self.execution.addresses.check_all(&addresses) {
            self.attempt.address = Some(SocketAddr::new(denied.address, port));
            let what = match host {
                Host::Ip(_) => format!("{} is", denied.address),
                Host::Name(name) => format!("{name} resolves to {}, which is", denied.address),
            };
            return Err(Denial::new(
                ReasonCode::AddressDenied,
                format!("{what} {}", denied.why),
            ));
        }
        let first = addresses
            .first()
            .copied()
            .ok_or_else(|| Denial::new(ReasonCode::DnsFailed, format!("{host} has no address")))?;
        let address = SocketAddr::new(first, port);
        self.attempt.address = Some(address);
        Ok(address)
    }

    async fn lookup(&self, name: &str) -> Result<Vec<IpAddr>, Denial> {
        let timeout = self.shared.config.dns_timeout;
        let lookup = tokio::time::timeout(timeout, self.shared.resolver.resolve(name));
        let result = tokio::select! {
            result = lookup => result,
            () = self.cancel.cancelled() => {
                return Err(Denial::new(ReasonCode::Shutdown, "the execution ended"))
            }
        };
        match result {
            Ok(Ok(addresses)) if !addresses.is_empty() => Ok(addresses),
            Ok(Ok(_)) | Ok(Err(ResolveError::NotFound(_))) => Err(Denial::new(
                ReasonCode::DnsFailed,
                format!("{name} has no address"),
            )),
            Ok(Err(err)) => {
                warn!(error = %err, "resolving failed");
                Err(Denial::new(
                    ReasonCode::DnsFailed,
                    format!("{name} could not be resolved"),
                ))
            }
            Err(_) => Err(Denial::new(
                ReasonCode::DnsTimeout,
                format!("{name} did not resolve within {} s", timeout.as_secs()),
            )),
        }
    }

    /// TLS ports: opens the tunnel, reads the ClientHello and requires its SNI to name `host`.
    pub(crate) async fn check_sni(&mut self, host: &Host) -> Result<(), Denial> {
        self.client.write_all(CONNECT_OK).await.map_err(|err| {
            Denial::new(
                ReasonCode::ClientFailed,
                format!("writing to the sandbox: {err}"),
            )
        })?;
        self.tunnel_open = true;
        let hello = self.read_hello().await?;
        let Some(name) = hello.sni else {
            return Err(Denial::new(
                ReasonCode::SniMissing,
                format!("the ClientHello names no server; it must name {host}"),
            ));
        };
        self.attempt.sni = Some(name.clone());
        match canonical_host(&name) {
            Ok(sni) if sni == *host => Ok(()),
            _ => Err(Denial::new(
                ReasonCode::SniMismatch,
                format!("the ClientHello names {name}, not the CONNECT host {host}"),
            )),
        }
    }

    async fn read_hello(&mut self) -> Result<ClientHello, Denial> {
        let limit = self.execution.limits.header_read_timeout;
        let deadline = std::time::Instant::now() + limit;
        let unreadable = |err: crate::tls::HelloError| {
            Denial::new(
                ReasonCode::SniUnreadable,
                format!("{err}; a TLS ClientHello is required"),
            )
        };
        loop {
            match record_len(&self.buffered).map_err(unreadable)? {
                Some(total) if self.buffered.len() >= total => {
                    return parse_client_hello(&self.buffered).map_err(unreadable)
                }
                _ => {}
            }
            match self.read_more(deadline).await {
                Ok(0) => {
                    return Err(Denial::new(
                        ReasonCode::SniMissing,
                        "the tunnel closed before a ClientHello",
                    ))
                }
                Ok(_) => {}
                Err(failure) => {
                    return Err(read_denial(failure, || {
                        format!("no ClientHello within {} s", limit.as_secs())
                    }))
                }
            }
        }
    }
}

fn read_denial(failure: ReadFailure, timeout_message: impl FnOnce() -> String) -> Denial {
    match failure {
        ReadFailure::Timeout => Denial::new(ReasonCode::ClientTimeout, timeout_message()),
        ReadFailure::Cancelled => Denial::new(ReasonCode::Shutdown, "the execution ended"),
        ReadFailure::Io(err) => Denial::new(
            ReasonCode::ClientFailed,
            format!("reading from the sandbox: {err}"),
        ),
    }
}

fn head_denial(err: HeadError) -> Denial {
    let reason = match &err {
        HeadError::TooLarge(_) | HeadError::Malformed(_) | HeadError::Unsupported(_) => {
            ReasonCode::BadRequest
        }
        HeadError::Smuggling(_) => ReasonCode::Smuggling,
        HeadError::HostMismatch(_) => ReasonCode::HostMismatch,
        HeadError::Host(_) => ReasonCode::HostInvalid,
    };
    Denial::new(reason, err.to_string())
}

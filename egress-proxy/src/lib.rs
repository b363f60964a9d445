//! `egress-proxy`: sandgate's filtering HTTP/1.1 forward proxy, the only way out of a sandbox.
//!
//! The gateway builds one [`EgressProxy`] and, for each execution whose decision grants network,
//! calls [`EgressProxy::serve_execution`] on a fresh Unix socket that is bind-mounted into the
//! sandbox. The socket a connection arrives on is the execution's identity: nothing the sandbox
//! sends (no header, no target) selects or changes it. Every connection is one attempt:
//! - `CONNECT host:port` tunnels and absolute-form plain HTTP requests (one per connection);
//! - the host is canonicalised ([`canonical_host`]), then the [`EgressPolicy`] decides on the
//!   canonical name and port **before** any resolution, so a denied name is never looked up;
//! - an allowed name is resolved once by the [`Resolve`] implementation, every address is
//!   checked against the address table ([`classify`]), and exactly the checked address
//!   is dialled;
//! - on TLS ports ([`ProxyConfig::tls_ports`]) the ClientHello's SNI must name the CONNECT host
//!   before anything is dialled (so a CONNECT to an IP literal on a TLS port, which carries no
//!   SNI, is refused);
//! - every attempt, allowed or denied, is recorded through the [`ConnectionRecorder`], durably,
//!   before anything is dialled; a recorder failure refuses the attempt (503);
//! - per-execution limits: concurrent connections, total bytes, idle and header-read timeouts,
//!   and denied attempts (rate and total: past them a denial is refused and only counted, the
//!   counts recorded as one summary per window through [`ConnectionRecorder::suppressed`]);
//! - denials are answered with a status and `sandgate-egress: <code>: <message>` ([`ReasonCode`]).
//!
//! - only where the grant marks a destination `inspect: true`: the tunnel is
//!   terminated with the execution's own CA ([`ExecutionCa`], key in memory only), TLS to the
//!   upstream is re-originated and verified ([`upstream_tls`]), and every HTTP/1.1 request inside
//!   is decided by the policy, recorded ([`ConnectionRecorder::open_request`]) and only then
//!   forwarded, with the credentials the decision names attached ([`Credential`], whose value
//!   never prints) and a placeholder anywhere else refused (`credential.misdirected`).
//!
//! It is **not** a policy engine (what is allowed is Rego in `policies/`, reached through
//! [`EgressPolicy`]), not an audit store (the gateway's [`ConnectionRecorder`] writes Postgres),
//! not a TLS terminator except for inspected destinations (elsewhere it never decrypts, so
//! domain fronting behind an allowed SNI is a known residual risk there) and not a general
//! proxy: no HTTP/2, no keep-alive outside inspected tunnels, no caching, no redirects followed.
//! It does not depend on the gateway.

mod addr;
mod admit;
mod body;
mod body_guard;
mod ca;
mod config;
mod conn;
mod credentials;
mod denials;
mod execution;
#[cfg(test)]
mod fuzz;
mod head;
mod host;
mod inspect;
mod listener;
mod path;
mod reason;
mod relay;
mod resolve;
mod seams;
mod streams;
mod tls;

pub use addr::{classify, AddressClass, AddressDenied, AddressPolicy, GrantedRange};
pub use ca::{trust_bundle, upstream_tls, ExecutionCa, TlsSetupError};
pub use config::{
    local_interface_addresses, ExecutionGrant, ExecutionLimits, Inspection, InspectionError,
    ProxyConfig, DEFAULT_MAX_DENIED, DEFAULT_MAX_DENIED_PER_S,
};
pub use credentials::{
    placeholder_env_name, Credential, CredentialSet, ExecutionCredentials, Secret,
    PLACEHOLDER_ENV_PREFIX, PLACEHOLDER_PREFIX,
};
pub use denials::SUMMARY_WINDOW;
pub use host::{canonical_host, Host, HostError};
pub use listener::{EgressProxy, ExecutionListener, ProxyError};
pub use path::{normalise as normalise_path, PathError, MAX_PATH};
pub use reason::{ReasonCode, ReasonSource};
pub use resolve::{DnsResolver, ResolverSetupError, StaticResolver};
pub use seams::{
    Attempt, Closed, ConnectionId, ConnectionRecorder, EgressPolicy, InspectedRequest, RecordError,
    RequestDone, RequestId, Resolve, ResolveError, Scheme, Suppressed,
};
pub use tls::{parse_client_hello, ClientHello, HelloError};

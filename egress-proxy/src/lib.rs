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
//!   checked against the address table ([`classify`], DESIGN 6), and exactly the checked address
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
//! It is **not** a policy engine (what is allowed is Rego in `policies/`, reached through
//! [`EgressPolicy`]), not an audit store (the gateway's [`ConnectionRecorder`] writes Postgres),
//! not a TLS terminator (it never decrypts, so it cannot see inside HTTPS: domain fronting
//! behind an allowed SNI is a known residual risk) and not a general proxy: no HTTP/2, no
//! keep-alive, no caching, no redirects followed, no credentials injected. It does not depend on
//! the gateway.

mod addr;
mod admit;
mod body;
mod config;
mod conn;
mod denials;
#[cfg(test)]
mod fuzz;
mod head;
mod host;
mod listener;
mod reason;
mod relay;
mod resolve;
mod seams;
mod tls;

pub use addr::{classify, AddressClass, AddressDenied, AddressPolicy, GrantedRange};
pub use config::{
    local_interface_addresses, ExecutionGrant, ExecutionLimits, ProxyConfig, DEFAULT_MAX_DENIED,
    DEFAULT_MAX_DENIED_PER_S,
};
pub use denials::SUMMARY_WINDOW;
pub use host::{canonical_host, Host, HostError};
pub use listener::{EgressProxy, ExecutionListener, ProxyError};
pub use reason::{ReasonCode, ReasonSource};
pub use resolve::{DnsResolver, ResolverSetupError, StaticResolver};
pub use seams::{
    Attempt, Closed, ConnectionId, ConnectionRecorder, EgressPolicy, RecordError, Resolve,
    ResolveError, Scheme, Suppressed,
};
pub use tls::{parse_client_hello, ClientHello, HelloError};

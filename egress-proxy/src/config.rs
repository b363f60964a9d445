//! Proxy-wide settings and the per-execution grant a listener serves.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use policy_engine::NetworkGrant;

use crate::ca::{ExecutionCa, TlsSetupError};
use crate::credentials::{Credential, CredentialSet, ExecutionCredentials};

/// Settings shared by every execution's listener.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Ports whose `CONNECT` tunnels must start with a ClientHello whose SNI names the host.
    pub tls_ports: Vec<u16>,
    /// The gateway's own addresses (interfaces, published ports' hosts): always denied, like
    /// loopback. [`local_interface_addresses`] lists this machine's.
    pub denied_addresses: Vec<IpAddr>,
    /// Largest request head, in bytes.
    pub max_head_bytes: usize,
    /// Bound on one name resolution.
    pub dns_timeout: Duration,
    /// Bound on `ConnectionRecorder::open`; past it the attempt is refused (503).
    pub record_timeout: Duration,
    /// How long `ExecutionListener::close` waits for its connections to finish recording.
    pub close_grace: Duration,
    /// What inspected upstreams are verified against ([`crate::upstream_tls`]). `None`: no
    /// destination can be inspected (such tunnels are refused with `egress.upstream_tls_failed`).
    pub upstream_tls: Option<Arc<rustls::ClientConfig>>,
    /// Credentials by name (the gateway's `credentials` config, values loaded; replaced when
    /// the gateway reloads); their values never print ([`crate::Secret`]).
    pub credentials: CredentialSet,
}

impl Default for ProxyConfig {
    fn default() -> ProxyConfig {
        ProxyConfig {
            tls_ports: vec![443],
            denied_addresses: Vec::new(),
            max_head_bytes: 16 * 1024,
            dns_timeout: Duration::from_secs(5),
            record_timeout: Duration::from_secs(5),
            close_grace: Duration::from_secs(5),
            upstream_tls: None,
            credentials: CredentialSet::default(),
        }
    }
}

/// Limits one execution's connections live under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionLimits {
    /// Connections open at once; one more is answered 429.
    pub max_connections: u32,
    /// Bytes up plus down, across all connections of the execution.
    pub max_bytes: u64,
    /// A connection with no byte in either direction for this long is closed.
    pub idle_timeout: Duration,
    /// Time to send the request head, and (TLS ports) the ClientHello.
    pub header_read_timeout: Duration,
    /// Time for the upstream to accept the connection.
    pub connect_timeout: Duration,
    /// Denied attempts recorded one by one; past it, they are refused and counted.
    pub max_denied: u32,
    /// Denied attempts recorded one by one in any second; past it, the same.
    pub max_denied_per_s: u32,
}

/// Denied attempts of one execution recorded on their own when the grant does not say.
pub const DEFAULT_MAX_DENIED: u32 = 256;
/// The same per second.
pub const DEFAULT_MAX_DENIED_PER_S: u32 = 20;

impl ExecutionLimits {
    /// The grant's counts with the default timeouts (idle 60 s, header 10 s, connect 10 s) and,
    /// where the grant names none, the default denial bounds.
    pub fn from_grant(grant: &NetworkGrant) -> ExecutionLimits {
        ExecutionLimits {
            max_connections: grant.max_connections,
            max_bytes: grant.max_bytes,
            idle_timeout: Duration::from_secs(60),
            header_read_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            max_denied: grant.max_denied.unwrap_or(DEFAULT_MAX_DENIED),
            max_denied_per_s: grant.max_denied_per_s.unwrap_or(DEFAULT_MAX_DENIED_PER_S),
        }
    }
}

/// What one execution's listener serves: who it is, what its decision granted, its limits.
#[derive(Debug, Clone)]
pub struct ExecutionGrant {
    pub execution_id: String,
    pub tenant: String,
    pub grant: NetworkGrant,
    pub limits: ExecutionLimits,
    /// For a grant with `inspect: true` rules: the execution's CA and credentials.
    pub inspection: Option<Arc<Inspection>>,
}

/// Connections a sandbox without a network grant may have open at once (each is refused).
const NO_GRANT_CONNECTIONS: u32 = 4;

impl ExecutionGrant {
    /// For an execution whose decision granted no network (issue 21 item 11): the same socket
    /// and proxy as a granted one, with nothing allowed, so every attempt is refused with
    /// `egress.no_grant` naming how to ask for the destination, instead of a program seeing a
    /// name that does not resolve. The floor is unchanged: the sandbox has no network interface.
    pub fn none(execution_id: &str, tenant: &str) -> ExecutionGrant {
        let grant = NetworkGrant {
            allow: Vec::new(),
            max_connections: NO_GRANT_CONNECTIONS,
            max_bytes: 0,
            max_denied: None,
            max_denied_per_s: None,
        };
        ExecutionGrant {
            execution_id: execution_id.to_owned(),
            tenant: tenant.to_owned(),
            limits: ExecutionLimits::from_grant(&grant),
            grant,
            inspection: None,
        }
    }
}

/// What an execution whose grant inspects some destination holds: its own CA (whose key never
/// leaves this process) and its credentials with their placeholders. Dropped with the
/// execution's listener, or, for a sandbox restored from a checkpoint, carried into the
/// restored sandbox's listener ([`Inspection::for_grant_carrying`]): the restored program
/// still trusts that CA and holds those placeholders.
#[derive(Debug)]
pub struct Inspection {
    pub ca: Arc<ExecutionCa>,
    pub credentials: ExecutionCredentials,
}

/// An execution's inspection could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum InspectionError {
    #[error(
        "the grant names credential {name:?} for {host}, but this gateway has no credential of \
         that name (add it under `credentials` in the config)"
    )]
    UnknownCredential { name: String, host: String },
    #[error("the grant inspects {host}, but this gateway has no upstream TLS trust configured")]
    NoUpstreamTrust { host: String },
    #[error("preparing the execution's TLS")]
    Tls(#[source] TlsSetupError),
}

impl Inspection {
    /// For a grant with an `inspect: true` rule: a fresh CA and the credentials its rules name
    /// (each with a fresh placeholder). `None` when nothing is inspected.
    pub fn for_grant(
        execution_id: &str,
        grant: &NetworkGrant,
        config: &ProxyConfig,
    ) -> Result<Option<Inspection>, InspectionError> {
        Inspection::for_grant_carrying(execution_id, grant, config, None)
    }

    /// As [`Inspection::for_grant`], for a sandbox restored from a checkpoint of one that had
    /// `carried`: the same CA (the restored program trusts only it) and, for each credential
    /// the NEW grant names that `carried` had, the same placeholder (the program holds it);
    /// a credential `carried` did not have gets a fresh one, and one the new grant no longer
    /// names is gone with its placeholder. The credential values are the config's current ones.
    pub fn for_grant_carrying(
        execution_id: &str,
        grant: &NetworkGrant,
        config: &ProxyConfig,
        carried: Option<&Inspection>,
    ) -> Result<Option<Inspection>, InspectionError> {
        let Some(first) = grant.allow.iter().find(|rule| rule.inspect) else {
            return Ok(None);
        };
        if config.upstream_tls.is_none() {
            return Err(InspectionError::NoUpstreamTrust {
                host: first.host.clone(),
            });
        }
        let mut credentials: BTreeMap<String, Credential> = BTreeMap::new();
        for rule in grant.allow.iter().filter(|rule| rule.inspect) {
            for name in &rule.credentials {
                let credential = config.credentials.get(name).ok_or_else(|| {
                    InspectionError::UnknownCredential {
                        name: name.clone(),
                        host: rule.host.clone(),
                    }
                })?;
                credentials.insert(name.clone(), credential);
            }
        }
        let credentials: Vec<Credential> = credentials.into_values().collect();
        Ok(Some(match carried {
            Some(carried) => Inspection {
                ca: Arc::clone(&carried.ca),
                credentials: ExecutionCredentials::carrying(credentials, &carried.credentials),
            },
            None => Inspection {
                ca: Arc::new(ExecutionCa::new(execution_id).map_err(InspectionError::Tls)?),
                credentials: ExecutionCredentials::new(credentials),
            },
        }))
    }
}

/// This machine's interface addresses (every family, every interface, loopback included): what
/// a gateway puts in [`ProxyConfig::denied_addresses`] so a sandbox cannot reach its host's
/// services through a non-loopback address.
pub fn local_interface_addresses() -> std::io::Result<Vec<IpAddr>> {
    let mut found = Vec::new();
    for interface in nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)? {
        let Some(address) = interface.address else {
            continue;
        };
        if let Some(v4) = address.as_sockaddr_in() {
            found.push(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = address.as_sockaddr_in6() {
            found.push(IpAddr::V6(v6.ip()));
        }
    }
    found.sort_unstable();
    found.dedup();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_addresses_include_loopback() {
        let found = local_interface_addresses().unwrap();
        assert!(found.contains(&"127.0.0.1".parse().unwrap()), "{found:?}");
    }
}

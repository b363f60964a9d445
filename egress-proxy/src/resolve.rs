//! Resolvers: the system one (hickory over `/etc/resolv.conf`, honouring `/etc/hosts`) and a
//! static map for tests and fixed configurations.
//!
//! Names are looked up as fully qualified (no search domains: the name the policy allowed is the
//! name resolved), IPv4 first then IPv6 as the system resolver does, and a name found in the
//! hosts file is answered from it without a query.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use hickory_resolver::config::{LookupIpStrategy, ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::rr::Name;
use hickory_resolver::{Hosts, TokioResolver};

use crate::seams::{Resolve, ResolveError};

/// The resolver could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ResolverSetupError {
    #[error("reading the system resolver configuration: {0}")]
    SystemConfig(String),
    #[error("reading hosts file {path}: {err}")]
    Hosts { path: String, err: io::Error },
}

/// Resolves with hickory: the system configuration, or only a hosts file.
#[derive(Clone)]
pub struct DnsResolver {
    inner: TokioResolver,
}

impl std::fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsResolver").finish_non_exhaustive()
    }
}

impl DnsResolver {
    /// The system's resolver: name servers and options from `/etc/resolv.conf`, names in
    /// `/etc/hosts` answered from it. `timeout` bounds each query to a name server.
    pub fn system(timeout: Duration) -> Result<DnsResolver, ResolverSetupError> {
        let mut builder = TokioResolver::builder_tokio()
            .map_err(|err| ResolverSetupError::SystemConfig(err.to_string()))?;
        configure(builder.options_mut(), timeout);
        Ok(DnsResolver {
            inner: builder.build(),
        })
    }

    /// Answers only from a hosts-format file, asking no name server (tests, offline set-ups).
    pub fn hosts_file(path: &Path) -> Result<DnsResolver, ResolverSetupError> {
        let file = std::fs::File::open(path).map_err(|err| ResolverSetupError::Hosts {
            path: path.display().to_string(),
            err,
        })?;
        let mut hosts = Hosts::default();
        hosts
            .read_hosts_conf(file)
            .map_err(|err| ResolverSetupError::Hosts {
                path: path.display().to_string(),
                err,
            })?;
        let mut builder = TokioResolver::builder_with_config(
            ResolverConfig::new(),
            TokioConnectionProvider::default(),
        );
        configure(builder.options_mut(), Duration::from_secs(1));
        builder.options_mut().use_hosts_file = ResolveHosts::Never;
        let mut inner = builder.build();
        inner.set_hosts(Arc::new(hosts));
        Ok(DnsResolver { inner })
    }
}

fn configure(options: &mut ResolverOpts, timeout: Duration) {
    options.timeout = timeout;
    options.attempts = 1;
    options.ip_strategy = LookupIpStrategy::Ipv4thenIpv6;
    options.use_hosts_file = ResolveHosts::Always;
    options.ndots = 0;
}

impl Resolve for DnsResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, ResolveError>> {
        Box::pin(async move {
            let failed = |message: String| ResolveError::Failed {
                name: name.to_string(),
                message,
            };
            let fqdn =
                Name::from_ascii(format!("{name}.")).map_err(|err| failed(err.to_string()))?;
            match self.inner.lookup_ip(fqdn).await {
                Ok(lookup) => {
                    let addresses: Vec<IpAddr> = lookup.iter().collect();
                    if addresses.is_empty() {
                        return Err(ResolveError::NotFound(name.to_string()));
                    }
                    Ok(addresses)
                }
                Err(err) if err.is_no_records_found() => {
                    Err(ResolveError::NotFound(name.to_string()))
                }
                Err(err) => Err(failed(err.to_string())),
            }
        })
    }
}

/// A fixed name -> addresses map; it remembers every name it was asked for, so tests can assert
/// that a denied name was never looked up.
#[derive(Debug, Default)]
pub struct StaticResolver {
    names: HashMap<String, Vec<IpAddr>>,
    asked: Mutex<Vec<String>>,
}

impl StaticResolver {
    pub fn new<I, S>(entries: I) -> StaticResolver
    where
        I: IntoIterator<Item = (S, Vec<IpAddr>)>,
        S: Into<String>,
    {
        StaticResolver {
            names: entries
                .into_iter()
                .map(|(name, addresses)| (name.into(), addresses))
                .collect(),
            asked: Mutex::new(Vec::new()),
        }
    }

    /// Every name looked up so far, in order.
    pub fn lookups(&self) -> Vec<String> {
        self.asked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Resolve for StaticResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, ResolveError>> {
        self.asked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(name.to_string());
        let answer = match self.names.get(name) {
            Some(addresses) if !addresses.is_empty() => Ok(addresses.clone()),
            _ => Err(ResolveError::NotFound(name.to_string())),
        };
        Box::pin(async move { answer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn hosts_file_answers_without_a_name_server() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        std::fs::write(
            &path,
            "# test hosts\n198.51.100.2 upstream.test alias.test\n2001:db8::7 upstream.test\n",
        )
        .unwrap();
        let resolver = DnsResolver::hosts_file(&path).unwrap();
        let found = resolver.resolve("upstream.test").await.unwrap();
        assert_eq!(found, vec!["198.51.100.2".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            resolver.resolve("alias.test").await.unwrap(),
            vec!["198.51.100.2".parse::<IpAddr>().unwrap()]
        );
        // Not in the file, and no name server to ask: an error, quickly.
        let started = std::time::Instant::now();
        assert!(resolver.resolve("absent.test").await.is_err());
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn system_resolver_reads_the_system_configuration() {
        // Only constructed: a lookup would send a query off this machine.
        DnsResolver::system(Duration::from_secs(2)).unwrap();
    }

    #[tokio::test]
    async fn static_resolver_remembers_lookups() {
        let resolver = StaticResolver::new([("a.test", vec!["192.0.2.1".parse().unwrap()])]);
        assert!(resolver.resolve("a.test").await.is_ok());
        assert_eq!(
            resolver.resolve("b.test").await,
            Err(ResolveError::NotFound("b.test".into()))
        );
        assert_eq!(resolver.lookups(), vec!["a.test", "b.test"]);
    }
}

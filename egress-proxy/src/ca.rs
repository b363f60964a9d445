//! TLS for inspected destinations: the execution's own certificate
//! authority, which signs a leaf per host the sandbox reaches, and the upstream trust the proxy
//! verifies real servers against. rustls on both sides, with the `ring` provider.
//!
//! The CA's private key exists only in this process's memory, inside [`ExecutionCa`]; it is
//! never serialised, logged or written anywhere, and it is dropped with the execution's
//! listener. The sandbox gets only the certificate ([`ExecutionCa::certificate_pem`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Leaf certificates one execution may have minted (one per inspected host it reaches).
const MAX_LEAVES: usize = 64;
/// How long the CA and its leaves are valid: longer than any execution may run.
const VALIDITY_DAYS: i64 = 2;

/// Setting up TLS failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("making the execution's certificate authority")]
    Ca(#[source] rcgen::Error),
    #[error("minting a certificate for {host}")]
    Leaf {
        host: String,
        #[source]
        err: rcgen::Error,
    },
    #[error("more than {MAX_LEAVES} inspected hosts in one execution")]
    TooManyHosts,
    #[error("building the TLS configuration")]
    Rustls(#[source] rustls::Error),
    #[error("reading the egress CA file {path}: it must hold PEM certificates")]
    CaFile {
        path: String,
        #[source]
        err: rustls_pki_types::pem::Error,
    },
    #[error("the egress CA file {path} holds no certificate")]
    CaFileEmpty { path: String },
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// One execution's certificate authority and the leaves it has minted.
pub struct ExecutionCa {
    cert: rcgen::Certificate,
    key: KeyPair,
    pem: String,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl std::fmt::Debug for ExecutionCa {
    /// The key is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutionCa").finish_non_exhaustive()
    }
}

impl ExecutionCa {
    /// A fresh CA named after the execution, valid from an hour ago for two days.
    pub fn new(execution_id: &str) -> Result<ExecutionCa, TlsSetupError> {
        let key = KeyPair::generate().map_err(TlsSetupError::Ca)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(TlsSetupError::Ca)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.distinguished_name.push(
            DnType::CommonName,
            format!("sandgate execution {execution_id}"),
        );
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        set_validity(&mut params);
        let cert = params.self_signed(&key).map_err(TlsSetupError::Ca)?;
        let pem = cert.pem();
        Ok(ExecutionCa {
            cert,
            key,
            pem,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate (PEM): what the sandbox trusts.
    pub fn certificate_pem(&self) -> &str {
        &self.pem
    }

    /// The server configuration presenting a leaf for `host`, minted on first use and cached.
    pub(crate) fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, TlsSetupError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(config) = leaves.get(host) {
            return Ok(Arc::clone(config));
        }
        if leaves.len() >= MAX_LEAVES {
            return Err(TlsSetupError::TooManyHosts);
        }
        let config = Arc::new(self.mint(host)?);
        leaves.insert(host.to_owned(), Arc::clone(&config));
        Ok(config)
    }

    fn mint(&self, host: &str) -> Result<ServerConfig, TlsSetupError> {
        let leaf_error = |err| TlsSetupError::Leaf {
            host: host.to_owned(),
            err,
        };
        let key = KeyPair::generate().map_err(leaf_error)?;
        let mut params = CertificateParams::new(vec![host.to_owned()]).map_err(leaf_error)?;
        params.distinguished_name.push(DnType::CommonName, host);
        // What strict verifiers (OpenSSL's X509_STRICT, Python 3.13's default) require: an
        // authority key id, a subject key id and an explicit "not a CA".
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        set_validity(&mut params);
        let leaf = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(leaf_error)?;
        let chain = vec![leaf.der().clone(), self.cert.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsSetupError::Rustls)?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(TlsSetupError::Rustls)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

fn set_validity(params: &mut CertificateParams) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(VALIDITY_DAYS);
}

/// The trust the proxy verifies inspected upstreams against: this machine's root certificates
/// plus, when given, the PEM certificates of `extra_ca_file` (config `egress_ca_file`).
pub fn upstream_tls(extra_ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(system_roots());
    if let Some(path) = extra_ca_file {
        let extra = read_pem_certificates(path)?;
        roots.add_parsable_certificates(extra);
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsSetupError::Rustls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn read_pem_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let shown = || path.display().to_string();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|err| TlsSetupError::CaFile { path: shown(), err })?;
    if certs.is_empty() {
        return Err(TlsSetupError::CaFileEmpty { path: shown() });
    }
    Ok(certs)
}

/// This machine's root certificates (those that fail to load are skipped, as every TLS client
/// on the machine does).
fn system_roots() -> Vec<CertificateDer<'static>> {
    rustls_native_certs::load_native_certs().certs
}

/// The bundle an inspecting execution's sandbox trusts: this machine's roots, then the
/// execution's CA, as PEM.
pub fn trust_bundle(ca: &ExecutionCa) -> String {
    /// The machine's roots as PEM, read once per process.
    static SYSTEM_PEM: OnceLock<String> = OnceLock::new();
    let system = SYSTEM_PEM.get_or_init(|| {
        system_roots()
            .iter()
            .map(|cert| pem_certificate(cert.as_ref()))
            .collect()
    });
    let mut bundle = String::with_capacity(system.len() + ca.certificate_pem().len());
    bundle.push_str(system);
    bundle.push_str(ca.certificate_pem());
    bundle
}

fn pem_certificate(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_signs_a_cached_leaf_per_host_and_its_pem_holds_no_key() {
        let ca = ExecutionCa::new("ex_1").unwrap();
        assert!(ca.certificate_pem().contains("BEGIN CERTIFICATE"));
        assert!(!ca.certificate_pem().contains("PRIVATE KEY"));
        let first = ca.server_config("api.example.test").unwrap();
        let again = ca.server_config("api.example.test").unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        let other = ca.server_config("other.example.test").unwrap();
        assert!(!Arc::ptr_eq(&first, &other));
        assert!(!format!("{ca:?}").contains("PRIVATE"));
    }

    #[test]
    fn the_bundle_ends_with_the_execution_ca() {
        let ca = ExecutionCa::new("ex_1").unwrap();
        let bundle = trust_bundle(&ca);
        assert!(bundle.ends_with(ca.certificate_pem()));
    }
}

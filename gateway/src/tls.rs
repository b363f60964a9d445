//! The API over HTTPS (config `tls`): rustls with the ring provider, HTTP/1.1 only, and with
//! `client_ca_file` a client certificate required at the handshake (mutual TLS). It owns the
//! accept loop for TLS listeners; plain HTTP is served by `axum::serve` in `lib.rs`.
//!
//! It is not a certificate manager: files are read once at start-up.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Tls;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("tls: cannot read {what} {path}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        err: rustls::pki_types::pem::Error,
    },
    #[error("tls: {path} holds no PEM certificate ({what})")]
    Empty { what: &'static str, path: PathBuf },
    #[error("tls: client_ca_file {path} cannot verify client certificates")]
    ClientCa {
        path: PathBuf,
        #[source]
        err: rustls::server::VerifierBuilderError,
    },
    #[error("tls: the certificate and key do not make a server configuration")]
    Config(#[source] rustls::Error),
}

/// The acceptor for `tls`: certificate chain, key, and the client CA if any.
pub fn acceptor(tls: &Tls) -> Result<TlsAcceptor, TlsError> {
    let chain = certificates(&tls.cert_file, "cert_file")?;
    let key = PrivateKeyDer::from_pem_file(&tls.key_file).map_err(|err| TlsError::Read {
        what: "key_file",
        path: tls.key_file.clone(),
        err,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?;
    let builder = match &tls.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for ca in certificates(path, "client_ca_file")? {
                roots.add(ca).map_err(TlsError::Config)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|err| TlsError::ClientCa {
                    path: path.clone(),
                    err,
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn certificates(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |err| TlsError::Read {
        what,
        path: path.to_owned(),
        err,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// Serves `router` over TLS on `listener` until `shutdown`; each connection is a task in
/// `tasks`, closed gracefully on shutdown.
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    shutdown: CancellationToken,
    tasks: &TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(connection) => connection,
            Err(err) => {
                tracing::warn!(error = %err, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let (acceptor, router, shutdown) = (acceptor.clone(), router.clone(), shutdown.clone());
        tasks.spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(err)) => {
                    tracing::info!(%peer, error = %err, "TLS handshake refused");
                    return;
                }
                Err(_) => {
                    tracing::info!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            serve_connection(stream, router, shutdown).await;
        });
    }
}

async fn serve_connection(
    stream: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    router: Router,
    shutdown: CancellationToken,
) {
    let connection = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(router))
        .with_upgrades();
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(err) = result {
        tracing::debug!(error = %err, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (cert_file, key_file) = (
            dir.join(format!("{stem}.pem")),
            dir.join(format!("{stem}.key")),
        );
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file)
    }

    #[test]
    fn a_matching_certificate_and_key_make_an_acceptor() {
        let dir = tempfile::tempdir().unwrap();
        let (cert_file, key_file) = write_pair(dir.path(), "a");
        let tls = Tls {
            cert_file: cert_file.clone(),
            key_file,
            client_ca_file: Some(cert_file),
        };
        assert!(acceptor(&tls).is_ok());
    }

    #[test]
    fn bad_files_stop_start_up_with_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let (cert_a, _) = write_pair(dir.path(), "a");
        let (_, key_b) = write_pair(dir.path(), "b");
        let mismatched = Tls {
            cert_file: cert_a.clone(),
            key_file: key_b.clone(),
            client_ca_file: None,
        };
        assert!(matches!(acceptor(&mismatched), Err(TlsError::Config(_))));
        let missing = Tls {
            cert_file: dir.path().join("absent.pem"),
            key_file: key_b.clone(),
            client_ca_file: None,
        };
        let err = acceptor(&missing).err().unwrap();
        assert!(err.to_string().contains("absent.pem"), "{err}");
        let not_a_certificate = Tls {
            cert_file: key_b.clone(),
            key_file: key_b,
            client_ca_file: None,
        };
        assert!(matches!(
            acceptor(&not_a_certificate),
            Err(TlsError::Empty { .. })
        ));
    }
}

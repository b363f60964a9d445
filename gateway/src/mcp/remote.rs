//! Tool calls sent to a gateway's HTTP API (`sandgate mcp --url --key`): the gateway decides,
//! audits and runs them as it does any `POST /v1/executions`.

use std::path::Path;
use std::time::Duration;

use api_types::{
    ErrorCode, ExecutionRequest, ExecutionView, SessionExecutionRequest, SessionRequest,
    SessionView,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Refusal, Runner};
use crate::client::{encode_path, TlsFiles};

/// Connecting should be quick; an execution may queue and run for minutes.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("--url must be an http:// or https:// URL of the gateway (got {0:?})")]
    Url(String),
    #[error("cannot read the CA file {path}")]
    CaFile {
        path: std::path::PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("the CA file {path} holds no PEM certificate")]
    CaPem {
        path: std::path::PathBuf,
        #[source]
        err: reqwest::Error,
    },
    #[error("the client certificate {cert} or its key {key} is not usable (want PEM)")]
    Identity {
        cert: std::path::PathBuf,
        key: std::path::PathBuf,
        #[source]
        err: reqwest::Error,
    },
    #[error("cannot read the client certificate or key {path}")]
    IdentityFile {
        path: std::path::PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
}

/// A gateway reached over HTTP(S) with one API key.
#[derive(Debug, Clone)]
pub struct Remote {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Remote {
    /// `tls.ca_file` adds a CA to the system roots, for gateways with a private certificate;
    /// `tls.client_cert` is presented to gateways that require one.
    pub fn new(url: &str, key: &str, tls: &TlsFiles) -> Result<Remote, RemoteError> {
        let base = url.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(RemoteError::Url(base));
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT);
        if let Some(path) = tls.ca_file.as_deref() {
            let pem = std::fs::read(path).map_err(|err| RemoteError::CaFile {
                path: path.to_owned(),
                err,
            })?;
            let ca = reqwest::Certificate::from_pem(&pem).map_err(|err| RemoteError::CaPem {
                path: path.to_owned(),
                err,
            })?;
            builder = builder.add_root_certificate(ca);
        }
        if let Some((cert, key)) = &tls.client_cert {
            builder = builder.identity(identity(cert, key)?);
        }
        let http = builder.build().map_err(RemoteError::Client)?;
        Ok(Remote {
            http,
            base,
            key: key.to_owned(),
        })
    }

    /// `POST path` with a JSON body: the status and the answer's bytes, whatever the status
    /// (for the admin subcommands, which print refusals themselves).
    pub async fn post_json(&self, path: &str, body: &Value) -> Result<(u16, Vec<u8>), String> {
        self.post_json_if_match(path, body, None).await
    }

    /// [`Remote::post_json`] with an `If-Match` header when `if_match` is given.
    pub async fn post_json_if_match(
        &self,
        path: &str,
        body: &Value,
        if_match: Option<&str>,
    ) -> Result<(u16, Vec<u8>), String> {
        let mut request = self.http.post(format!("{}{path}", self.base));
        if let Some(revision) = if_match {
            request = request.header(reqwest::header::IF_MATCH, revision);
        }
        let response = request
            .bearer_auth(&self.key)
            .json(body)
            .send()
            .await
            .map_err(|err| unreachable(&self.base, &err).message)?;
        let status = response.status().as_u16();
        let answer = response.bytes().await.unwrap_or_default();
        Ok((status, answer.to_vec()))
    }

    /// `POST path` with a raw body of `content_type`; as [`Remote::post_json`].
    pub async fn post_bytes(
        &self,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<(u16, Vec<u8>), String> {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body)
            .send()
            .await
            .map_err(|err| unreachable(&self.base, &err).message)?;
        let status = response.status().as_u16();
        let answer = response.bytes().await.unwrap_or_default();
        Ok((status, answer.to_vec()))
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, Refusal> {
        let response = request
            .bearer_auth(&self.key)
            .send()
            .await
            .map_err(|err| unreachable(&self.base, &err))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap_or_default();
        Err(Refusal::from_error_body(status, &body))
    }
}

impl Remote {
    /// The answer read as `T` (an answer of another shape is `unavailable`, with why).
    async fn json<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, Refusal> {
        let response = self.send(request).await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|err| unreachable(&self.base, &err))?;
        serde_json::from_slice(&bytes).map_err(|err| {
            Refusal::new(
                ErrorCode::Unavailable,
                format!("the gateway at {}: unexpected answer: {err}", self.base),
            )
        })
    }
}

fn identity(cert: &Path, key: &Path) -> Result<reqwest::Identity, RemoteError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|err| RemoteError::IdentityFile {
            path: path.to_owned(),
            err,
        })
    };
    let mut pem = read(cert)?;
    pem.push(b'\n');
    pem.extend(read(key)?);
    reqwest::Identity::from_pem(&pem).map_err(|err| RemoteError::Identity {
        cert: cert.to_owned(),
        key: key.to_owned(),
        err,
    })
}

fn unreachable(base: &str, err: &reqwest::Error) -> Refusal {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    Refusal::new(
        ErrorCode::Unavailable,
        format!("cannot reach the gateway at {base}: {text}"),
    )
}

impl Runner for Remote {
    async fn run(&self, body: ExecutionRequest) -> Result<ExecutionView, Refusal> {
        let url = format!("{}/v1/executions", self.base);
        self.json(self.http.post(url).json(&body)).await
    }

    async fn open_session(&self, body: SessionRequest) -> Result<SessionView, Refusal> {
        let url = format!("{}/v1/sessions", self.base);
        self.json(self.http.post(url).json(&body)).await
    }

    async fn run_in_session(
        &self,
        id: &str,
        body: SessionExecutionRequest,
    ) -> Result<ExecutionView, Refusal> {
        let url = format!("{}/v1/sessions/{}/executions", self.base, encode_path(id));
        self.json(self.http.post(url).json(&body)).await
    }

    async fn close_session(&self, id: &str) -> Result<SessionView, Refusal> {
        let url = format!("{}/v1/sessions/{}", self.base, encode_path(id));
        self.json(self.http.delete(url)).await
    }

    async fn request_access(
        &self,
        id: &str,
        justification: &str,
    ) -> Result<api_types::AccessRequested, Refusal> {
        let url = format!(
            "{}/v1/executions/{}/access-request",
            self.base,
            encode_path(id)
        );
        let body = serde_json::json!({ "justification": justification });
        self.json(self.http.post(url).json(&body)).await
    }

    async fn download(&self, execution_id: &str, path: &str) -> Result<Vec<u8>, Refusal> {
        let url = format!("{}/v1/executions/{execution_id}/outputs/{path}", self.base);
        let response = self.send(self.http.get(url)).await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|err| unreachable(&self.base, &err))?;
        Ok(bytes.to_vec())
    }
}

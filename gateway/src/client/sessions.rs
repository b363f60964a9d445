//! The session routes of the HTTP API (DESIGN 10) as typed calls, for `sandgate repl` and
//! `sandgate exec --session`: open, run one execution, interrupt the running one, read, close.
//! Bodies and answers are the `session_wire` types the gateway serialises.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::session_wire::{OpenSession, RunInSession, SessionRun, SessionView};
use crate::status::ExecutionStatus;

/// How long an interrupt looks for the session's running execution (it is marked running only
/// once its turn has been handed over).
const FIND_RUNNING_TRIES: u32 = 50;
const FIND_RUNNING_PAUSE: Duration = Duration::from_millis(100);

/// Why a call failed: the gateway's answer, or no answer at all.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// An API error (`{"error": {...}}`): `code` is the API's error code.
    #[error("the gateway answered {status}: {message} ({code}){}", hint(.status))]
    Api {
        status: StatusCode,
        code: String,
        message: String,
        /// The policy's reasons, as `(code, message)`.
        reasons: Vec<(String, String)>,
    },
    #[error("cannot reach the gateway at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("the gateway's answer to {url} is not what sandgate expects: {detail}")]
    Answer { url: String, detail: String },
}

fn hint(status: &StatusCode) -> &'static str {
    if *status == StatusCode::UNAUTHORIZED {
        "; the key comes from --key or SANDGATE_KEY"
    } else {
        ""
    }
}

impl CallError {
    /// The API's error code, when the gateway answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            CallError::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// One gateway, one key.
#[derive(Debug, Clone)]
pub struct SessionClient {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl SessionClient {
    pub fn new(http: reqwest::Client, base: &str, key: &str) -> SessionClient {
        SessionClient {
            http,
            base: base.trim_end_matches('/').to_owned(),
            key: key.to_owned(),
        }
    }

    /// `POST /v1/sessions`.
    pub async fn open(&self, body: &OpenSession) -> Result<SessionView, CallError> {
        self.call(Method::POST, "/v1/sessions", Some(body)).await
    }

    /// `POST /v1/sessions/{id}/executions`: answered when the execution ended.
    pub async fn run(&self, id: &str, body: &RunInSession) -> Result<SessionRun, CallError> {
        let path = format!("/v1/sessions/{}/executions", super::encode_path(id));
        self.call(Method::POST, &path, Some(body)).await
    }

    /// `GET /v1/sessions/{id}`.
    pub async fn get(&self, id: &str) -> Result<SessionView, CallError> {
        let path = format!("/v1/sessions/{}", super::encode_path(id));
        self.call::<SessionView, ()>(Method::GET, &path, None).await
    }

    /// `DELETE /v1/sessions/{id}`: the session as it closed.
    pub async fn close(&self, id: &str) -> Result<SessionView, CallError> {
        let path = format!("/v1/sessions/{}", super::encode_path(id));
        self.call::<SessionView, ()>(Method::DELETE, &path, None)
            .await
    }

    /// Cancels the execution running in session `id` (`POST /v1/executions/{id}/cancel`, the
    /// route every execution has); `Ok(None)` when none was running.
    pub async fn interrupt(&self, id: &str) -> Result<Option<String>, CallError> {
        for _ in 0..FIND_RUNNING_TRIES {
            if let Some(running) = self.running_in(id).await? {
                let path = format!("/v1/executions/{}/cancel", super::encode_path(&running));
                return match self.call::<Value, ()>(Method::POST, &path, None).await {
                    Ok(_) => Ok(Some(running)),
                    // It ended on its own in the meantime.
                    Err(err) if err.code() == Some("conflict") => Ok(None),
                    Err(err) => Err(err),
                };
            }
            tokio::time::sleep(FIND_RUNNING_PAUSE).await;
        }
        Ok(None)
    }

    /// The id of the execution now running in session `id`, if any.
    async fn running_in(&self, id: &str) -> Result<Option<String>, CallError> {
        let running = ExecutionStatus::Running.as_str();
        let path = format!("/v1/executions?status={running}&limit=100");
        let listed: Value = self.call::<Value, ()>(Method::GET, &path, None).await?;
        Ok(listed["executions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|execution| execution["session_id"] == id)
            .and_then(|execution| execution["id"].as_str())
            .map(str::to_owned))
    }

    async fn call<T: DeserializeOwned, B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, CallError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method, &url).bearer_auth(&self.key);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|err| CallError::Unreachable {
            url: url.clone(),
            detail: super::error_chain(&err),
        })?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|err| CallError::Unreachable {
                url: url.clone(),
                detail: super::error_chain(&err),
            })?;
        if !status.is_success() {
            return Err(api_error(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|err| CallError::Answer {
            url,
            detail: err.to_string(),
        })
    }
}

fn api_error(status: StatusCode, bytes: &[u8]) -> CallError {
    let body: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
    let error = &body["error"];
    CallError::Api {
        status,
        code: error["code"].as_str().unwrap_or("no code").to_owned(),
        message: error["message"].as_str().unwrap_or("no message").to_owned(),
        reasons: error["reasons"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|reason| {
                let text = |key: &str| reason[key].as_str().unwrap_or_default().to_owned();
                (text("code"), text("message"))
            })
            .collect(),
    }
}

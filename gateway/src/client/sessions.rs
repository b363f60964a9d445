//! The HTTP API as typed calls, for `sandgate exec`, `sandgate repl` and `sandgate exec
//! --session`: any route ([`ApiClient::call`]) and the session routes: open, run one
//! execution, interrupt the running one, read, close. Bodies and answers are the `api-types`
//! the gateway serialises; an error answer is read as an [`ErrorBody`].

use std::time::Duration;

use api_types::{
    ErrorBody, ErrorCode, ExecutionPage, ExecutionView, Reason, SessionExecutionRequest,
    SessionRequest, SessionView,
};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::status::ExecutionStatus;

/// How long an interrupt looks for the session's running execution (it is marked running only
/// once its turn has been handed over).
const FIND_RUNNING_TRIES: u32 = 50;
const FIND_RUNNING_PAUSE: Duration = Duration::from_millis(100);

/// Why a call failed: the gateway's answer, or no answer at all.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// An API error (`{"error": {...}}`): `code` is the API's error code (`None`: the answer
    /// was no error body).
    #[error("the gateway answered {status}: {message} ({}){}", code_text(*.code), hint(.status))]
    Api {
        status: StatusCode,
        code: Option<ErrorCode>,
        message: String,
        /// The policy's reasons (`policy_denied`).
        reasons: Vec<Reason>,
    },
    #[error("cannot reach the gateway at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("the gateway's answer to {url} is not what sandgate expects: {detail}")]
    Answer { url: String, detail: String },
}

fn code_text(code: Option<ErrorCode>) -> &'static str {
    code.map_or("no code", ErrorCode::as_str)
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
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            CallError::Api { code, .. } => *code,
            _ => None,
        }
    }
}

/// One gateway, one key.
#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    key: String,
}

/// The session routes' client is the API client.
pub type SessionClient = ApiClient;

impl ApiClient {
    pub fn new(http: reqwest::Client, base: &str, key: &str) -> ApiClient {
        ApiClient {
            http,
            base: base.trim_end_matches('/').to_owned(),
            key: key.to_owned(),
        }
    }

    /// `POST /v1/sessions`.
    pub async fn open(&self, body: &SessionRequest) -> Result<SessionView, CallError> {
        self.call(Method::POST, "/v1/sessions", Some(body)).await
    }

    /// `POST /v1/sessions/{id}/executions`: answered when the execution ended.
    pub async fn run(
        &self,
        id: &str,
        body: &SessionExecutionRequest,
    ) -> Result<ExecutionView, CallError> {
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
                return match self
                    .call::<ExecutionView, ()>(Method::POST, &path, None)
                    .await
                {
                    Ok(_) => Ok(Some(running)),
                    // It ended on its own in the meantime.
                    Err(err) if err.code() == Some(ErrorCode::Conflict) => Ok(None),
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
        let listed: ExecutionPage = self.call::<_, ()>(Method::GET, &path, None).await?;
        Ok(listed
            .executions
            .into_iter()
            .find(|execution| execution.session_id.as_deref() == Some(id))
            .map(|execution| execution.id))
    }

    /// `GET url` (a stream or a file): the response once its status is a success.
    pub async fn get_raw(&self, url: &str) -> Result<reqwest::Response, CallError> {
        let unreachable = |err: reqwest::Error| CallError::Unreachable {
            url: url.to_owned(),
            detail: crate::errors::error_chain(&err),
        };
        let response = self
            .http
            .get(url)
            .bearer_auth(&self.key)
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let bytes = response.bytes().await.map_err(unreachable)?;
        Err(api_error(status, &bytes))
    }

    /// `method path` with `body` as JSON; the answer read as `T`, an error answer as
    /// [`CallError::Api`].
    pub async fn call<T: DeserializeOwned, B: Serialize>(
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
            detail: crate::errors::error_chain(&err),
        })?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|err| CallError::Unreachable {
                url: url.clone(),
                detail: crate::errors::error_chain(&err),
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

/// Longest part of an answer that is no error body quoted in the message.
const MAX_QUOTED: usize = 200;

/// A failed answer as an error: its [`ErrorBody`], or (a proxy's page, say) its first bytes.
pub fn api_error(status: StatusCode, bytes: &[u8]) -> CallError {
    match serde_json::from_slice::<ErrorBody>(bytes) {
        Ok(ErrorBody { error }) => CallError::Api {
            status,
            code: Some(error.code),
            message: error.message,
            reasons: error.reasons.unwrap_or_default(),
        },
        Err(_) => {
            let text = String::from_utf8_lossy(bytes);
            let quoted: String = text.chars().take(MAX_QUOTED).collect();
            CallError::Api {
                status,
                code: None,
                message: if quoted.trim().is_empty() {
                    "no message".to_owned()
                } else {
                    quoted
                },
                reasons: Vec::new(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_answers_are_read_as_error_bodies() {
        let body = br#"{"error":{"code":"policy_denied","message":"the policy denied this execution","reasons":[{"code":"network.not_allowed","message":"no"}],"execution_id":"ex_1"}}"#;
        let err = api_error(StatusCode::FORBIDDEN, body);
        assert_eq!(err.code(), Some(ErrorCode::PolicyDenied));
        let CallError::Api { reasons, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(reasons[0].code, "network.not_allowed");
        assert!(err.to_string().contains("(policy_denied)"), "{err}");
        let proxy = api_error(StatusCode::BAD_GATEWAY, b"<html>bad gateway</html>");
        assert_eq!(proxy.code(), None);
        assert!(
            proxy
                .to_string()
                .contains("<html>bad gateway</html> (no code)"),
            "{proxy}"
        );
        let unauthenticated = br#"{"error":{"code":"unauthenticated","message":"no key"}}"#;
        let err = api_error(StatusCode::UNAUTHORIZED, unauthenticated);
        assert!(
            err.to_string()
                .ends_with("(unauthenticated); the key comes from --key or SANDGATE_KEY"),
            "{err}"
        );
    }
}

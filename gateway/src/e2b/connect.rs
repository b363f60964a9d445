//! The Connect protocol as envd speaks it to the E2B SDKs, JSON codec only (the SDKs' choice:
//! `useBinaryFormat: false` in JS, the envd JSON codec in Python), and `process.Process`'s
//! messages, field for field from `spec/envd/process/process.proto` of e2b-dev/E2B in proto3's
//! JSON mapping (lowerCamelCase names, 64-bit and bytes as strings, bytes in base64).
//!
//! Unary calls: `application/json` bodies, errors as a JSON `{code, message}` with the HTTP
//! status Connect maps the code to. Server streams: `application/connect+json`, each message in
//! an envelope (flags byte, big-endian u32 length, JSON); the last envelope has flag `0x02` and
//! holds `{}` or `{"error": {...}}`, with HTTP 200 whatever happened.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::http::StatusCode;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Envelope flag of the end-of-stream message.
const END_STREAM: u8 = 0x02;
/// Envelope flag of a compressed message (refused: the SDKs never compress).
const COMPRESSED: u8 = 0x01;
/// Largest request message read (a start request carries a command line and its env).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";
pub const UNARY_CONTENT_TYPE: &str = "application/json";

/// Connect's error codes (the ones sandgate answers with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    NotFound,
    PermissionDenied,
    FailedPrecondition,
    Unimplemented,
    Unauthenticated,
    Unavailable,
    Internal,
    ResourceExhausted,
    DeadlineExceeded,
    AlreadyExists,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::PermissionDenied => "permission_denied",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Unauthenticated => "unauthenticated",
            Code::Unavailable => "unavailable",
            Code::Internal => "internal",
            Code::ResourceExhausted => "resource_exhausted",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::AlreadyExists => "already_exists",
        }
    }

    /// The HTTP status of a unary error with this code (Connect's table).
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::AlreadyExists => StatusCode::CONFLICT,
        }
    }
}

/// A Connect error: its code and a message for the caller.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    /// The JSON of the error (`{code, message}`), for a unary body or an end-of-stream.
    pub fn to_json(&self) -> serde_json::Value {
        json!({"code": self.code.as_str(), "message": self.message})
    }
}

/// One envelope around `data`.
pub fn envelope(flags: u8, data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + data.len());
    out.push(flags);
    out.extend_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(data);
    Bytes::from(out)
}

/// One stream message, enveloped.
pub fn message<T: Serialize>(value: &T) -> Bytes {
    envelope(0, &serde_json::to_vec(value).unwrap_or_default())
}

/// The end-of-stream envelope: `{}`, or the error.
pub fn end_stream(error: Option<&ConnectError>) -> Bytes {
    let body = match error {
        Some(error) => json!({"error": error.to_json()}),
        None => json!({}),
    };
    envelope(END_STREAM, body.to_string().as_bytes())
}

/// The one message of a server-streaming request: exactly one uncompressed envelope.
pub fn single_envelope(body: &[u8]) -> Result<&[u8], ConnectError> {
    let invalid = |why: &str| ConnectError::new(Code::InvalidArgument, why.to_owned());
    if body.len() < 5 {
        return Err(invalid(
            "the request is not one Connect envelope (5-byte prefix, then the message)",
        ));
    }
    if body[0] & COMPRESSED != 0 {
        return Err(invalid("compressed Connect messages are not accepted"));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if len > MAX_MESSAGE_BYTES {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!("the request message is {len} bytes; the limit is {MAX_MESSAGE_BYTES}"),
        ));
    }
    if body.len() != 5 + len {
        return Err(invalid(
            "the envelope's length does not match the request body (one message expected)",
        ));
    }
    Ok(&body[5..])
}

/// A request message from its JSON.
pub fn decode<'a, T: Deserialize<'a>>(data: &'a [u8]) -> Result<T, ConnectError> {
    serde_json::from_slice(data).map_err(|err| {
        ConnectError::new(
            Code::InvalidArgument,
            format!("the request message is not valid JSON for this call: {err}"),
        )
    })
}

// --- process.proto ---------------------------------------------------------------------------

/// `ProcessConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessConfig {
    #[serde(default)]
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `StartRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StartRequest {
    #[serde(default)]
    pub process: Option<ProcessConfig>,
    #[serde(default)]
    pub pty: Option<Pty>,
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default)]
    pub stdin: Option<bool>,
}

/// `ProcessSelector` (a oneof: `pid` or `tag`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProcessSelector {
    #[serde(default, deserialize_with = "uint_or_string")]
    pub pid: Option<u32>,
    #[serde(default)]
    pub tag: Option<String>,
}

/// `SendSignalRequest`; `signal` as the enum's name or number.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SendSignalRequest {
    #[serde(default)]
    pub process: Option<ProcessSelector>,
    #[serde(default)]
    pub signal: Option<serde_json::Value>,
}

/// `PTY`: the terminal a process gets.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Pty {
    #[serde(default)]
    pub size: Option<PtySizeMessage>,
}

/// `PTY.Size` (proto3: an absent field is 0).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct PtySizeMessage {
    #[serde(default, deserialize_with = "uint_or_string")]
    pub cols: Option<u32>,
    #[serde(default, deserialize_with = "uint_or_string")]
    pub rows: Option<u32>,
}

impl Pty {
    /// The terminal's size: both at least 1 and at most 65535.
    pub fn checked_size(&self) -> Result<sandbox_protocol::PtySize, ConnectError> {
        let size = self.size.unwrap_or_default();
        let (cols, rows) = (size.cols.unwrap_or(0), size.rows.unwrap_or(0));
        sandbox_protocol::PtySize::new(cols, rows).ok_or_else(|| {
            ConnectError::new(
                Code::InvalidArgument,
                format!("a PTY of {cols} columns and {rows} rows: both must be 1 to 65535"),
            )
        })
    }
}

/// `UpdateRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct UpdateRequest {
    #[serde(default)]
    pub process: Option<ProcessSelector>,
    #[serde(default)]
    pub pty: Option<Pty>,
}

/// `ProcessInput` (a oneof: `stdin` or `pty`, bytes in base64).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProcessInput {
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    pub pty: Option<String>,
}

impl ProcessInput {
    /// The input's bytes for a process with a terminal (`pty` input) or without (`stdin`);
    /// the other kind is refused, as envd refuses it.
    pub fn bytes_for(&self, pty: bool) -> Result<Vec<u8>, ConnectError> {
        let (text, other) = if pty {
            (self.pty.as_deref(), self.stdin.is_some())
        } else {
            (self.stdin.as_deref(), self.pty.is_some())
        };
        if other {
            let message = if pty {
                "this process runs on a PTY: send its input as `pty` (pty.send_stdin)"
            } else {
                "this process has no PTY: send its input as `stdin`"
            };
            return Err(ConnectError::new(Code::InvalidArgument, message));
        }
        base64::engine::general_purpose::STANDARD
            .decode(text.unwrap_or(""))
            .map_err(|_| ConnectError::new(Code::InvalidArgument, "the input is not base64"))
    }
}

/// `SendInputRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SendInputRequest {
    #[serde(default)]
    pub process: Option<ProcessSelector>,
    #[serde(default)]
    pub input: Option<ProcessInput>,
}

/// `StreamInputRequest` (a oneof: `start`, `data`, `keepalive`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamInputRequest {
    #[serde(default)]
    pub start: Option<SelectorRequest>,
    #[serde(default)]
    pub data: Option<StreamInputData>,
    #[serde(default)]
    pub keepalive: Option<serde_json::Value>,
}

/// `StreamInputRequest.DataEvent`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamInputData {
    #[serde(default)]
    pub input: Option<ProcessInput>,
}

/// The messages of a client stream: each envelope's message, in order (the end-of-stream
/// envelope, if sent, ends them).
pub fn envelopes(body: &[u8]) -> Result<Vec<&[u8]>, ConnectError> {
    let mut messages = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        if rest.len() < 5 {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "a truncated Connect envelope",
            ));
        }
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let end = 5usize.saturating_add(len);
        if len > MAX_MESSAGE_BYTES || rest.len() < end {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "a Connect envelope's length does not match the request body",
            ));
        }
        if rest[0] & END_STREAM != 0 {
            break;
        }
        single_envelope(&rest[..end])?;
        messages.push(&rest[5..end]);
        rest = &rest[end..];
    }
    Ok(messages)
}

/// `ConnectRequest`, `CloseStdinRequest`, `SendInputRequest`, `UpdateRequest`: their selector.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SelectorRequest {
    #[serde(default)]
    pub process: Option<ProcessSelector>,
}

/// `ProcessInfo`.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessInfo {
    pub config: ProcessConfig,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `ListResponse`.
#[derive(Debug, Clone, Serialize)]
pub struct ListResponse {
    pub processes: Vec<ProcessInfo>,
}

/// `ProcessEvent`'s `event` oneof, wrapped as `StartResponse` / `ConnectResponse` (`{event}`).
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessEvent {
    Start {
        pid: u32,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// What a PTY process's terminal shows.
    Pty(Vec<u8>),
    End(EndEvent),
    Keepalive,
}

/// `ProcessEvent.EndEvent`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ProcessEvent {
    /// The `StartResponse` JSON of this event.
    pub fn response(&self) -> serde_json::Value {
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let event = match self {
            ProcessEvent::Start { pid } => json!({"start": {"pid": pid}}),
            ProcessEvent::Stdout(bytes) => json!({"data": {"stdout": b64(bytes)}}),
            ProcessEvent::Stderr(bytes) => json!({"data": {"stderr": b64(bytes)}}),
            ProcessEvent::Pty(bytes) => json!({"data": {"pty": b64(bytes)}}),
            ProcessEvent::End(end) => json!({"end": end}),
            ProcessEvent::Keepalive => json!({"keepalive": {}}),
        };
        json!({"event": event})
    }
}

/// proto3 JSON lets a 32-bit unsigned integer come as a number or a decimal string.
fn uint_or_string<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Option<u32>, D::Error> {
    use serde::de::Error;
    match Option::<serde_json::Value>::deserialize(de)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| D::Error::custom("pid is not a 32-bit unsigned integer")),
        Some(serde_json::Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| D::Error::custom("pid is not a 32-bit unsigned integer")),
        Some(_) => Err(D::Error::custom("pid is not a 32-bit unsigned integer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_request_is_one_envelope() {
        let framed = envelope(
            0,
            br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"]}}"#,
        );
        let data = single_envelope(&framed).unwrap();
        let start: StartRequest = decode(data).unwrap();
        assert_eq!(start.process.unwrap().args[2], "echo hi");
        assert!(single_envelope(&framed[..framed.len() - 1]).is_err());
        let mut compressed = framed.to_vec();
        compressed[0] = COMPRESSED;
        assert!(single_envelope(&compressed).is_err());
    }

    #[test]
    fn events_speak_protos_json_mapping() {
        let end = ProcessEvent::End(EndEvent {
            exit_code: 3,
            exited: true,
            status: "exit status 3".to_owned(),
            error: None,
        });
        assert_eq!(
            end.response().to_string(),
            r#"{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3"}}}"#
        );
        assert_eq!(
            ProcessEvent::Stdout(b"hi".to_vec()).response().to_string(),
            r#"{"event":{"data":{"stdout":"aGk="}}}"#
        );
        let last = end_stream(None);
        assert_eq!(&last[..], b"\x02\x00\x00\x00\x02{}");
    }

    #[test]
    fn a_pty_has_a_size_and_its_own_input() {
        let start: StartRequest =
            decode(br#"{"process":{"cmd":"/bin/bash"},"pty":{"size":{"cols":80,"rows":"24"}}}"#)
                .unwrap();
        let size = start.pty.unwrap().checked_size().unwrap();
        assert_eq!((size.cols, size.rows), (80, 24));
        let zero: StartRequest = decode(br#"{"pty":{"size":{"cols":80}}}"#).unwrap();
        assert!(zero.pty.unwrap().checked_size().is_err());
        let input: ProcessInput = serde_json::from_str(r#"{"pty":"aGk="}"#).unwrap();
        assert_eq!(input.bytes_for(true).unwrap(), b"hi");
        assert!(input.bytes_for(false).is_err());
        assert_eq!(
            ProcessEvent::Pty(b"hi".to_vec()).response().to_string(),
            r#"{"event":{"data":{"pty":"aGk="}}}"#
        );
    }

    #[test]
    fn a_pid_may_come_as_text() {
        let request: SelectorRequest = decode(br#"{"process":{"pid":"12"}}"#).unwrap();
        assert_eq!(request.process.unwrap().pid, Some(12));
    }
}

//! The session tools: `open_session`, `run_in_session`, `close_session`. Each is one
//! call of the session API under the caller's key (`POST /v1/sessions`,
//! `POST /v1/sessions/{id}/executions`, `DELETE /v1/sessions/{id}`), so opening a session and
//! every execution in it are decided by the policy and audited like any. The session's id
//! travels in the arguments: the MCP connection holds no state, and a session outlives it
//! until closed or idle. A malformed call is a JSON-RPC `invalid params` error; a refusal
//! (denied, busy, unknown id, too many sessions) is a tool result with `isError`.

use api_types::{SessionExecutionRequest, SessionRequest, SessionStatus, SessionView, TurnLimits};
use serde_json::{json, Map, Value};

use super::protocol::RpcError;
use super::tools::{files, language, network, only, positive, refused, required_text, success};
use super::Runner;

/// The session tools' names, in `tools/list` order.
pub const NAMES: [&str; 3] = ["open_session", "run_in_session", "close_session"];

const OPEN_ARGUMENTS: [&str; 4] = ["language", "network", "idle_timeout_s", "ttl_s"];
const RUN_ARGUMENTS: [&str; 4] = ["session_id", "code", "files", "timeout_ms"];
const CLOSE_ARGUMENTS: [&str; 1] = ["session_id"];

/// Their `tools/list` entries.
pub fn list() -> Vec<Value> {
    let session_id =
        json!({"type": "string", "description": "the id open_session returned (ss_...)"});
    vec![
        json!({
            "name": "open_session",
            "title": "Open a sandbox session",
            "description": "Opens a session, if sandgate's policy allows it: one gVisor sandbox \
                            kept alive across run_in_session calls, so variables, imports and \
                            files in /workspace persist (like a notebook). Returns its \
                            session_id. Close it with close_session when done; it also closes \
                            after idle_timeout_s without a call.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "language": {"type": "string", "description": "python (default) or bash"},
                    "network": network_schema(),
                    "idle_timeout_s": {"type": "integer", "minimum": 1},
                    "ttl_s": {"type": "integer", "minimum": 1},
                },
                "additionalProperties": false,
            },
        }),
        json!({
            "name": "run_in_session",
            "title": "Run code in a session",
            "description": "Runs code in an open session (decided by sandgate's policy like any \
                            execution) and returns its status, stdout, stderr, files written to \
                            /output, and for python the repr of a final expression as result. \
                            One call at a time per session.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "session_id": session_id.clone(),
                    "code": {"type": "string", "description": "the code"},
                    "files": {
                        "type": "object",
                        "additionalProperties": {"type": "string"},
                        "description": "file name in /workspace -> text content",
                    },
                    "timeout_ms": {"type": "integer", "minimum": 1},
                },
                "required": ["session_id", "code"],
                "additionalProperties": false,
            },
        }),
        json!({
            "name": "close_session",
            "title": "Close a session",
            "description": "Closes a session: its sandbox and everything in it are removed.",
            "inputSchema": {
                "type": "object",
                "properties": {"session_id": session_id},
                "required": ["session_id"],
                "additionalProperties": false,
            },
        }),
    ]
}

fn network_schema() -> Value {
    json!({
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"host": {"type": "string"}, "port": {"type": "integer"}},
            "required": ["host", "port"],
        },
        "description": "destinations to reach through sandgate's egress proxy, decided once \
                        when the session opens",
    })
}

/// `tools/call` of one of [`NAMES`].
pub async fn call<R: Runner>(
    runner: &R,
    name: &str,
    arguments: &Map<String, Value>,
) -> Result<Value, RpcError> {
    match name {
        "open_session" => {
            let body = open_body(arguments)?;
            Ok(match runner.open_session(body).await {
                Ok(session) => described(&session, "open"),
                Err(refusal) => refused(&refusal),
            })
        }
        "run_in_session" => {
            let (id, body) = run_body(arguments)?;
            Ok(match runner.run_in_session(&id, body).await {
                Ok(record) => success(runner, &record).await,
                Err(refusal) => refused(&refusal),
            })
        }
        _ => {
            only(arguments, "close_session", &CLOSE_ARGUMENTS)?;
            let id = required_text(arguments, "session_id")?;
            Ok(match runner.close_session(id).await {
                Ok(session) => described(&session, "closed"),
                Err(refusal) => refused(&refusal),
            })
        }
    }
}

/// The `POST /v1/sessions` body for `open_session`'s arguments.
fn open_body(arguments: &Map<String, Value>) -> Result<SessionRequest, RpcError> {
    only(arguments, "open_session", &OPEN_ARGUMENTS)?;
    Ok(SessionRequest {
        language: language(arguments)?.to_owned(),
        network: network(arguments)?,
        idle_timeout_s: positive(arguments, "idle_timeout_s")?,
        ttl_s: positive(arguments, "ttl_s")?,
        ..SessionRequest::default()
    })
}

/// The session's id and the `POST /v1/sessions/{id}/executions` body.
fn run_body(arguments: &Map<String, Value>) -> Result<(String, SessionExecutionRequest), RpcError> {
    only(arguments, "run_in_session", &RUN_ARGUMENTS)?;
    let id = required_text(arguments, "session_id")?.to_owned();
    let body = SessionExecutionRequest {
        code: required_text(arguments, "code")?.to_owned(),
        files: files(arguments)?,
        limits: TurnLimits {
            timeout_ms: positive(arguments, "timeout_ms")?,
        },
        wait: None,
        e2b: None,
    };
    Ok((id, body))
}

/// A session view as text and structured content.
fn described(session: &SessionView, what: &str) -> Value {
    let id = &session.id;
    let status = session.status;
    let mut text = format!("session {id} {what}: status {status}");
    if let Some(reason) = session.closed_reason {
        text.push_str(&format!(" ({reason})"));
    }
    if status == SessionStatus::Ready {
        text.push_str(&format!(
            "; language {}, closes after {} s idle; pass session_id {id} to run_in_session",
            session.language, session.idle_timeout_s
        ));
    }
    if status == SessionStatus::PendingApproval {
        text.push_str(&format!(
            "; it awaits approval {} by a human reviewer: nothing runs in it until then \
             (run_in_session answers a conflict meanwhile)",
            session.approval_id.as_deref().unwrap_or_default()
        ));
    }
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": {
            "session_id": id, "status": status, "closed_reason": session.closed_reason,
            "language": session.language, "idle_timeout_s": session.idle_timeout_s,
            "expires_at": session.expires_at, "executions": session.executions,
            "approval_id": session.approval_id,
        },
        "isError": false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::protocol::INVALID_PARAMS;

    #[test]
    fn arguments_become_api_bodies() {
        let open = json!({"language": "bash", "idle_timeout_s": 60});
        let body = open_body(open.as_object().unwrap()).unwrap();
        assert_eq!(
            serde_json::to_value(body).unwrap(),
            json!({"language": "bash", "idle_timeout_s": 60})
        );
        let run = json!({"session_id": "ss_1", "code": "x + 1", "timeout_ms": 500});
        let (id, body) = run_body(run.as_object().unwrap()).unwrap();
        assert_eq!(id, "ss_1");
        assert_eq!(
            serde_json::to_value(body).unwrap(),
            json!({"code": "x + 1", "limits": {"timeout_ms": 500}})
        );
    }

    #[test]
    fn a_held_session_is_described_as_awaiting_its_approval() {
        let held: SessionView = serde_json::from_value(json!({
            "id": "ss_1", "status": "pending_approval", "approval_id": "ap_7",
            "closed_reason": null, "tenant": "acme", "language": "python",
            "decision": {}, "limits": {}, "idle_timeout_s": 60, "ttl_s": 600,
            "executions": 0, "container": null, "created_at": "2026-12-01T00:00:00Z",
            "last_used_at": "2026-12-01T00:00:00Z", "expires_at": "2026-12-01T01:00:00Z",
            "closed_at": null,
        }))
        .unwrap();
        let result = described(&held, "open");
        let text = result["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("status pending_approval"), "{text}");
        assert!(text.contains("awaits approval ap_7"), "{text}");
        assert!(
            !text.contains("pass session_id"),
            "not yet runnable: {text}"
        );
        assert_eq!(result["structuredContent"]["approval_id"], "ap_7");
        assert_eq!(result["isError"], false);
    }

    #[test]
    fn malformed_arguments_are_invalid_params() {
        for arguments in [
            json!({"language": 3}),
            json!({"idle_timeout_s": 0}),
            json!({"shell": true}),
        ] {
            let err = open_body(arguments.as_object().unwrap()).unwrap_err();
            assert_eq!(err.code, INVALID_PARAMS, "{arguments}");
        }
        for arguments in [
            json!({"code": "1"}),
            json!({"session_id": 7, "code": "1"}),
            json!({"session_id": "ss_1"}),
            json!({"session_id": "ss_1", "code": "1", "network": []}),
        ] {
            let err = run_body(arguments.as_object().unwrap()).unwrap_err();
            assert_eq!(err.code, INVALID_PARAMS, "{arguments}");
        }
    }
}
